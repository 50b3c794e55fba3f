"""The `token_budget` block: zerotrain's own, validated like every DeepSpeed block."""

from __future__ import annotations

import pytest

from zerotrain.config import TokenBudgetConfig, load_config
from zerotrain.errors import ConfigError


def load(block: dict, **extra):
    return load_config({"train_batch_size": 8, "token_budget": block, **extra})


def test_defaults():
    tb = load({}).token_budget
    assert isinstance(tb, TokenBudgetConfig)
    assert (tb.enabled, tb.train_tokens, tb.lr_decay_tokens, tb.lr_decay_style, tb.warmup_steps, tb.lr_warmup_tokens,
            tb.min_lr) == (True, None, None, "linear", 0, None, 0.0)
    assert load_config({"train_batch_size": 8}).token_budget is None


def test_every_key():
    tb = load({"enabled": True, "train_tokens": 1000, "lr_decay_tokens": 900, "lr_decay_style": "cosine",
               "warmup_steps": 5, "min_lr": 1e-5}).token_budget
    assert (tb.train_tokens, tb.lr_decay_tokens, tb.lr_decay_style, tb.warmup_steps, tb.min_lr) == \
        (1000, 900, "cosine", 5, 1e-5)
    for style in ("constant", "inverse-square-root"):
        assert load({"lr_decay_tokens": 900, "lr_decay_style": style, "lr_warmup_tokens": 50}).token_budget \
            .lr_warmup_tokens == 50


@pytest.mark.parametrize("block,match", [
    ({"train_token": 10}, r"token_budget.train_token: unknown key, did you mean train_tokens\?"),
    ({"train_tokens": 0}, "token_budget.train_tokens"),
    ({"train_tokens": -5}, "token_budget.train_tokens"),
    ({"train_tokens": 1.5}, "token_budget.train_tokens"),
    ({"train_tokens": True}, "token_budget.train_tokens"),
    ({"lr_decay_tokens": 10, "lr_decay_style": "exponential"}, "token_budget.lr_decay_style"),
    ({"lr_decay_tokens": 10, "warmup_steps": -1}, "token_budget.warmup_steps"),
    ({"lr_decay_tokens": 10, "min_lr": -1e-3}, "token_budget.min_lr"),
    ({"min_lr": 1e-5}, "token_budget.min_lr is set but does nothing without lr_decay_tokens"),
    ({"warmup_steps": 10}, "token_budget.warmup_steps is set but does nothing without lr_decay_tokens"),
    ({"lr_decay_style": "cosine"}, "token_budget.lr_decay_style is set but does nothing"),
    ({"lr_warmup_tokens": 5}, "token_budget.lr_warmup_tokens is set but does nothing without lr_decay_tokens"),
    ({"lr_decay_tokens": 10, "lr_warmup_tokens": -1}, "token_budget.lr_warmup_tokens"),
    ({"lr_decay_tokens": 10, "lr_warmup_tokens": 5, "warmup_steps": 2},
     "token_budget.lr_warmup_tokens: and warmup_steps both set the warmup; keep one"),
    ({"lr_decay_tokens": 10, "lr_warmup_tokens": 10}, "token_budget.lr_warmup_tokens: 10 should be below "
                                                      "lr_decay_tokens 10"),
])
def test_bad_values_name_the_key(block, match):
    with pytest.raises(ConfigError, match=match):
        load(block)


def test_token_decay_and_a_scheduler_block_conflict():
    with pytest.raises(ConfigError, match="token_budget.lr_decay_tokens: drives the LR"):
        load({"lr_decay_tokens": 10}, scheduler={"type": "WarmupLR", "params": {}})
    # a budget that only stops training is fine next to a scheduler
    assert load({"train_tokens": 10}, scheduler={"type": "WarmupLR", "params": {}}).token_budget.train_tokens == 10


def test_top_level_typo_suggests_the_block():
    with pytest.raises(ConfigError, match="did you mean token_budget"):
        load_config({"train_batch_size": 8, "token_budgets": {}})
