"""Which samples each rank trains on, in which order: disjoint, seeded, resumable.

One epoch is planned for the whole job, then sliced per rank:

    permutation(seed, epoch) ──► [group_by_length: megabatches of 50 global batches, each sorted
                                   by length, longest global batch first]
                             ──► global micro-batches of B x world samples
                             ──► rank r takes samples [r*B, (r+1)*B) of every global batch

So ranks never share a sample, and with group_by_length every rank's micro-batch at a step
holds similar lengths (little padding, and ranks finish their forwards together). The last
`n % world` samples of a permutation are left out, so each rank gets the same count.
"""

from __future__ import annotations

import torch
from torch.utils.data import Sampler

from ...errors import DataError

MEGABATCH = 50  # global batches sorted together, as HF's length-grouped sampler does


def plan_epoch(lengths: list[int] | None, n: int, batch: int, world: int, seed: int, epoch: int,
               shuffle: bool = True) -> list[list[int]]:
    """Every rank's indices for one epoch, in order."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    order = torch.randperm(n, generator=g).tolist() if shuffle else list(range(n))
    order = order[: n - n % world]
    glob = batch * world
    if lengths is not None:
        mega = glob * MEGABATCH
        order = [i for s in range(0, len(order), mega)
                 for i in sorted(order[s: s + mega], key=lambda i: -lengths[i])]
        groups = [order[s: s + glob] for s in range(0, len(order), glob)]
        # a short global batch stays last: in the middle it would shift every later micro-batch
        tail = [groups.pop()] if groups and len(groups[-1]) < glob else []
        if len(groups) > 1:
            # shuffle the global batches, but run the longest first (an out-of-memory shows early)
            longest = max(range(len(groups)), key=lambda k: max(lengths[i] for i in groups[k]))
            rest = [groups[k] for k in torch.randperm(len(groups), generator=g).tolist() if k != longest]
            groups = [groups[longest]] + rest
        groups += tail
    else:
        groups = [order[s: s + glob] for s in range(0, len(order), glob)]
    per_rank: list[list[int]] = [[] for _ in range(world)]
    for group in groups:
        share = len(group) // world  # the last, short global batch is split evenly
        for r in range(world):
            per_rank[r].extend(group[r * share: (r + 1) * share])
    return per_rank


class TrainSampler(Sampler[int]):
    """This rank's slice of `plan_epoch`; `skip(k)` resumes after k samples of the epoch."""

    def __init__(self, n: int, batch: int, rank: int, world: int, seed: int, lengths: list[int] | None = None):
        if n < world:
            raise DataError(f"the training set has {n} samples, fewer than the {world} processes")
        self.n, self.batch, self.rank, self.world, self.seed = n, batch, rank, world, seed
        self.lengths = lengths
        self.epoch = 0
        self._skip = 0

    def __len__(self) -> int:
        return (self.n - self.n % self.world) // self.world

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        self.epoch, self._skip = epoch, skip

    def indices(self) -> list[int]:
        return plan_epoch(self.lengths, self.n, self.batch, self.world, self.seed, self.epoch)[self.rank]

    def __iter__(self):
        skip, self._skip = self._skip, 0
        return iter(self.indices()[skip:])


class EvalSampler(Sampler[int]):
    """Disjoint, in order, padded by repeating the last index so every rank runs the same
    number of forwards (ZeRO-3 gathers need that); `valid(i)` says which positions count."""

    def __init__(self, n: int, rank: int, world: int):
        self.n, self.rank, self.world = n, rank, world
        self.per_rank = -(-n // world)

    def __len__(self) -> int:
        return self.per_rank

    def __iter__(self):
        for k in range(self.per_rank):
            i = self.rank + k * self.world
            yield min(i, self.n - 1)

    def valid(self) -> list[bool]:
        return [self.rank + k * self.world < self.n for k in range(self.per_rank)]


def sample_lengths(dataset) -> list[int]:
    """Tokens per sample, for group_by_length: the tokenized sets carry a length column."""
    if hasattr(dataset, "column_names") and "length" in dataset.column_names:
        return list(dataset["length"])
    return [len(dataset[i]["input_ids"]) for i in range(len(dataset))]
