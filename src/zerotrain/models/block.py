"""The pre-LayerNorm Transformer block the built-in GPT (causal) and BERT (bidirectional,
padding mask) share: LayerNorm inside each residual branch, so a skipped block (layer drop)
leaves the residual stream unchanged and well scaled.

The forward counts heads from the width it is given, not from n_head, so the same code runs
split across tensor-parallel ranks (`TP_PLAN`: qkv split by parts, each rank holding whole
heads of q, k and v; proj and fc_out rowwise; fc colwise)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from .linear import Linear



def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


# BERT configs name the activation (hidden_act); gelu is the exact (erf) form, gelu_new the tanh one
ACTIVATIONS = {"gelu": F.gelu, "gelu_new": gelu_tanh, "gelu_pytorch_tanh": gelu_tanh, "relu": F.relu,
               "silu": F.silu, "swish": F.silu}


def activation(name: str):
    if name not in ACTIVATIONS:
        raise ConfigError(f"hidden_act {name!r}: should be one of {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def core_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                   dropout_p: float, causal: bool) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v over (batch, heads, sequence, head_dim)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=causal)


class PreLNBlock(nn.Module):
    """`dropout` acts on the residual branches, `attn_dropout` (default: the same) on the attention
    probabilities; the feed-forward is n_embd -> n_inner (default 4 x n_embd) -> n_embd."""

    def __init__(self, n_embd: int, n_head: int, dropout: float = 0.0, bias: bool = True, causal: bool = True,
                 n_inner: int | None = None, act: str = "gelu", attn_dropout: float | None = None):
        super().__init__()
        inner = n_inner or 4 * n_embd
        self.ln_1 = nn.LayerNorm(n_embd, bias=bias)
        self.qkv = Linear(n_embd, 3 * n_embd, bias=bias)
        self.proj = Linear(n_embd, n_embd, bias=bias)
        self.ln_2 = nn.LayerNorm(n_embd, bias=bias)
        self.fc = Linear(n_embd, inner, bias=bias)
        self.fc_out = Linear(inner, n_embd, bias=bias)
        self.n_head, self.dropout, self.causal = n_head, dropout, causal
        self.head_dim = n_embd // n_head
        self.attn_dropout = dropout if attn_dropout is None else attn_dropout
        self.act = activation(act)
        # the attention between the projections: sequence parallelism wraps it (parallel/sequence/)
        self.core_attention = core_attention
        # >1: the feed-forward runs over this many tiles of the sequence, recomputed in backward
        # (TiledMLP, parallel/sequence/tiled.py), so its inner activations exist a tile at a time
        self.mlp_tiles = 1

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln_1(x)).chunk(3, dim=2)  # this rank's share of each (all of it unsplit)
        q, k, v = (z.view(b, t, -1, self.head_dim).transpose(1, 2) for z in (q, k, v))
        p = self.dropout if self.training else 0.0
        pa = self.attn_dropout if self.training else 0.0
        y = self.core_attention(q, k, v, mask, pa, self.causal)
        x = x + F.dropout(self.proj(y.transpose(1, 2).reshape(b, t, -1)), p, self.training)
        if self.mlp_tiles > 1:  # the dropout outside: a recomputed tile would draw another mask
            from ..parallel.sequence.tiled import TiledMLP

            return x + F.dropout(TiledMLP.apply(PreLNBlock.mlp, self, x, self.mlp_tiles, self.mlp_params()), p,
                                 self.training)
        return x + F.dropout(self.mlp(x), p, self.training)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        """The feed-forward branch after the attention (before its residual dropout)."""
        return self.fc_out(self.act(self.fc(self.ln_2(x))))

    def mlp_params(self) -> list:
        return [*self.ln_2.parameters(), *self.fc.parameters(), *self.fc_out.parameters()]


# how TensorParallel splits a PreLNBlock (module name within the block -> parallel/tensor/dtensor.py style)
TP_PLAN = {"qkv": "fused_colwise:3", "proj": "rowwise", "fc": "colwise", "fc_out": "rowwise"}
