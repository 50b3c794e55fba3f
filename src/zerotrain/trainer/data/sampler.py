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

import math

import torch
from torch.utils.data import DataLoader, Sampler

from ...errors import ConfigError, DataError

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


class SampledBatches:
    """The trainer's own batches: TrainSampler's share of each epoch through a DataLoader. The
    training loop reads this or data_efficiency's batches (efficiency.py) through the same
    methods: micro_per_epoch, total_steps, set_epoch, iteration, and the engine's two hooks."""

    def __init__(self, dataset, args, data_rank: int, data_world: int, collator):
        mb, self.ga = args.per_device_train_batch_size, args.gradient_accumulation_steps
        lengths = sample_lengths(dataset) if args.group_by_length else None
        self.sampler = TrainSampler(len(dataset), mb, data_rank, data_world, args.seed, lengths)
        self.loader = DataLoader(dataset, batch_size=mb, sampler=self.sampler, collate_fn=collator,
                                 num_workers=args.dataloader_num_workers,
                                 generator=torch.Generator().manual_seed(args.seed))  # keeps the global RNG untouched
        self.micro = len(self.loader) // self.ga * self.ga
        if self.micro == 0:
            raise ConfigError(f"an epoch has {len(self.loader)} micro-batches per process, fewer than "
                              f"gradient_accumulation_steps {self.ga}; lower it or the batch size, or add data")

    def micro_per_epoch(self, epoch: int) -> int:
        return self.micro

    def total_steps(self, epochs: float) -> int:
        return max(1, math.ceil(epochs * (self.micro // self.ga)))

    def check_total(self, total_steps: int) -> None:
        """Epochs repeat without end."""

    def engine_config(self, ds: dict, output_dir) -> dict:
        return {}  # initialize gets no training data: the loop feeds the engine

    def attach(self, engine, loader) -> None:
        """Nothing of the engine's to adopt."""

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        self.sampler.set_epoch(epoch, skip)

    def __iter__(self):
        return iter(self.loader)
