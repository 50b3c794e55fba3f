"""A client optimizer whose state is not one value per element (a Python counter, a 1-element
tensor) keeps it from step to step and through a checkpoint when zerotrain steps its fp32
masters block by block (bf16 compute, stages 1 and 2)."""

from __future__ import annotations

import pytest
import torch

import zerotrain


class CountingSGD(torch.optim.Optimizer):
    """SGD that counts its steps per parameter in a plain int and a 1-element tensor, and
    starts its state only when it finds none (as DeepSpeed's HybridStateOptimizer does)."""

    def __init__(self, params, lr=0.1):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["count"], state["count_tensor"] = 0, torch.zeros(1)
                p.add_(p.grad, alpha=-group["lr"])
                state["count"] += 1
                state["count_tensor"] += 1


def _engine(stage: int):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    engine, optimizer, *_ = zerotrain.initialize(model=model, optimizer=CountingSGD(model.parameters()), config={
        "train_batch_size": 2, "bf16": {"enabled": True}, "zero_optimization": {"stage": stage}})
    return engine, optimizer


def _train(engine, steps: int) -> None:
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(1)).bfloat16()
    for _ in range(steps):
        engine.backward(engine(x).float().pow(2).sum())
        engine.step()


@pytest.mark.parametrize("stage", [1, 2])
def test_client_state_that_is_not_per_element_survives_steps_and_checkpoints(tmp_path, stage):
    engine, optimizer = _engine(stage)
    _train(engine, 3)
    (state,) = optimizer.state_dict()["state"].values()
    assert state["count"] == 3 and state["count_tensor"].tolist() == [3.0]
    engine.save_checkpoint(tmp_path, tag="t")
    resumed, resumed_optimizer = _engine(stage)
    resumed.load_checkpoint(tmp_path, tag="t")
    _train(resumed, 1)
    (state,) = resumed_optimizer.state_dict()["state"].values()
    assert state["count"] == 4 and state["count_tensor"].tolist() == [4.0]
