"""data_types.grad_accum_dtype in one process: micro-step gradients that bf16 cannot add up
exactly (each later one is half an ulp of the running sum) survive in an fp32 accumulator
and vanish in a bf16 one, at every stage."""

from __future__ import annotations

import pytest
import torch

import zerotrain

GA = 8


@pytest.fixture(autouse=True)
def _single_process(monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)


def step_gradient(stage: int, accumulate_in: str) -> float:
    """Weight after one SGD step (lr 1, from 0): minus the accumulated gradient."""
    model = torch.nn.Linear(1, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": GA, "gradient_clipping": 0.0,
              "bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": accumulate_in},
              "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
              "optimizer": {"type": "SGD", "params": {"lr": 1.0}}}
    engine, *_ = zerotrain.initialize(model=model, config=config)
    # the loss is divided by GA: gradients 1/8, then 2**-11 (half an ulp of bf16 at 1/8) seven times
    for x in [1.0] + [2.0**-8] * (GA - 1):
        engine.backward(engine(torch.tensor([[x]], dtype=torch.bfloat16)).float().sum())
        engine.step()
    with zerotrain.zero.GatheredParameters(model.weight):
        return -float(model.weight.detach().float())


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_fp32_accumulation_keeps_what_bf16_rounds_away(stage):
    exact = 1 / 8 + (GA - 1) * 2.0**-11
    wide, narrow = step_gradient(stage, "fp32"), step_gradient(stage, "bf16")
    assert narrow == 1 / 8  # every later micro-step rounded away
    assert wide == pytest.approx(exact, abs=2.0**-10)  # within one bf16 ulp: the sum is cast once
    assert wide > narrow
