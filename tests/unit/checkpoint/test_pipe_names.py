"""A pipeline's parameter names paired with a plain model's of the same layers (checkpoint/pipe_names.py)."""

from __future__ import annotations

import pytest

from zerotrain.checkpoint.pipe_names import plain_names
from zerotrain.errors import CheckpointError

LAYERS = [["tied_modules.embed.weight"], ["1.pos.weight"],
          ["2.ln_1.weight", "2.ln_2.weight", "2.attn.qkv.weight", "2.attn.proj.weight"], ["3.weight", "3.bias"]]
SHAPES = {"tied_modules.embed.weight": (32, 16), "1.pos.weight": (8, 16), "2.ln_1.weight": (16,),
          "2.ln_2.weight": (16,), "2.attn.qkv.weight": (48, 16), "2.attn.proj.weight": (16, 16), "3.weight": (16,),
          "3.bias": (16,)}
# a plain GPT's order: its attention before its second norm, unlike the checkpoint's groups
MODEL = [("wte.weight", (32, 16)), ("pos.pos.weight", (8, 16)), ("blocks.0.ln_1.weight", (16,)),
         ("blocks.0.attn.qkv.weight", (48, 16)), ("blocks.0.attn.proj.weight", (16, 16)),
         ("blocks.0.ln_2.weight", (16,)), ("ln_f.weight", (16,)), ("ln_f.bias", (16,))]


def test_layers_pair_in_order_and_names_by_their_tails():
    names = plain_names("ckpt", LAYERS, SHAPES, MODEL)
    assert names == {"wte.weight": "tied_modules.embed.weight", "pos.pos.weight": "1.pos.weight",
                     "blocks.0.ln_1.weight": "2.ln_1.weight", "blocks.0.ln_2.weight": "2.ln_2.weight",
                     "blocks.0.attn.qkv.weight": "2.attn.qkv.weight",
                     "blocks.0.attn.proj.weight": "2.attn.proj.weight", "ln_f.weight": "3.weight",
                     "ln_f.bias": "3.bias"}


def test_the_pipelines_own_names_are_read_by_name():
    model = [(n, SHAPES[n]) for layer in LAYERS for n in layer]
    assert plain_names("ckpt", LAYERS, SHAPES, model) == {n: n for n, _ in model}


def test_another_model_is_one_line():
    with pytest.raises(CheckpointError, match=r"ckpt is a pipeline checkpoint of 8 parameters, this model has 7"):
        plain_names("ckpt", LAYERS, SHAPES, MODEL[:-1])
    wider = [(n, (64, 16)) if n == "blocks.0.attn.qkv.weight" else (n, s) for n, s in MODEL]
    with pytest.raises(CheckpointError, match=r"its 2.attn.qkv.weight \[48, 16\] meets this model's "
                                              r"blocks.0.attn.qkv.weight \[64, 16\] in layer order"):
        plain_names("ckpt", LAYERS, SHAPES, wider)
    moved = [MODEL[1], MODEL[0]] + MODEL[2:]  # positions before the embedding
    with pytest.raises(CheckpointError, match=r"its tied_modules.embed.weight \[32, 16\] meets this model's "
                                              r"pos.pos.weight \[8, 16\]"):
        plain_names("ckpt", LAYERS, SHAPES, moved)
