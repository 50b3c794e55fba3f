"""zerotrain.utils.zero_to_fp32: DeepSpeed's functions and script over zerotrain's checkpoints."""

import pytest
import torch

import zerotrain
from zerotrain.utils import zero_to_fp32


@pytest.fixture
def saved(tmp_path, monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    model[1].bias.requires_grad_(False)
    engine, *_ = zerotrain.initialize(model=model, config={"train_batch_size": 1, "zero_optimization": {"stage": 2},
                                                           "optimizer": {"type": "SGD", "params": {"lr": 0.1}}})
    engine.backward(engine(torch.ones(1, 3)).sum())
    engine.step()
    engine.save_checkpoint(str(tmp_path), tag="step1")
    return tmp_path, {k: v.detach().clone().float() for k, v in model.state_dict().items()}


def test_state_dict_and_load_match_the_trained_model(saved):
    folder, weights = saved
    state = zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(str(folder))
    assert state.keys() == weights.keys() and all(torch.equal(state[k], weights[k]) for k in weights)
    trained = zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(str(folder), exclude_frozen_parameters=True)
    assert set(weights) - set(trained) == {"1.bias"}
    fresh = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    assert zero_to_fp32.load_state_dict_from_zero_checkpoint(fresh, str(folder), tag="step1") is fresh
    assert torch.equal(fresh[0].weight, weights["0.weight"])


def test_the_script_writes_the_weights(saved, tmp_path):
    folder, weights = saved
    assert zero_to_fp32.main([str(folder), str(tmp_path / "out")]) == 0
    written = torch.load(tmp_path / "out" / "pytorch_model.bin")
    assert torch.equal(written["1.weight"], weights["1.weight"])
