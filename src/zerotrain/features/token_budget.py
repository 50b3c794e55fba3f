"""Token budget: count trained tokens, stop at a budget, decay the LR by tokens.

With a sequence-length curriculum a step no longer means a fixed amount of data, so
Megatron-DeepSpeed measures training in tokens. The `token_budget` config block maps its flags:

    --train-tokens N        "train_tokens": N      engine.should_stop() turns true at the
                                                   first optimizer step that reaches N tokens
    --lr-decay-tokens N     "lr_decay_tokens": N   LR decays over the first N tokens
    --lr-decay-style S      "lr_decay_style": S    linear or cosine
    --lr-warmup-iters W     "warmup_steps": W      warmup stays in optimizer steps
    --min-lr M              "min_lr": M            floor after the decay
    --lr                    the optimizer's lr     the peak (each param group's own lr)

Tokens are `batch.count_tokens` of each training forward (batch x sequence length after any
curriculum cut), summed over ranks with one all-reduce per optimizer step. The LR, as with the engine's
schedulers, is set after every optimizer step that was not skipped:

    steps <= W:  lr = peak * steps / W
    after:       r = min(tokens / N, 1);  lr = min_lr + (peak - min_lr) * (1 - r)          linear
                                          lr = min_lr + (peak - min_lr) * (1 + cos(pi r)) / 2  cosine
"""

from __future__ import annotations

import logging
import math

import torch

from ..engine.hooks import EngineFeature
from ..errors import ConfigError
from .batch import count_tokens

log = logging.getLogger("zerotrain")


def token_lr(peak: float, steps: int, tokens: int, decay_tokens: int, warmup_steps: int = 0,
             min_lr: float = 0.0, style: str = "linear") -> float:
    """The LR after `steps` successful optimizer steps that consumed `tokens` tokens."""
    if warmup_steps > 0 and steps <= warmup_steps:
        return peak * steps / warmup_steps
    ratio = min(tokens / decay_tokens, 1.0)
    if style == "linear":
        coef = 1.0 - ratio
    elif style == "cosine":
        coef = 0.5 * (math.cos(math.pi * ratio) + 1.0)
    else:
        raise ConfigError(f"token_budget.lr_decay_style: should be linear or cosine, got {style!r}")
    return min_lr + (peak - min_lr) * coef


class TokenBudgetFeature(EngineFeature):
    name = "token_budget"

    def __init__(self, cfg):
        self.cfg = cfg
        self.tokens = 0  # all ranks, all optimizer steps so far
        self.lr_steps = 0  # optimizer steps that were not skipped
        self.peaks: list[float] = []
        self._pending = 0  # this rank, since the last boundary
        self._skipped = 0
        self._engine = None

    def on_train_start(self, engine) -> None:
        self._engine = engine
        self._skipped = engine.skipped_steps
        if self.cfg.lr_decay_tokens is None:
            return
        if engine.optimizer is None:
            raise ConfigError("token_budget.lr_decay_tokens sets the optimizer's LR; add an \"optimizer\" block "
                              "or pass optimizer= to zerotrain.initialize")
        if engine.lr_scheduler is not None:
            raise ConfigError("token_budget.lr_decay_tokens drives the LR, and so does the LR scheduler given "
                              "to initialize; keep one")
        self.peaks = [float(g["lr"]) for g in engine.optimizer.param_groups]
        self._set_lr()

    def _set_lr(self) -> None:
        c = self.cfg
        for group, peak in zip(self._engine.optimizer.param_groups, self.peaks):
            lr = token_lr(peak, self.lr_steps, self.tokens, c.lr_decay_tokens, c.warmup_steps, c.min_lr,
                          c.lr_decay_style)
            if torch.is_tensor(group["lr"]):
                group["lr"].fill_(lr)
            else:
                group["lr"] = lr

    def before_forward(self, engine, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if not engine.input_replica:
            self._pending += count_tokens(args, kwargs)
        return args, kwargs

    def after_step(self, engine) -> None:
        total = torch.tensor([float(self._pending)], dtype=torch.float64)
        engine.comm.all_reduce(total)
        self.tokens += int(total.item())
        self._pending = 0
        skipped = engine.skipped_steps != self._skipped
        self._skipped = engine.skipped_steps
        if self.cfg.lr_decay_tokens is not None and not skipped:
            self.lr_steps += 1
            self._set_lr()

    def should_stop(self, engine) -> bool:
        return self.cfg.train_tokens is not None and self.tokens >= self.cfg.train_tokens

    def value(self, key: str):
        return self.tokens if key == "tokens_consumed" else None

    def log_fields(self, engine) -> dict:
        return {"tokens": self.tokens}

    def state_dict(self) -> dict:
        return {"tokens": self.tokens, "lr_steps": self.lr_steps, "peaks": list(self.peaks)}

    def load_state_dict(self, state: dict) -> None:
        self.tokens, self.lr_steps = state["tokens"], state["lr_steps"]
        if state.get("peaks"):
            self.peaks = list(state["peaks"])
        if self._engine is not None:
            self._skipped = self._engine.skipped_steps
            if self.cfg.lr_decay_tokens is not None and self.peaks:
                self._set_lr()
