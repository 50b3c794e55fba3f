"""A Pre-LayerNorm BERT-style encoder with MLM and sequence-classification heads.

Pre-LN (LayerNorm inside the residual branch, one final LayerNorm) is what the PLD paper
trains: with an identity residual path a skipped block leaves a well-scaled signal, and
training stays stable without the long warmup Post-LN BERT needs. The blocks are a
zerotrain.layerdrop.LayerDrop list (features/layer_drop.py), so `progressive_layer_drop=True, pld_theta=t` in
training skips blocks (block i of L kept with probability 1 - i/L * (1 - t)).

    input_ids -> token + position (+ segment) embeddings -> LN -> [PreLN block] x L -> LN
              -> MLM head (dense, act, LN, tied decoder)   or   pooler(first token) -> classes / a score

`bert_config` also reads the BERT config of the PLD recipe (pytorch-pretrained-bert's and HF's
key names: hidden_size, num_hidden_layers, intermediate_size, hidden_act, the two dropouts,
initializer_range, ...). A classifier with one output is a regression (MSE), as in HF.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from ..features.layer_drop import LayerDrop
from .block import PreLNBlock, activation
from .linear import Linear


@dataclass
class BertConfig:
    vocab_size: int = 257  # 256 bytes + a [MASK] id
    n_positions: int = 512
    n_embd: int = 256
    n_layer: int = 6
    n_head: int = 4
    type_vocab_size: int = 2
    dropout: float = 0.0  # embeddings, residual branches and the classifier input (hidden_dropout_prob)
    num_labels: int = 2  # 1: regression
    bias: bool = True
    n_inner: int | None = None  # feed-forward width; None: 4 x n_embd
    activation: str = "gelu"
    attn_dropout: float | None = None  # attention probabilities; None: dropout
    init_std: float = 0.02  # normal init of linear and embedding weights
    # what the classifier's pooler reads: "cls", the first position (BERT's); "mean", the mean
    # over the non-padding positions. MLM pretraining never trains position 0, so a small
    # pretrained encoder's first output carries little (docs/curriculum-and-layer-drop.md)
    pooling: str = "cls"


# BERT config names (pytorch-pretrained-bert's, which the PLD recipe uses, and HF's) -> ours
BERT_KEYS = {"vocab_size_or_config_json_file": "vocab_size", "hidden_size": "n_embd", "num_hidden_layers": "n_layer",
             "num_attention_heads": "n_head", "intermediate_size": "n_inner", "hidden_act": "activation",
             "hidden_dropout_prob": "dropout", "attention_probs_dropout_prob": "attn_dropout",
             "max_position_embeddings": "n_positions", "type_vocab_size": "type_vocab_size",
             "initializer_range": "init_std"}


def is_bert_recipe_config(spec: dict) -> bool:
    """A config of BERT names with neither model_type nor zerotrain_model, as the recipe writes it."""
    return "vocab_size_or_config_json_file" in spec or (bool(spec) and set(spec) <= set(BERT_KEYS) | {"vocab_size"})


def bert_config_keys(spec: dict) -> dict:
    """Our field names for a mapping that may use BERT's names (one spelling per setting)."""
    out, source = {}, {}
    for key, value in spec.items():
        name = BERT_KEYS.get(key, key)
        if name in out:
            raise ConfigError(f"model_config: {source[name]} and {key} set the same thing; keep one")
        source[name] = key
        if key == "vocab_size_or_config_json_file" and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(f"model_config: vocab_size_or_config_json_file should be the vocabulary size (an "
                              f"integer), got {value!r}")
        out[name] = value
    return out


