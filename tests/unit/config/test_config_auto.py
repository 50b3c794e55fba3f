"""The "auto" filler (config/auto.py): filled, defaulted, refused by name, or left for later."""

from __future__ import annotations

import pytest

from zerotrain.config import autos_left, fill_auto
from zerotrain.errors import ConfigError

CONFIG = {
    "train_micro_batch_size_per_gpu": "auto",
    "fp16": {"enabled": "auto", "loss_scale": 0},
    "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": ["auto", 0.999]}},
    "bf16": "auto",
}


def test_autos_left_lists_what_fill_auto_would_refuse():
    # inside fp16 / zero_optimization an "auto" falls back to the default; a whole block "auto" does not
    assert autos_left(CONFIG) == ["train_micro_batch_size_per_gpu", "optimizer.params.lr",
                                  "optimizer.params.betas[0]", "bf16"]
    assert autos_left({"a": [{"b": "auto"}, "auto", "x"]}, "top") == ["top.a[0].b", "top.a[1]"]
    assert autos_left("auto") == [""] and autos_left("AUTO") == [] and autos_left(3) == []


def test_fill_auto_fills_defaults_and_records_how():
    sources = {}
    out = fill_auto(CONFIG, {"train_micro_batch_size_per_gpu": 4, "optimizer.params.lr": 1e-3,
                             "optimizer.params.betas[0]": 0.9, "bf16": {"enabled": False}}, sources=sources)
    assert out == {"train_micro_batch_size_per_gpu": 4, "fp16": {"loss_scale": 0},
                   "zero_optimization": {"stage": 2},
                   "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.999]}},
                   "bf16": {"enabled": False}}
    assert sources == {"train_micro_batch_size_per_gpu": "auto: filled in", "fp16.enabled": "auto: default",
                       "zero_optimization.reduce_bucket_size": "auto: default",
                       "optimizer.params.lr": "auto: filled in", "optimizer.params.betas[0]": "auto: filled in",
                       "bf16": "auto: filled in"}
    assert CONFIG["fp16"]["enabled"] == "auto"  # a copy: the caller's dict is untouched


def test_fill_auto_refuses_by_name_or_leaves_for_later():
    with pytest.raises(ConfigError, match=r"^train_micro_batch_size_per_gpu is 'auto', which only the Trainer fills "
                                          r"in \(zerotrain train, zerotrain.Trainer: from "
                                          r"per_device_train_batch_size\); give a number$"):
        fill_auto({"train_micro_batch_size_per_gpu": "auto"})
    with pytest.raises(ConfigError, match=r"^comms_logger.verbose is 'auto', which nothing fills in; give a value$"):
        fill_auto({"comms_logger": {"verbose": "auto"}})
    kept = fill_auto(CONFIG, keep_unfilled=True)
    assert kept["fp16"]["enabled"] == "auto" and kept["optimizer"]["params"]["betas"] == ["auto", 0.999]
    opaque = fill_auto({"tensorboard": {"x": "auto"}}, opaque=("tensorboard",))
    assert opaque == {"tensorboard": {"x": "auto"}}
