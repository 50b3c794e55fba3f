"""fp16 auto_cast (features/auto_cast.py): float tensors of a forward's inputs become fp16."""

from __future__ import annotations

from collections import namedtuple

import torch

from zerotrain.config import load_config
from zerotrain.features import build_features
from zerotrain.features.auto_cast import AutoCastFeature, cast_floats

Pair = namedtuple("Pair", "a b")


def test_floats_are_cast_inside_containers_and_integers_are_not():
    ids, feats, half = torch.ones(2, 3, dtype=torch.long), torch.ones(2, 3), torch.ones(2, dtype=torch.float16)
    out = cast_floats({"x": [feats, (ids, feats)], "ids": ids, "half": half, "n": 3})
    assert out["x"][0].dtype == torch.float16 and type(out["x"]) is list and type(out["x"][1]) is tuple
    assert out["x"][1][0] is ids and out["x"][1][1].dtype == torch.float16
    assert out["ids"] is ids and out["half"] is half and out["n"] == 3  # already fp16: the same tensor
    assert cast_floats(feats, torch.bfloat16).dtype == torch.bfloat16
    assert cast_floats({"x": [feats]}, torch.bfloat16)["x"][0].dtype == torch.bfloat16
    pair = Pair(feats, ids)
    assert cast_floats(pair) is pair  # a namedtuple could not be rebuilt from one iterable: left alone


def test_the_feature_casts_args_and_kwargs():
    feats = torch.ones(3)
    args, kwargs = AutoCastFeature().before_forward(None, (feats,), {"mask": feats, "labels": feats.long()})
    assert args[0].dtype == torch.float16 and kwargs["mask"].dtype == torch.float16
    assert kwargs["labels"].dtype == torch.long


def test_built_only_with_fp16_and_auto_cast():
    def built(fp16):
        cfg = load_config({"train_micro_batch_size_per_gpu": 1, "fp16": fp16})
        return [type(f) for f in build_features(cfg)]
    assert built({"enabled": True, "auto_cast": True}) == [AutoCastFeature]
    assert built({"enabled": True, "auto_cast": False}) == []
    assert built({"enabled": False, "auto_cast": True}) == []
