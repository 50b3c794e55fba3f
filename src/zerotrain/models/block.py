"""The pre-LayerNorm Transformer block the built-in GPT (causal) and BERT (bidirectional,
padding mask) share: LayerNorm inside each residual branch, so a skipped block (layer drop)
leaves the residual stream unchanged and well scaled."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class PreLNBlock(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float = 0.0, bias: bool = True, causal: bool = True):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, bias=bias)
        self.qkv = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.ln_2 = nn.LayerNorm(n_embd, bias=bias)
        self.fc = nn.Linear(n_embd, 4 * n_embd, bias=bias)
        self.fc_out = nn.Linear(4 * n_embd, n_embd, bias=bias)
        self.n_head, self.dropout, self.causal = n_head, dropout, causal

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=self.causal)
        x = x + F.dropout(self.proj(y.transpose(1, 2).reshape(b, t, c)), p, self.training)
        return x + F.dropout(self.fc_out(F.gelu(self.fc(self.ln_2(x)))), p, self.training)
