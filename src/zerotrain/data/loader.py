"""The dataloader `initialize(training_data=...)` returns.

Each rank sees a disjoint 1/N of every epoch, shuffled by a permutation that depends only on
(seed, epoch), so all ranks agree without talking. The sampler counts what it has handed out,
which is what a mid-epoch resume needs to continue exactly where it stopped.
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Sampler


class DistributedSampler(Sampler[int]):
    def __init__(self, num_samples: int, rank: int = 0, world_size: int = 1, seed: int = 0,
                 shuffle: bool = True, drop_last: bool = False):
        self.num_samples = num_samples
        self.rank, self.world_size = rank, world_size
        self.seed, self.shuffle, self.drop_last = seed, shuffle, drop_last
        self.epoch = 0
        self.position = 0  # indices of the current epoch already yielded by this rank

    def _indices(self) -> list[int]:
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.num_samples, generator=g).tolist()
        else:
            order = list(range(self.num_samples))
        ws = self.world_size
        if self.drop_last:
            order = order[: len(order) - len(order) % ws]
        elif order and len(order) % ws:
            pad = ws - len(order) % ws  # pad by wrapping, as torch's sampler does
            order += (order * -(-pad // len(order)))[:pad]
        return order[self.rank :: ws]

    def __len__(self) -> int:
        ws = self.world_size
        return self.num_samples // ws if self.drop_last else -(-self.num_samples // ws)

    def __iter__(self):
        indices = self._indices()
        while self.position < len(indices):
            index = indices[self.position]
            self.position += 1
            yield index
        self.epoch += 1
        self.position = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.position = epoch, 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position, self.seed = state["epoch"], state["position"], state["seed"]


def build_dataloader(dataset, micro_batch_size: int, rank: int, world_size: int, collate_fn=None,
                     seed: int = 0, shuffle: bool = True, drop_last: bool = False,
                     num_workers: int = 0) -> DataLoader:
    sampler = DistributedSampler(len(dataset), rank, world_size, seed, shuffle, drop_last)
    return DataLoader(dataset, batch_size=micro_batch_size, sampler=sampler, collate_fn=collate_fn,
                      drop_last=drop_last, num_workers=num_workers)
