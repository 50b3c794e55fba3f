"""A GPT-2-style decoder (pre-LayerNorm, tied embeddings), small enough for CPU runs.

`GPT(cfg)(input_ids, labels=None, position_ids=None)` returns the mean next-token loss when labels are given
(labels are the inputs themselves; the shift happens inside), else the logits. The blocks
are switchable: in training, `progressive_layer_drop=True, pld_theta=t` (what the engine
passes with PLD on) skips blocks as zerotrain.layerdrop describes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..features.layer_drop import LayerDrop
from .block import PreLNBlock
from .linear import Linear


@dataclass
class GPTConfig:
    vocab_size: int = 256
    n_positions: int = 256
    n_embd: int = 128
    n_layer: int = 4
    n_head: int = 4
    dropout: float = 0.0
    bias: bool = True  # biases in Linear and LayerNorm layers, as GPT-2 has

    @classmethod
    def preset(cls, name: str) -> GPTConfig:
        presets = {
            "tiny": dict(n_embd=64, n_layer=2, n_head=2, n_positions=128),
            "small": dict(n_embd=128, n_layer=4, n_head=4, n_positions=256),
            # ~20M parameters with the GPT-2 vocabulary size: the benchmark model
            "bench20m": dict(vocab_size=8192, n_embd=384, n_layer=8, n_head=6, n_positions=256),
        }
        return cls(**presets[name])


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.n_positions, cfg.n_embd)
        self.blocks = LayerDrop(PreLNBlock(cfg.n_embd, cfg.n_head, cfg.dropout, cfg.bias)
                                for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.lm_head = Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as in GPT-2
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                progressive_layer_drop: bool = False, pld_theta: float | None = None,
                position_ids: torch.Tensor | None = None):
        t = input_ids.shape[1]
        # a sequence-parallel shard passes its global positions
        pos = torch.arange(t, device=input_ids.device) if position_ids is None else position_ids
        x = self.wte(input_ids) + self.wpe(pos)
        with self.blocks.dropping(pld_theta if progressive_layer_drop and self.training else None):
            for block in self.blocks:
                x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if labels is None:
            return logits
        # position t predicts token t+1: shift the labels, not the logits (a shifted slice of
        # the logits is copied, forward and backward, at the activation peak)
        targets = F.pad(labels[:, 1:], (0, 1), value=-100)
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
