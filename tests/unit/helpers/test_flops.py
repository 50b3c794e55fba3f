"""get_model_profile counts a model's matrix products as DeepSpeed's profiler reports them."""

import torch

from zerotrain.profiling.flops_profiler import get_model_profile


def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def test_numbers_are_the_products_of_the_layers(tmp_path):
    flops, macs, params = get_model_profile(_mlp(), input_shape=(5, 16), print_profile=False, as_string=False)
    assert macs == 5 * (16 * 32 + 32 * 4) and flops == 2 * macs
    assert params == 16 * 32 + 32 + 32 * 4 + 4


def test_strings_and_the_per_module_table(tmp_path):
    out = tmp_path / "profile.txt"
    flops, macs, params = get_model_profile(_mlp(), args=[torch.ones(5, 16)], output_file=str(out), module_depth=1,
                                            top_modules=2)
    assert (flops, macs, params) == ("6.40 KFLOPs", "3.20 KMACs", "676")
    text = out.read_text()
    assert "forward latency" in text and "depth 1 0 (Linear)" in text and "80.0% of FLOPs" in text
