"""The arithmetic of sharding, in one place: pure, no collectives, no model.

Two schemes cut one param group across N ranks:

    flat     (stages 0-2)  the params end to end in one buffer, padded to a multiple of
                           N * ALIGN and cut into N contiguous shards of one length:
                               | p0 | p1 |   p2   | p3 |pad|
                               |    rank 0    |   rank 1   |
    chunked  (stage 3)     every param padded to N * c (c = ceil(numel / N)) and cut into
                           N chunks; rank r's shard is its chunk of every param, end to end,
                           padded to ALIGN:
                               p0: | c0 | c1 |   p1: | c0 | c1 |
                               rank 0: | p0.c0 | p1.c0 |pad|   rank 1: | p0.c1 | p1.c1 |pad|

`GroupLayout` answers what every user of a layout asks (the stages, the stage-3 gatherer,
zero.Init, consolidation, resharding, the memory estimate): how long a rank's piece is,
where it starts, and which part of which parameter sits where in it (`spans`). `cut` and
`glue` turn one whole tensor into its N chunks and back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

ALIGN = 16  # elements; keeps shard starts 64-byte aligned in fp32

FLAT, CHUNKED = "flat", "chunked"


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def round_up(n: int, unit: int) -> int:
    return ceil_div(n, unit) * unit


def prefix_offsets(sizes: Sequence[int]) -> list[int]:
    """Where each of `sizes` starts when they are laid end to end."""
    out, total = [], 0
    for n in sizes:
        out.append(total)
        total += n
    return out


def flat_padded_numel(numel: int, world_size: int) -> int:
    """A flat buffer of `numel` elements padded so that N equal shards start aligned."""
    unit = world_size * ALIGN
    return max(unit, round_up(numel, unit))


def chunked_shard_numel(chunks: Sequence[int] | int) -> int:
    """A stage-3 shard: this rank's chunks end to end, padded to ALIGN."""
    total = chunks if isinstance(chunks, int) else sum(chunks)
    return max(ALIGN, round_up(total, ALIGN))


@dataclass(frozen=True)
class Span:
    """Elements [param_lo, param_lo + numel) of parameter `index` sit at [piece_lo, ...) of a piece."""

    index: int
    param_lo: int
    piece_lo: int
    numel: int


class GroupLayout:
    """Where the elements of one param group live, per rank.

    `numels[i]` is what parameter i occupies in the layout (flat: all of it; chunked: one
    chunk), at `offsets[i]`; `full_numels[i]` its whole size. A rank's *piece* is what it
    stores: a shard (`shard_numel` elements) or, flat and unsharded (stage 0), the whole
    padded buffer.
    """

    def __init__(self, full_numels: Sequence[int], world_size: int, scheme: str = FLAT, sharded: bool = True):
        if scheme not in (FLAT, CHUNKED):
            raise ValueError(f"unknown layout scheme {scheme!r}")
        self.scheme, self.world_size, self.sharded = scheme, int(world_size), sharded or scheme == CHUNKED
        self.full_numels = [int(n) for n in full_numels]
        if scheme == FLAT:
            self.numels = list(self.full_numels)
            self.offsets = prefix_offsets(self.numels)
            self.numel = sum(self.numels)
            self.padded_numel = flat_padded_numel(self.numel, self.world_size)
            self.shard_numel = self.padded_numel // self.world_size
        else:
            self.numels = [ceil_div(n, self.world_size) for n in self.full_numels]
            self.offsets = prefix_offsets(self.numels)
            self.numel = sum(self.numels)
            self.padded_numel = self.shard_numel = chunked_shard_numel(self.numels)

    # ---- pieces ------------------------------------------------------------------------------
    def shard_range(self, rank: int) -> tuple[int, int]:
        """Rank r's shard as a range of the flat buffer (flat) or of shard space (chunked)."""
        if self.scheme == CHUNKED:
            return 0, self.shard_numel
        return rank * self.shard_numel, (rank + 1) * self.shard_numel

    def piece_range(self, rank: int) -> tuple[int, int]:
        """What rank r stores: its shard, or the whole flat buffer when unsharded."""
        return (0, self.padded_numel) if not self.sharded else self.shard_range(rank)

    def shard_edges(self) -> list[int]:
        """Interior shard boundaries of a flat buffer (where a bucket must be cut to have one owner)."""
        return list(range(self.shard_numel, self.padded_numel, self.shard_numel)) if self.scheme == FLAT else []

    def owner_of(self, offset: int) -> int:
        """The rank whose flat shard holds `offset`."""
        return offset // self.shard_numel

    def spans(self, rank: int) -> list[Span]:
        """Which part of which parameter sits where in rank r's piece."""
        out = []
        if self.scheme == CHUNKED:
            for i, (o, c, n) in enumerate(zip(self.offsets, self.numels, self.full_numels)):
                take = min(c, n - rank * c)
                if take > 0:
                    out.append(Span(i, rank * c, o, take))
            return out
        start, end = self.piece_range(rank)
        for i, (o, n) in enumerate(zip(self.offsets, self.numels)):
            lo, hi = max(o, start), min(o + n, end)
            if lo < hi:
                out.append(Span(i, lo - o, lo - start, hi - lo))
        return out

    # ---- checkpoints ---------------------------------------------------------------------------
    def describe(self, names: list[str], shapes: list) -> dict:
        """The group as checkpoints record it (consolidate and reshard read it back)."""
        out = {"names": names, "shapes": [list(s) for s in shapes], "offsets": self.offsets,
               "numels": self.numels, "shard_numel": self.shard_numel}
        if self.scheme == CHUNKED:
            out["full_numels"] = self.full_numels
        return out

    @classmethod
    def from_saved(cls, group: dict, scheme: str, world_size: int, stage: int) -> GroupLayout:
        """The layout a checkpoint recorded; its offsets and sizes must be what this module computes."""
        full = group.get("full_numels", group["numels"])
        layout = cls(full, world_size, scheme, sharded=stage > 0)
        if layout.offsets != list(group["offsets"]) or layout.shard_numel != group["shard_numel"]:
            raise ValueError("recorded offsets or shard size differ from the layout's own arithmetic")
        return layout


# ---- whole tensors <-> chunks ----------------------------------------------------------------
def cut(flat: torch.Tensor, world_size: int) -> torch.Tensor:
    """A 1-d tensor as N equal chunks, shape (N, c): a view when no padding is needed."""
    chunk = ceil_div(flat.numel(), world_size)
    if flat.numel() != world_size * chunk:
        flat = F.pad(flat, (0, world_size * chunk - flat.numel()))
    return flat.view(world_size, chunk)


def glue(gathered: torch.Tensor, shape) -> torch.Tensor:
    """The whole tensor of `shape` from its N chunks laid end to end (a view)."""
    return gathered.reshape(-1)[: torch.Size(shape).numel()].view(shape)


def fill_from_piece(dests: Sequence[torch.Tensor], spans: Sequence[Span], piece: torch.Tensor) -> None:
    """Copy a rank's piece into the flat whole-parameter tensors `dests` (indexed like the group)."""
    for s in spans:
        dests[s.index][s.param_lo : s.param_lo + s.numel] = piece[s.piece_lo : s.piece_lo + s.numel]


def piece_from(sources: Sequence[torch.Tensor], spans: Sequence[Span], piece: torch.Tensor) -> torch.Tensor:
    """The reverse of fill_from_piece: write the parts of flat whole parameters into `piece`."""
    for s in spans:
        piece[s.piece_lo : s.piece_lo + s.numel] = sources[s.index][s.param_lo : s.param_lo + s.numel]
    return piece
