"""The golden token-based LR: Megatron-DeepSpeed's training loop and scheduler, simulated from
their description (the reference spec, section 10.1), separately from zerotrain's code.

    loop, per iteration:  step applied?  -> scheduler gets (+1 step, consumed tokens so far)
                          then           -> consumed tokens += this iteration's tokens

The scheduler keeps `warmup_tokens` unset until a step warmup reaches its last step, where it
notes the consumed tokens. The one place Megatron-DeepSpeed has no answer (no warmup at all:
it subtracts the unset count) is zerotrain's decision: the decay counts from token 0.
"""

from __future__ import annotations

import math


class MegatronScheduler:
    def __init__(self, max_lr, min_lr, decay_tokens, style="linear", warmup_steps=0, warmup_tokens=None):
        self.max_lr, self.min_lr, self.decay_tokens, self.style = max_lr, min_lr, decay_tokens, style
        self.warmup_steps, self.warmup_tokens = warmup_steps, warmup_tokens
        self.num_steps, self.num_tokens = 0, 0
        self.lr = self._compute()

    def advance(self, consumed_tokens):
        self.num_steps += 1
        self.num_tokens = consumed_tokens
        self.lr = self._compute()

    def _compute(self):
        n, t = self.num_steps, self.num_tokens
        if self.warmup_tokens is None:
            if self.warmup_steps > 0 and n <= self.warmup_steps:
                if n == self.warmup_steps:
                    self.warmup_tokens = t
                return self.max_lr * float(n) / float(self.warmup_steps)
        elif self.warmup_tokens > 0 and t <= self.warmup_tokens:
            return self.max_lr * float(t) / float(self.warmup_tokens)
        if self.style == "constant":
            return self.max_lr
        if t > self.decay_tokens:
            return self.min_lr
        w = 0 if self.warmup_tokens is None else self.warmup_tokens  # zerotrain's decision for no warmup
        if self.style == "inverse-square-root":
            return max(self.min_lr, self.max_lr * max(w, 1) ** 0.5 / max(t, 1) ** 0.5)
        r = float(t - w) / float(self.decay_tokens - w)
        assert 0.0 <= r <= 1.0
        k = 1.0 - r if self.style == "linear" else 0.5 * (math.cos(math.pi * r) + 1.0)
        return self.min_lr + k * (self.max_lr - self.min_lr)


def golden_lrs(step_tokens, skipped=(), **schedule):
    """The LR after each iteration (index 0: before any), for iterations that train
    `step_tokens[i]` tokens; iterations in `skipped` (1-based) are overflow-skipped steps."""
    sched = MegatronScheduler(**schedule)
    consumed, lrs = 0, [sched.lr]
    for i, tokens in enumerate(step_tokens, start=1):
        if i not in skipped:
            sched.advance(consumed)
        consumed += tokens
        lrs.append(sched.lr)
    return lrs