class BertEncoder(nn.Module):
    """Returns the final hidden states (batch, seq, n_embd)."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.n_positions, cfg.n_embd)
        self.wtt = nn.Embedding(cfg.type_vocab_size, cfg.n_embd)
        self.ln_emb = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        if cfg.n_embd % cfg.n_head:
            raise ConfigError(f"model_config: hidden size {cfg.n_embd} is not a multiple of {cfg.n_head} heads")
        activation(cfg.activation)  # an unknown name fails here, before any block is built
        self.blocks = LayerDrop(PreLNBlock(cfg.n_embd, cfg.n_head, cfg.dropout, cfg.bias, causal=False,
                                           n_inner=cfg.n_inner, act=cfg.activation, attn_dropout=cfg.attn_dropout)
                                for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, progressive_layer_drop=False,
                pld_theta=None) -> torch.Tensor:
        t = input_ids.shape[1]
        x = self.wte(input_ids) + self.wpe(torch.arange(t, device=input_ids.device))
        if token_type_ids is not None:
            x = x + self.wtt(token_type_ids)
        x = F.dropout(self.ln_emb(x), self.cfg.dropout, self.training)
        # (batch, 1, 1, seq) booleans: True where a key may be attended to (not padding)
        mask = attention_mask[:, None, None, :].bool() if attention_mask is not None else None
        with self.blocks.dropping(pld_theta if progressive_layer_drop and self.training else None):
            for block in self.blocks:
                x = block(x, mask)
        return self.ln_f(x)


def _initialiser(std: float):
    def init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=std)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    return init


class PreLNBertMLM(nn.Module):
    """labels: the original ids at masked positions, -100 elsewhere. Returns the mean loss over
    masked positions (the head runs only there), or all logits without labels."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.cfg = cfg
        self.bert = BertEncoder(cfg)
        self.dense = Linear(cfg.n_embd, cfg.n_embd)
        self.ln = nn.LayerNorm(cfg.n_embd)
        self.decoder = Linear(cfg.n_embd, cfg.vocab_size)
        self.act = activation(cfg.activation)
        self.apply(_initialiser(cfg.init_std))
        self.decoder.weight = self.bert.wte.weight  # tied, as in BERT

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None,
                progressive_layer_drop=False, pld_theta=None):
        h = self.bert(input_ids, attention_mask, token_type_ids, progressive_layer_drop, pld_theta)
        if labels is not None:
            picked = labels != -100
            h, labels = h[picked], labels[picked]
        logits = self.decoder(self.ln(self.act(self.dense(h))))
        if labels is None:
            return logits
        return F.cross_entropy(logits.float(), labels)


class PreLNBertClassifier(nn.Module):
    """Classifies from the first token (a [CLS] position), or from the mean over the non-padding
    positions with `pooling="mean"`; labels give the cross-entropy loss, or with num_labels 1 (a
    regression such as STS-B) the mean squared error of the one output."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        if cfg.pooling not in ("cls", "mean"):
            raise ConfigError(f"BertConfig.pooling {cfg.pooling!r}: use \"cls\" (the first position) or \"mean\" "
                              "(the mean over the non-padding positions)")
        self.cfg = cfg
        self.bert = BertEncoder(cfg)
        self.pooler = Linear(cfg.n_embd, cfg.n_embd)
        self.classifier = Linear(cfg.n_embd, cfg.num_labels)
        self.apply(_initialiser(cfg.init_std))

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None,
                progressive_layer_drop=False, pld_theta=None):
        h = self.bert(input_ids, attention_mask, token_type_ids, progressive_layer_drop, pld_theta)
        if self.cfg.pooling == "mean":
            m = (torch.ones_like(input_ids) if attention_mask is None else attention_mask)[..., None].to(h.dtype)
            first = (h * m).sum(1) / m.sum(1).clamp(min=1)
        else:
            first = h[:, 0]
        pooled = torch.tanh(self.pooler(first))
        if self.cfg.dropout:
            pooled = F.dropout(pooled, self.cfg.dropout, self.training)
        logits = self.classifier(pooled)
        if labels is None:
            return logits
        if self.cfg.num_labels == 1:
            return F.mse_loss(logits.float().squeeze(-1), labels.float())
        return F.cross_entropy(logits.float(), labels)


# HF's names for these two heads, for scripts that import them so (the classes are zerotrain's own
# Pre-LN models, not HF's Post-LN BertForMaskedLM / BertForSequenceClassification).
BertForMaskedLM = PreLNBertMLM
BertForSequenceClassification = PreLNBertClassifier
