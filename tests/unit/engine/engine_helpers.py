"""Shared by the engine tests: tiny models, batches, configs and the plain-PyTorch reference loops.

Every model here is tiny (a two-layer MLP or a 2-layer, 32-wide GPT) so each file runs in
seconds on one CPU thread. `initialize` rebinds the model's parameters into flat buffers in
place, so each reference loop trains a deep copy taken before `initialize`.
"""

from __future__ import annotations
import copy
import json
import logging
import math
import re
import pytest
import torch
from torch import nn
import zerotrain
from zerotrain.errors import ConfigError
from zerotrain.models import GPT, GPTConfig

ATOL = 1e-6


def mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))


def micro_batch(i: int, n: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + i)
    return torch.randn(n, 6, generator=g), torch.randn(n, 3, generator=g)


def mse(model, x, y) -> torch.Tensor:
    return ((model(x).float() - y) ** 2).mean()


def config(micro: int = 2, ga: int = 1, optimizer: dict | None = None, **extra) -> dict:
    cfg = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": ga,
           "gradient_clipping": 0.0,
           "optimizer": optimizer or {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}}}
    cfg.update(extra)
    return cfg


def adamw(params, lr=1e-2):
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


def train_engine(engine, steps: int, ga: int, dtype=torch.float32, between=None) -> list[float]:
    """`steps` optimizer steps of `ga` micro-batches each; returns the mean loss per step."""
    losses = []
    for s in range(steps):
        total = 0.0
        for m in range(ga):
            x, y = micro_batch(s * ga + m)
            loss = mse(engine, x.to(dtype), y)
            engine.backward(loss)
            engine.step()
            total += loss.item() / ga
        losses.append(total)
        if between is not None:
            between()
    return losses


def train_reference(model, optimizer, steps: int, ga: int, clip: float = 0.0, scheduler=None):
    """The plain loop: mean loss over the micro-batches, one optimizer step."""
    norms = []
    for s in range(steps):
        optimizer.zero_grad()
        loss = sum(mse(model, *micro_batch(s * ga + m)) for m in range(ga)) / ga
        loss.backward()
        if clip > 0:
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip)))
        else:
            norms.append(float(torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(p.grad) for p in model.parameters()]))))
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
    return norms


def assert_same_params(model, reference, atol=ATOL):
    got, want = model.state_dict(), reference.state_dict()
    assert got.keys() == want.keys()
    for k in want:
        torch.testing.assert_close(got[k].float(), want[k].float(), rtol=0, atol=atol, msg=k)


def snapshot(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def warmup_linear(max_lr=1e-2, steps=10):
    return {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": max_lr,
                                           "warmup_num_steps": steps, "warmup_type": "linear"}}


def nan_step(engine, i: int, dtype=torch.float32) -> None:
    x, y = micro_batch(i)
    engine.backward(mse(engine, x.to(dtype), y) * math.nan)
    engine.step()


def no_optimizer_config(**extra) -> dict:
    cfg = config(**extra)
    del cfg["optimizer"]
    return cfg


def train_engine_one(engine, s: int) -> None:
    x, y = micro_batch(s)
    engine.backward(mse(engine, x, y))
    engine.step()


def progress_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("step=")]


SEQ, VOCAB = 16, 64


def tiny_gpt(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2, bias=False))


def gpt_config(**extra) -> dict:
    return config(micro=2, scheduler=warmup_linear(3e-3, 4),
                  optimizer={"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}}, **extra)


def train_gpt(engine, until: int, save_dir=None, save_at=None) -> tuple[list[float], list[float]]:
    """Train to global step `until`; the batch depends only on the step, so a resume sees the same data."""
    losses, lrs = [], []
    while engine.global_steps < until:
        tokens = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(engine.global_steps))
        loss = engine(tokens, labels=tokens)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
        lrs.append(engine.get_lr()[0])
        if save_dir is not None and engine.global_steps == save_at:
            engine.save_checkpoint(save_dir, client_state={"epoch": 7, "seen": torch.arange(3)})
    return losses, lrs


def optimizer_state(optimizer) -> dict:
    return copy.deepcopy(optimizer.state_dict())


def states_equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(states_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(states_equal(x, y) for x, y in zip(a, b))
    return a == b

