"""Token budget: count trained tokens, stop at a budget, decay the LR by tokens.

With a sequence-length curriculum a step no longer means a fixed amount of data, so
Megatron-DeepSpeed measures training in tokens. The `token_budget` config block maps its flags
(and `zerotrain train`'s options of the same names fill it):

    --train-tokens N        "train_tokens": N        engine.should_stop() turns true at the
                                                     first optimizer step that reaches N tokens
    --lr-decay-tokens N     "lr_decay_tokens": N     the LR decays by tokens (this feature sets it)
    --lr-decay-style S      "lr_decay_style": S      linear, cosine, constant, inverse-square-root
    --lr-warmup-iters W     "warmup_steps": W        warmup in optimizer steps
    --lr-warmup-tokens T    "lr_warmup_tokens": T    or in tokens
    --min-lr M              "min_lr": M              floor after the decay
    --lr                    the optimizer's lr       the peak (each param group's own lr)

Tokens are `batch.count_tokens` of each training forward (batch x sequence length after any
curriculum cut), summed over ranks with one all-reduce per optimizer step; a step skipped for
overflow counts its tokens. After every applied optimizer step the LR is set from the tokens
trained *before* that step, as Megatron-DeepSpeed's loop does (schedules/token_decay.py has
the formula and the decisions at its edges).
"""

from __future__ import annotations

import torch

from ..engine.hooks import EngineFeature
from ..errors import ConfigError
from ..schedules.token_decay import TokenDecaySchedule
from .batch import count_tokens


class TokenBudgetFeature(EngineFeature):
    name = "token_budget"

    def __init__(self, cfg):
        self.cfg = cfg
        self.tokens = 0  # all ranks, all optimizer steps so far
        self.schedule = None if cfg.lr_decay_tokens is None else TokenDecaySchedule(
            cfg.lr_decay_tokens, warmup_steps=cfg.warmup_steps, warmup_tokens=cfg.lr_warmup_tokens,
            min_lr=cfg.min_lr, style=cfg.lr_decay_style)
        self.peaks: list[float] = []
        self._pending = 0  # this rank, since the last boundary
        self._skipped = 0
        self._engine = None

    def on_train_start(self, engine) -> None:
        self._engine = engine
        self._skipped = engine.skipped_steps
        if self.schedule is None:
            return
        if engine.optimizer is None:
            raise ConfigError("token_budget.lr_decay_tokens sets the optimizer's LR; add an \"optimizer\" block "
                              "or pass optimizer= to zerotrain.initialize")
        if engine.lr_scheduler is not None:
            raise ConfigError("token_budget.lr_decay_tokens drives the LR, and so does the LR scheduler given "
                              "to initialize; keep one (token_budget.lr_decay_style picks the shape)")
        self.peaks = [float(g["lr"]) for g in engine.optimizer.param_groups]
        if min(self.peaks) < self.cfg.min_lr:
            raise ConfigError(f"token_budget.min_lr {self.cfg.min_lr:g} is above the optimizer's lr "
                              f"{min(self.peaks):g}; the decay runs from the lr down to min_lr")
        self._set_lr()  # before any step: 0 under a warmup, else the peak

    def _set_lr(self) -> None:
        for group, peak in zip(self._engine.optimizer.param_groups, self.peaks):
            lr = self.schedule.lr_for(peak)
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
        self._pending = 0
        skipped = engine.skipped_steps != self._skipped
        self._skipped = engine.skipped_steps
        if self.schedule is not None and not skipped:
            self.schedule.step(self.tokens)  # the tokens trained before this step
            self._set_lr()
        self.tokens += int(total.item())

    def should_stop(self, engine) -> bool:
        return self.cfg.train_tokens is not None and self.tokens >= self.cfg.train_tokens

    def log_fields(self, engine) -> dict:
        return {"tokens": self.tokens}

    def state_dict(self) -> dict:
        state = {"tokens": self.tokens, "peaks": list(self.peaks)}
        if self.schedule is not None:
            state["lr_schedule"] = self.schedule.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.tokens = state["tokens"]
        if state.get("peaks"):
            self.peaks = list(state["peaks"])
        if self.schedule is not None and state.get("lr_schedule"):
            self.schedule.load_state_dict(state["lr_schedule"])
        elif self.schedule is not None and "lr_steps" in state:
            # a state that holds only the applied steps: the LR continues from them and the
            # tokens, with the decay counted from token 0 once any step warmup is over
            steps = state["lr_steps"]
            done = steps >= self.cfg.warmup_steps and self.cfg.lr_warmup_tokens is None
            self.schedule.load_state_dict({"steps": steps, "tokens": self.tokens,
                                           "warmup_tokens": 0 if done else self.cfg.lr_warmup_tokens})
        if self._engine is not None:
            self._skipped = self._engine.skipped_steps
            if self.schedule is not None and self.peaks:
                self._set_lr()
