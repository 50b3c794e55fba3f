"""The loader `initialize(training_data=...)` returns while the sampling curriculum is on, and
the post-process functions that let a metric cut or reshape the batch it yields.

    batch = post_process_func(batch, sampler.progress())   after collation, before the engine

`engine.set_data_post_process_func(fn)` sets the function (DeepSpeed's name and call). The
sampler's state names each metric's current difficulty under "current_difficulties", which is
what the two built-ins read:

    seqlen_truncate   cut the sequence dim (dim 1) of every tensor as long as the longest one to
                      the difficulty of metric "seqlen_truncate" (or "seqlen")
    seqlen_reshape    keep the tokens, change the shape: (b, L) -> (b * L // d, d) for metric
                      "seqlen_reshape" (a remainder shorter than d is dropped)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch.utils.data import DataLoader

from ..errors import DataError
from .curriculum_sampler import CurriculumSampler


def _difficulty(state: dict, names: tuple[str, ...]) -> int:
    found = state.get("current_difficulties", {})
    for name in names:
        if name in found:
            return int(found[name])
    raise DataError(f"post-process: the curriculum has no metric named {' or '.join(names)} "
                    f"(its metrics: {', '.join(found) or 'none'})")


def _longest(batch) -> int:
    if torch.is_tensor(batch):
        return batch.shape[1] if batch.dim() >= 2 else 0
    values = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (list, tuple)) else ()
    return max((_longest(v) for v in values), default=0)


def _map(batch, fn):
    if torch.is_tensor(batch):
        return fn(batch)
    if isinstance(batch, Mapping):
        return type(batch)({k: _map(v, fn) for k, v in batch.items()})
    if isinstance(batch, (list, tuple)):
        return type(batch)(_map(v, fn) for v in batch)
    return batch


def seqlen_truncate(batch, state: dict):
    length = _longest(batch)
    d = _difficulty(state, ("seqlen_truncate", "seqlen"))
    if d >= length:
        return batch
    return _map(batch, lambda t: t[:, :d] if t.dim() >= 2 and t.shape[1] == length else t)


def seqlen_reshape(batch, state: dict):
    length = _longest(batch)
    d = _difficulty(state, ("seqlen_reshape",))
    if d >= length:
        return batch

    def reshape(t):
        if t.dim() < 2 or t.shape[1] != length:
            return t
        rows = t.shape[0] * length // d
        return t.reshape(t.shape[0] * length, *t.shape[2:])[:rows * d].reshape(rows, d, *t.shape[2:])

    return _map(batch, reshape)


class CurriculumLoader:
    """Iterates collated micro-batches drawn by a CurriculumSampler; `len()` is this rank's
    micro-batch count over all num_epochs. Its DataLoader takes indices from the sampler only
    as batches are asked for (num_workers 0), so the sampler's state at a checkpoint is exactly
    what has been handed out; with workers it runs ahead by their prefetch."""

    def __init__(self, dataset, sampler: CurriculumSampler, collate_fn=None, num_workers: int = 0):
        self.dataset, self.data_sampler = dataset, sampler
        self.post_process_func: Callable | None = None
        self.loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=collate_fn, num_workers=num_workers)

    def __len__(self) -> int:
        per = self.data_sampler.micro_times_ranks
        total = self.data_sampler.total_samples
        return total // per if self.data_sampler.drop_last else -(-total // per)

    def __iter__(self):
        for batch in self.loader:
            if self.post_process_func is not None:
                batch = self.post_process_func(batch, self.data_sampler.progress())
            yield batch


def build_curriculum_loader(dataset, cfg, rank: int, world_size: int, collate_fn=None) -> CurriculumLoader:
    sampler = CurriculumSampler(cfg.data_efficiency, len(dataset), cfg.train_micro_batch_size_per_gpu, rank,
                                world_size, cfg.gradient_accumulation_steps, drop_last=cfg.dataloader_drop_last)
    return CurriculumLoader(dataset, sampler, collate_fn, cfg.data_efficiency.data_sampling.num_workers)


def curriculum_sampling_on(cfg) -> bool:
    """Whether the sampling curriculum draws the training data (every switch on the way is on)."""
    de = cfg.data_efficiency
    return bool(de is not None and de.enabled and de.data_sampling.enabled
                and de.data_sampling.curriculum_learning.enabled)


BUILT_IN = {"seqlen_truncate": seqlen_truncate, "seqlen_reshape": seqlen_reshape}


def built_in_post_process(metrics) -> Callable | None:
    """The built-in post-process function a metric names, as Megatron-DeepSpeed's training
    script picks it: seqlen_truncate, else seqlen_reshape, else None."""
    return next((BUILT_IN[name] for name in BUILT_IN if name in metrics), None)
