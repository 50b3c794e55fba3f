"""Shared pieces of the curriculum, layer-drop and token-budget tests: tiny models that record
what the engine passed them, and a one-process engine config."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

import zerotrain
from zerotrain.models import GPT, GPTConfig

SEQ, VOCAB = 16, 64


@pytest.fixture(autouse=True)
def single_process(monkeypatch):
    # The engine reads torchrun's variables; a stray one would make it try to join a world.
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def zerotrain_log(caplog):
    logger = logging.getLogger("zerotrain")
    logger.addHandler(caplog.handler)  # initialize turns propagation off
    caplog.set_level(logging.INFO, logger="zerotrain")
    yield caplog
    logger.removeHandler(caplog.handler)


def config(micro: int = 2, ga: int = 1, lr: float = 3e-3, **extra) -> dict:
    cfg = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": ga, "gradient_clipping": 0.0,
           "optimizer": {"type": "AdamW", "params": {"lr": lr, "weight_decay": 0.01}}}
    cfg.update(extra)
    return cfg


def linear_curriculum(lo: int, hi: int, total: int, step: int) -> dict:
    return {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": lo, "max_difficulty": hi,
            "schedule_type": "fixed_linear", "schedule_config": {"total_curriculum_step": total, "difficulty_step": step}}


def tiny_gpt(seed: int = 0, n_layer: int = 2) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=n_layer, n_head=2, bias=False))


def tokens(step: int, rows: int = 2, seq: int = SEQ) -> torch.Tensor:
    return torch.randint(0, VOCAB, (rows, seq), generator=torch.Generator().manual_seed(step))


class Recorder(nn.Module):
    """Returns a loss and remembers the kwargs and input shapes of every call."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(()))
        self.calls: list[dict] = []

    def forward(self, x, labels=None, curriculum_seqlen=None, progressive_layer_drop=False, pld_theta=None):
        self.calls.append({"shape": tuple(x.shape), "labels": None if labels is None else tuple(labels.shape),
                           "curriculum_seqlen": curriculum_seqlen, "progressive_layer_drop": progressive_layer_drop,
                           "pld_theta": pld_theta})
        return (self.w * x.float()).mean()


def run_steps(engine, steps: int, batch=lambda s: tokens(s)) -> list[float]:
    """`steps` optimizer steps of GA micro-batches each; returns every micro-batch loss."""
    losses = []
    for _ in range(steps):
        for _ in range(engine.gradient_accumulation_steps()):
            x = batch(engine.global_steps)
            loss = engine(x, labels=x)
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
    return losses


def start(model, cfg):
    engine, *_ = zerotrain.initialize(model=model, config=cfg)
    return engine
