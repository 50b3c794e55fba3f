r"""Megatron-DeepSpeed's token-based LR (`--lr-decay-tokens`), as its training loop drives it.

With a sequence-length curriculum a step holds a varying number of tokens, so the LR decays
by tokens while the warmup stays in steps (or, with `lr_warmup_tokens`, runs in tokens):

    LR
    max ┤      /‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾\
        │     /                   \        linear / cosine from max to min over the tokens
        │    /                      \      consumed between the warmup's end (W_t tokens)
    min ┤___/                         \____ and lr_decay_tokens (D); min strictly past D
        0   W steps (W_t tokens)        D    tokens

    warmup in steps  (steps <= W):          lr = max * steps / W; at steps == W, W_t := tokens
    warmup in tokens (tokens <= W_t):       lr = max * tokens / W_t
    constant:                               lr = max
    tokens > D:                             lr = min
    r = (tokens - W_t) / (D - W_t)          linear: min + (max - min)(1 - r)
                                            cosine: min + (max - min)(1 + cos(pi r)) / 2
    inverse-square-root:                    max(min, max * sqrt(max(W_t, 1) / max(tokens, 1)))

`steps` counts optimizer steps that were applied and `tokens` the tokens trained *before* the
step the LR is set after (Megatron-DeepSpeed adds a step's tokens to its count after the step,
and its scheduler runs inside the step). So the LR set after step k uses tokens of steps
1..k-1: 0 after the first step. Decisions where Megatron-DeepSpeed has no answer:

* no warmup (W = 0, no W_t): the decay counts from token 0 (W_t = 0); Megatron-DeepSpeed
  subtracts an unset warmup count there and crashes. inverse-square-root then falls as
  max / sqrt(tokens) from the first step: give it a warmup.
* W_t of a step warmup is the token count the LR was set from when the step count reached W,
  recorded once (tokens of steps 1..W-1).
* a step skipped for overflow (fp16) moves neither `steps` nor the LR; its tokens count, as
  Megatron-DeepSpeed's loop counts them (DeepSpeed steps the scheduler only for applied steps).
"""

from __future__ import annotations

import math

DECAY_STYLES = ("linear", "cosine", "constant", "inverse-square-root")


def token_decay_lr(steps: int, tokens: int, warmup_tokens: int | None, *, max_lr: float, min_lr: float,
                   decay_tokens: int, warmup_steps: int = 0, style: str = "linear") -> float:
    """The LR for `steps` applied optimizer steps and `tokens` tokens trained before the last of
    them. `warmup_tokens`: the warmup's token count as known now (given, or recorded when the
    step warmup ended; None while a step warmup runs or when there is no warmup)."""
    if warmup_tokens is None and warmup_steps > 0 and steps <= warmup_steps:
        return max_lr * steps / warmup_steps
    if warmup_tokens is not None and warmup_tokens > 0 and tokens <= warmup_tokens:
        return max_lr * tokens / warmup_tokens
    if style == "constant":
        return max_lr
    if tokens > decay_tokens:
        return min_lr
    start = warmup_tokens or 0
    if style == "inverse-square-root":
        return max(min_lr, max_lr * math.sqrt(max(start, 1)) / math.sqrt(max(tokens, 1)))
    ratio = (tokens - start) / (decay_tokens - start) if decay_tokens > start else 1.0
    if style == "linear":
        coef = 1.0 - ratio
    elif style == "cosine":
        coef = 0.5 * (math.cos(math.pi * ratio) + 1.0)
    else:
        raise ValueError(f"lr_decay_style: should be one of {', '.join(DECAY_STYLES)}, got {style!r}")
    return min_lr + coef * (max_lr - min_lr)


class TokenDecaySchedule:
    """The state behind `token_decay_lr`: applied steps, the tokens the LR was last set from,
    and the warmup's token count once known. `step(tokens_before)` is called once per applied
    optimizer step; `lr_for(peak)` is then the LR of a param group whose peak LR is `peak`."""

    def __init__(self, decay_tokens: int, *, warmup_steps: int = 0, warmup_tokens: int | None = None,
                 min_lr: float = 0.0, style: str = "linear"):
        if style not in DECAY_STYLES:
            raise ValueError(f"lr_decay_style: should be one of {', '.join(DECAY_STYLES)}, got {style!r}")
        self.decay_tokens, self.warmup_steps, self.min_lr, self.style = decay_tokens, warmup_steps, min_lr, style
        self.warmup_tokens = warmup_tokens  # given (token warmup), or recorded when the step warmup ends
        self.steps = 0
        self.tokens = 0  # the tokens the LR was last set from

    def step(self, tokens_before: int) -> None:
        """One applied optimizer step; `tokens_before` were trained before it."""
        self.steps += 1
        self.tokens = tokens_before
        if self.warmup_tokens is None and self.warmup_steps > 0 and self.steps == self.warmup_steps:
            self.warmup_tokens = tokens_before  # this step's LR is still the warmup's last: max

    def lr_for(self, peak: float) -> float:
        return token_decay_lr(self.steps, self.tokens, self.warmup_tokens, max_lr=peak, min_lr=self.min_lr,
                              decay_tokens=self.decay_tokens, warmup_steps=self.warmup_steps, style=self.style)

    def state_dict(self) -> dict:
        return {"steps": self.steps, "tokens": self.tokens, "warmup_tokens": self.warmup_tokens}

    def load_state_dict(self, state: dict) -> None:
        self.steps, self.tokens, self.warmup_tokens = state["steps"], state["tokens"], state["warmup_tokens"]
