"""The flops_profiler block: the first forward of step `profile_step` is counted, forward only,
once, with the report get_model_profile prints."""

import torch

import zerotrain


def test_one_forward_of_the_chosen_step_is_profiled(tmp_path, monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    out = tmp_path / "flops.txt"
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    engine, *_ = zerotrain.initialize(model=model, config={
        "train_batch_size": 4, "gradient_accumulation_steps": 2, "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
        "flops_profiler": {"enabled": True, "profile_step": 1, "module_depth": 1, "output_file": str(out)}})
    written = []
    for _ in range(3 * 2):
        engine.backward(engine(torch.ones(2, 4)).sum())
        engine.step()
        if out.exists() and not written:
            written.append(engine.global_steps)
    assert written == [1]  # during step 1 (counted from 0), not before
    text = out.read_text()
    macs = 2 * (4 * 8 + 8 * 2)  # one micro-batch of 2 through both layers; backward not counted
    assert text.startswith(f"params 58 | {macs} MACs | {2 * macs} FLOPs | forward latency ")
    assert "depth 1 0 (Linear)" in text
