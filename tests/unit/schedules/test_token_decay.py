"""Megatron-DeepSpeed's token-based LR (schedules/token_decay.py) against the golden loop of
tests/megatron_lr.py at every step of a grid, and each decision at its edges."""

from __future__ import annotations

import math
import random

import pytest
from megatron_lr import golden_lrs

from zerotrain.schedules.token_decay import DECAY_STYLES, TokenDecaySchedule, token_decay_lr

WARMUPS = {"none": {}, "steps": {"warmup_steps": 4}, "one step": {"warmup_steps": 1},
           "tokens": {"warmup_tokens": 150}}


def schedule_lrs(step_tokens, skipped=(), warmup_steps=0, warmup_tokens=None, **kw):
    """zerotrain's schedule driven as the engine drives it: the LR after each step from the
    tokens trained before it; skipped steps move neither."""
    s = TokenDecaySchedule(kw["decay_tokens"], warmup_steps=warmup_steps, warmup_tokens=warmup_tokens,
                           min_lr=kw["min_lr"], style=kw["style"])
    consumed, lrs = 0, [s.lr_for(kw["max_lr"])]
    for i, tokens in enumerate(step_tokens, start=1):
        if i not in skipped:
            s.step(consumed)
        consumed += tokens
        lrs.append(s.lr_for(kw["max_lr"]))
    return lrs


@pytest.mark.parametrize("warmup", WARMUPS)
@pytest.mark.parametrize("style", DECAY_STYLES)
def test_every_step_of_a_grid_equals_the_golden_loop(style, warmup):
    rng = random.Random(7)
    step_tokens = [rng.choice((8, 24, 40, 64)) for _ in range(40)]  # a curriculum's varying steps
    kw = {"max_lr": 3e-3, "min_lr": 3e-5, "decay_tokens": 900, "style": style, **WARMUPS[warmup]}
    for skipped in ((), (3, 4, 11)):  # overflow-skipped steps: in the warmup and in the decay
        ours, golden = schedule_lrs(step_tokens, skipped, **kw), golden_lrs(step_tokens, skipped, **kw)
        assert ours == pytest.approx(golden, rel=1e-12, abs=0)
        assert ours[-1] == (kw["max_lr"] if style == "constant" else kw["min_lr"])  # the run went past the decay


def test_the_decay_counts_from_the_warmups_tokens():
    # 5 warmup steps of 100 tokens: the LR after step 5 noted the 400 tokens before it
    step_tokens = [100] * 20
    lrs = schedule_lrs(step_tokens, warmup_steps=5, max_lr=1.0, min_lr=0.0, decay_tokens=1400, style="linear")
    assert lrs[:6] == pytest.approx([0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
    assert lrs[6] == pytest.approx(1 - (500 - 400) / (1400 - 400))  # not 1 - 500 / 1400 (decay from token 0)
    assert lrs[15] == pytest.approx(0.0) and lrs[16] == 0.0


def test_no_warmup_decays_from_token_zero():
    lrs = schedule_lrs([10] * 12, max_lr=1.0, min_lr=0.0, decay_tokens=100, style="linear")
    assert lrs[:4] == pytest.approx([1.0, 1.0, 0.9, 0.8])  # the LR after step k from the tokens before it


def test_min_lr_strictly_past_the_decay_tokens():
    # at exactly lr_decay_tokens the decay's own value, min_lr only once past it
    at = token_decay_lr(10, 400, 100, max_lr=1.0, min_lr=0.05, decay_tokens=400, warmup_steps=3,
                        style="inverse-square-root")
    assert at == pytest.approx(math.sqrt(100 / 400)) and at > 0.05
    assert token_decay_lr(10, 401, 100, max_lr=1.0, min_lr=0.05, decay_tokens=400, warmup_steps=3,
                          style="inverse-square-root") == 0.05
    for style in ("linear", "cosine"):
        assert token_decay_lr(10, 400, 100, max_lr=1.0, min_lr=0.05, decay_tokens=400, style=style) == \
            pytest.approx(0.05)


def test_token_warmup_and_constant():
    lr = lambda t, style="linear": token_decay_lr(9, t, 200, max_lr=2.0, min_lr=0.0,  # noqa: E731
                                                  decay_tokens=1000, style=style)
    assert [lr(0), lr(50), lr(200)] == pytest.approx([0.0, 0.5, 2.0])
    assert lr(600) == pytest.approx(1.0)
    assert lr(999, "constant") == lr(5000, "constant") == 2.0


def test_the_state_resumes_mid_decay():
    a = TokenDecaySchedule(1000, warmup_steps=2, min_lr=0.0, style="cosine")
    for before in (0, 30, 90, 200):
        a.step(before)
    b = TokenDecaySchedule(1000, warmup_steps=2, min_lr=0.0, style="cosine")
    b.load_state_dict(a.state_dict())
    assert b.state_dict() == {"steps": 4, "tokens": 200, "warmup_tokens": 30}
    assert b.lr_for(1.0) == a.lr_for(1.0)
    with pytest.raises(ValueError, match="lr_decay_style: should be one of linear, cosine, constant, "
                                         "inverse-square-root, got 'exp'"):
        TokenDecaySchedule(10, style="exp")
