"""The benchmarks' corpus: this interpreter's Python standard library as bytes (a 256-symbol
vocabulary, no tokenizer, no download). Every 10th file, sorted by name, is held out."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import torch


def stdlib_bytes() -> tuple[torch.Tensor, torch.Tensor]:
    """(train, held-out) byte streams as int64 tensors."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    train, val = [], []
    for i, f in enumerate(files):
        (val if i % 10 == 0 else train).append(f.read_bytes())
    as_tensor = lambda parts: torch.frombuffer(bytearray(b"\n".join(parts)), dtype=torch.uint8).long()
    return as_tensor(train), as_tensor(val)
