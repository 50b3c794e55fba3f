"""One answer to "is this an HF model" and to "what does this forward accept"."""

from __future__ import annotations

import torch
from torch import nn

from zerotrain.features.model_api import forward_accepts, is_hf_model
from zerotrain.models import GPT, GPTConfig


class PreTrainedModel(nn.Module):  # transformers' base class, by name as the check reads it
    pass


class FakeHF(PreTrainedModel):
    def forward(self, input_ids=None, labels=None, **kwargs):
        return input_ids


class Plain(nn.Module):
    def forward(self, x, *rest, curriculum_seqlen=None):
        return x


def test_an_hf_model_is_one_whose_classes_include_pretrainedmodel():
    assert is_hf_model(FakeHF()) and not is_hf_model(Plain())
    assert not is_hf_model(GPT(GPTConfig(vocab_size=8, n_positions=4, n_embd=8, n_layer=1, n_head=1)))


def test_forward_accepts_reads_modules_functions_and_unbound_methods():
    hf = forward_accepts(FakeHF())
    assert hf.names == {"input_ids", "labels"} and hf.any_keyword and hf.readable
    plain = forward_accepts(Plain())
    assert plain.names == {"x", "curriculum_seqlen"} and not plain.any_keyword  # *rest is not a keyword
    assert plain.named(("labels", "curriculum_seqlen", "x")) == ("curriculum_seqlen", "x")
    assert forward_accepts(Plain.forward).names == {"self", "x", "curriculum_seqlen"}
    assert forward_accepts(lambda a, **kw: a).any_keyword


def test_an_unreadable_forward_says_so():
    class Unreadable:
        __signature__ = 42  # inspect.signature raises on it, as on some C functions

        def __call__(self, *args, **kwargs):
            return args

    module = nn.Module()
    module.forward = Unreadable()
    accepts = forward_accepts(module)
    assert not accepts.readable and accepts.names == frozenset() and not accepts.any_keyword
