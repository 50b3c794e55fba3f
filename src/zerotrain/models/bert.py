"""A Pre-LayerNorm BERT-style encoder with MLM and sequence-classification heads.

Pre-LN (LayerNorm inside the residual branch, one final LayerNorm) is what the PLD paper
trains: with an identity residual path a skipped block leaves a well-scaled signal, and
training stays stable without the long warmup Post-LN BERT needs. The blocks are a
zerotrain.layerdrop.LayerDrop list (features/layer_drop.py), so `progressive_layer_drop=True, pld_theta=t` in
training skips blocks (block i of L kept with probability 1 - i/L * (1 - t)).

    input_ids -> token + position (+ segment) embeddings -> LN -> [PreLN block] x L -> LN
              -> MLM head (dense, gelu, LN, tied decoder)   or   pooler(first token) -> classes
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..features.layer_drop import LayerDrop
from .block import PreLNBlock


@dataclass
class BertConfig:
    vocab_size: int = 257  # 256 bytes + a [MASK] id
    n_positions: int = 512
    n_embd: int = 256
    n_layer: int = 6
    n_head: int = 4
    type_vocab_size: int = 2
    dropout: float = 0.0
    num_labels: int = 2
    bias: bool = True


class BertEncoder(nn.Module):
    """Returns the final hidden states (batch, seq, n_embd)."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.n_positions, cfg.n_embd)
        self.wtt = nn.Embedding(cfg.type_vocab_size, cfg.n_embd)
        self.ln_emb = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.blocks = LayerDrop(PreLNBlock(cfg.n_embd, cfg.n_head, cfg.dropout, cfg.bias, causal=False)
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


def _init(m: nn.Module) -> None:
    if isinstance(m, (nn.Linear, nn.Embedding)):
        nn.init.normal_(m.weight, std=0.02)
    if isinstance(m, nn.Linear) and m.bias is not None:
        nn.init.zeros_(m.bias)


class BertForMaskedLM(nn.Module):
    """labels: the original ids at masked positions, -100 elsewhere. Returns the mean loss over
    masked positions (the head runs only there), or all logits without labels."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.cfg = cfg
        self.bert = BertEncoder(cfg)
        self.dense = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.ln = nn.LayerNorm(cfg.n_embd)
        self.decoder = nn.Linear(cfg.n_embd, cfg.vocab_size)
        self.apply(_init)
        self.decoder.weight = self.bert.wte.weight  # tied, as in BERT

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None,
                progressive_layer_drop=False, pld_theta=None):
        h = self.bert(input_ids, attention_mask, token_type_ids, progressive_layer_drop, pld_theta)
        if labels is not None:
            picked = labels != -100
            h, labels = h[picked], labels[picked]
        logits = self.decoder(self.ln(F.gelu(self.dense(h))))
        if labels is None:
            return logits
        return F.cross_entropy(logits.float(), labels)


class BertForSequenceClassification(nn.Module):
    """Classifies from the first token (a [CLS] position); labels give the cross-entropy loss."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.cfg = cfg
        self.bert = BertEncoder(cfg)
        self.pooler = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.classifier = nn.Linear(cfg.n_embd, cfg.num_labels)
        self.apply(_init)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None,
                progressive_layer_drop=False, pld_theta=None):
        h = self.bert(input_ids, attention_mask, token_type_ids, progressive_layer_drop, pld_theta)
        logits = self.classifier(torch.tanh(self.pooler(h[:, 0])))
        if labels is None:
            return logits
        return F.cross_entropy(logits.float(), labels)
