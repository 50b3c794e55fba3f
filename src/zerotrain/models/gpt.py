"""A GPT-2-style decoder (pre-LayerNorm, tied embeddings), small enough for CPU runs.

`GPT(cfg)(input_ids, labels=None, position_ids=None)` returns the mean next-token loss when labels are given
(labels are the inputs themselves; the shift happens inside), else the logits; with
`shift_labels=` (already shifted: a sequence-parallel piece) the mean over its real labels.
For long sequences GPTConfig tiles the feed-forward (`mlp_tiles`) and the loss
(`loss_tiles`), and checkpoints the blocks (`checkpoint_blocks`). The blocks
are switchable: in training, `progressive_layer_drop=True, pld_theta=t` (what the engine
passes with PLD on) skips blocks as zerotrain.layerdrop describes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from ..features.layer_drop import LayerDrop
from ..helpers.activation_checkpointing import checkpoint
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
    # long sequences (parallel/sequence/tiled.py): >1 runs each block's feed-forward over this
    # many tiles of the sequence, recomputed in backward (TiledMLP)
    mlp_tiles: int = 1
    # >1: the loss from labels (or shift_labels) is computed over this many tiles of the
    # positions, so the logits are never whole (TiledFusedLogitsLoss); the output has no logits
    loss_tiles: int = 1
    # each block through zerotrain.checkpointing.checkpoint in training: recomputed in backward,
    # its input kept in host memory with activation_checkpointing.cpu_checkpointing
    checkpoint_blocks: bool = False

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
        for name in ("mlp_tiles", "loss_tiles"):
            value = getattr(cfg, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"GPTConfig.{name} {value!r}: should be a positive integer (1: no tiling)")
        for block in self.blocks:
            block.mlp_tiles = cfg.mlp_tiles
        # the sequence-parallel engine hands its targets to a model that scores them itself
        self.scores_shift_labels = cfg.loss_tiles > 1

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                progressive_layer_drop: bool = False, pld_theta: float | None = None,
                position_ids: torch.Tensor | None = None, shift_labels: torch.Tensor | None = None):
        t = input_ids.shape[1]
        # a sequence-parallel shard passes its global positions
        pos = torch.arange(t, device=input_ids.device) if position_ids is None else position_ids
        x = self.wte(input_ids) + self.wpe(pos)
        with self.blocks.dropping(pld_theta if progressive_layer_drop and self.training else None):
            for block in self.blocks:
                x = checkpoint(block, x) if self.cfg.checkpoint_blocks and self.training else block(x)
        hidden = self.ln_f(x)
        if labels is None and shift_labels is None:
            return self.lm_head(hidden)
        # position t predicts token t+1: shift the labels, not the logits (a shifted slice of
        # the logits is copied, forward and backward, at the activation peak); shift_labels:
        # already shifted (a sequence-parallel piece, whose last target is the next piece's)
        targets = F.pad(labels[:, 1:], (0, 1), value=-100) if shift_labels is None else shift_labels
        if self.cfg.loss_tiles > 1:
            from ..parallel.sequence.tiled import tiled_loss_sum

            total, count = tiled_loss_sum(hidden, self.lm_head, targets, self.cfg.loss_tiles)
            return total / count.clamp(min=1)
        return F.cross_entropy(self.lm_head(hidden).flatten(0, 1).float(), targets.flatten())
