"""Small built-in models for the demo, the tests and the benchmarks. Their blocks are
switchable for progressive layer drop (zerotrain.features.layer_drop, public as zerotrain.layerdrop)."""

from .bert import (BertConfig, BertEncoder, BertForMaskedLM, BertForSequenceClassification, PreLNBertClassifier,
                   PreLNBertMLM)
from .gpt import GPT, GPTConfig

__all__ = ["GPT", "GPTConfig", "BertConfig", "BertEncoder", "PreLNBertMLM", "PreLNBertClassifier",
           "BertForMaskedLM", "BertForSequenceClassification"]
