"""Looking inside a forward call's inputs: the token tensor, its length, cutting it.

The engine sees `engine(*args, **kwargs)` exactly as the user wrote it: a tensor, keyword
tensors (`engine(**batch)`, the HF way) or one dict. The sequence is `input_ids` when it is
named, else the first integer tensor of 2 or more dims (token ids); every tensor whose dim 1
has that length belongs to the same sequence (labels, attention_mask, position_ids,
token_type_ids) and is cut with it.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch


def _tensors(values):
    for v in values:
        if torch.is_tensor(v):
            yield v
        elif isinstance(v, Mapping):
            yield from _tensors(v.values())


def find_sequence(args: tuple, kwargs: dict) -> torch.Tensor | None:
    """The (batch, seq, ...) token tensor of a forward call, or None: `input_ids` (a keyword or
    a key of a dict batch), else the first integer tensor of 2 or more dims, else any such tensor."""
    named = kwargs.get("input_ids")
    if not torch.is_tensor(named):
        named = next((a["input_ids"] for a in args if isinstance(a, Mapping) and torch.is_tensor(a.get("input_ids"))),
                     None)
    if named is not None:
        return named
    found = [t for t in _tensors((*args, *kwargs.values())) if t.dim() >= 2]
    ints = [t for t in found if not t.is_floating_point() and not t.is_complex() and t.dtype != torch.bool]
    return (ints or found or [None])[0]


def count_tokens(args: tuple, kwargs: dict) -> int:
    """Tokens this forward trains on: batch x sequence length, after any curriculum cut (padding
    included, as Megatron's and HF's counts do). The one definition behind every "tokens"
    zerotrain reports: the token budget, the trainer's logs, tokens_per_s and final summary;
    whoever reports a total sums it over every rank."""
    seq = find_sequence(args, kwargs)
    if seq is None:
        return 0
    length = seq.shape[1]
    cut = kwargs.get("curriculum_seqlen")
    if isinstance(cut, int) and cut < length:
        length = cut
    return int(seq.shape[0]) * int(length)


def _cut(value, full: int, length: int):
    if torch.is_tensor(value):
        if value.dim() >= 2 and value.shape[1] == full:
            return value[:, :length].contiguous()
        return value
    if isinstance(value, Mapping):
        items = {k: _cut(v, full, length) for k, v in value.items()}
        try:
            return type(value)(items)  # keeps a BatchEncoding a BatchEncoding
        except Exception:
            return items
    return value


def cut_sequences(args: tuple, kwargs: dict, full: int, length: int) -> tuple[tuple, dict]:
    """Slice every tensor whose dim 1 equals `full` to its first `length` positions."""
    if length >= full:
        return args, kwargs
    return (tuple(_cut(a, full, length) for a in args),
            {k: _cut(v, full, length) for k, v in kwargs.items()})
