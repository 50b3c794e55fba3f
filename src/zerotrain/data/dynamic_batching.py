"""Dynamic batching: batches made by token count, not sample count
(`data_efficiency.data_sampling.dynamic_batching`, DeepSpeed's variable_batch_size_and_lr).

    order   the samples in sequence_picking_order: "dataloader" (dataset order), "seqlen"
            (ascending length, ties by index) or "random" (random.Random(seed + epoch):
            epoch 0 is DeepSpeed's order, later epochs are reshuffled)
    drop    samples longer than max_tokens (named in a warning)
    packs   greedy, in that order: a pack takes the next samples while their summed length
            stays <= max_tokens and their count <= max_batch_size; a pack must reach
            min_batch_size, and packing ends where one cannot (the rest is left out)
    steps   every E = train_batch_size consecutive packs are one optimizer step (so a step
            holds E packs and a varying number of samples); the packs after the last whole
            step are left out. Rank r's micro-batch j of an epoch joins the packs
            r + dp * (j * micro + i), i < micro (DeepSpeed's interleaved sampler over packs):

                packs  0 1 2 3 | 4 5 6 7 | ...     E = 4, dp = 2, micro = 1, GA = 2
                rank 0 0 . 2 . | 4 . 6 .           step 0: packs 0-3, step 1: packs 4-7
                rank 1 . 1 . 3 | . 5 . 7

    equal   under pipeline parallelism every micro-batch of a step must have one shape: the
            packs are made E at a time (sample k of each group of E joins pack k, so all E
            packs hold the same count and each stays <= max_tokens) and every sample is padded
            to the step's longest one

Two departures from DeepSpeed 0.19.8, both on purpose: its packing loop never reaches the
last sample of the order (it stops one short), here the last sample is packed like any other;
and it replays epoch 0's random order in every epoch, here each epoch is reshuffled. Every
rank computes the same plan from the same lengths and seed, so no collective is needed; a
checkpoint holds (epoch, position) and a resume continues the same batch sequence.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.data._utils.collate import default_collate

from ..errors import DataError

log = logging.getLogger("zerotrain")
WHERE = "data_efficiency.data_sampling.dynamic_batching"
ORDERS = ("random", "seqlen", "dataloader")


# ---- the plan of one epoch ----------------------------------------------------------------
@dataclass
class EpochPlan:
    packs: list[np.ndarray]  # sample ids of each pack, E packs per step
    batch_sizes: list[int]  # samples in each step
    batch_max_seqlens: list[int]  # the longest sample of each step
    too_long: list[int]  # sample ids longer than max_tokens
    left_out: int  # other samples in no step (packing stopped early, or after the last whole step)

    @property
    def steps(self) -> int:
        return len(self.batch_sizes)


def _ordered(seqlens: np.ndarray, ids: np.ndarray, order: str, seed: int | None) -> tuple[np.ndarray, np.ndarray]:
    if order not in ORDERS:
        raise DataError(f"{WHERE}.sequence_picking_order: {order!r} is not one of {', '.join(ORDERS)}")
    if order == "random":
        perm = list(range(len(ids)))
        random.Random(seed).shuffle(perm)  # the stdlib generator: DeepSpeed's order for the same seed
        perm = np.asarray(perm, dtype=np.int64)
    elif order == "seqlen":
        perm = np.lexsort((ids, seqlens))
    else:
        perm = np.arange(len(ids))
    return seqlens[perm], ids[perm]


def _pack_one_at_a_time(lengths: np.ndarray, max_tokens: int, least: int, most: int | None) -> list[tuple[int, int]]:
    """[start, end) of each pack: the longest run from `start` within max_tokens and `most`."""
    ends = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    spans, start, n = [], 0, len(lengths)
    while start < n:
        end = int(np.searchsorted(ends, ends[start] + max_tokens, side="right")) - 1
        end = min(end, start + most) if most else end
        if end - start < least:
            break
        spans.append((start, end))
        start = end
    return spans


def _pack_groups(lengths: np.ndarray, max_tokens: int, least: int, most: int | None, group: int) -> list[np.ndarray]:
    """Positions of each pack, `group` packs at a time of equal counts: each block of `group`
    samples gives one sample to each pack; a group takes blocks while every pack fits."""
    packs, start, n = [], 0, len(lengths)
    while start + group <= n:
        sums, blocks = np.zeros(group, dtype=np.int64), 0
        while start + (blocks + 1) * group <= n and not (most and blocks + 1 > most):
            block = lengths[start + blocks * group:start + (blocks + 1) * group]
            if np.any(sums + block > max_tokens):
                break
            sums += block
            blocks += 1
        if blocks < least:
            break
        positions = np.arange(start, start + blocks * group).reshape(blocks, group)
        packs += [positions[:, j] for j in range(group)]
        start += blocks * group
    return packs


def plan_epoch(seqlens, max_tokens: int, effective_batch_size: int, ids=None, min_batch_size: int = 1,
               max_batch_size: int | None = None, sequence_picking_order: str = "dataloader",
               equal_micro_batches: bool = False, seed: int | None = None) -> EpochPlan:
    """The packs and steps of one epoch (the module docstring's rules). `ids`: the samples to
    use (DeepSpeed's dataset_filter_ids), all by default; `seqlens` has one entry per sample of
    the dataset."""
    seqlens = np.asarray(seqlens, dtype=np.int64).reshape(-1)
    ids = np.arange(len(seqlens), dtype=np.int64) if ids is None else np.asarray(ids, dtype=np.int64).reshape(-1)
    if len(ids) and (ids.min() < 0 or ids.max() >= len(seqlens)):
        raise DataError(f"{WHERE}: a filtered sample id lies outside the {len(seqlens)} samples")
    lengths, ids = _ordered(seqlens[ids], ids, sequence_picking_order, seed)
    fits = lengths <= max_tokens
    too_long = ids[~fits].tolist()
    lengths, ids = lengths[fits], ids[fits]
    least = max(min_batch_size or 1, 1)
    if equal_micro_batches and effective_batch_size > 1:
        packs = [ids[p] for p in _pack_groups(lengths, max_tokens, least, max_batch_size, effective_batch_size)]
    else:
        packs = [ids[a:b] for a, b in _pack_one_at_a_time(lengths, max_tokens, least, max_batch_size)]
    whole = len(packs) - len(packs) % effective_batch_size
    if whole == 0:
        raise DataError(f"{WHERE}: the {len(ids)} samples within max_tokens={max_tokens} make {len(packs)} packs, fewer "
                        f"than the {effective_batch_size} (train_batch_size) one step needs: lower train_batch_size, "
                        "raise max_tokens or lower min_batch_size")
    packs = packs[:whole]
    sizes, longest = [], []
    for s in range(0, whole, effective_batch_size):
        step = np.concatenate(packs[s:s + effective_batch_size])
        sizes.append(len(step))
        longest.append(int(seqlens[step].max()))
    return EpochPlan(packs, sizes, longest, too_long, len(ids) - sum(sizes))


def batch_by_seqlens(seqlens, max_tokens: int, sequence_ids_per_mb=None, min_batch_size: int = 1,
                     max_batch_size: int | None = None, sequence_picking_order: str = "dataloader",
                     effective_batch_size: int = 1, required_microbatches_of_same_size: bool = False,
                     verbose: bool = False, seed: int | None = None):
    """DeepSpeed's function: (microbatch_ids, batch_sizes, batch_max_seqlens), microbatch_ids a
    list of (step, [sample ids]) with effective_batch_size packs per step."""
    plan = plan_epoch(seqlens, max_tokens, effective_batch_size, sequence_ids_per_mb, min_batch_size, max_batch_size,
                      sequence_picking_order, required_microbatches_of_same_size, seed)
    describe(plan, max_tokens, verbose)
    microbatch_ids = [(k // effective_batch_size, p.tolist()) for k, p in enumerate(plan.packs)]
    return microbatch_ids, plan.batch_sizes, plan.batch_max_seqlens


def describe(plan: EpochPlan, max_tokens: int, verbose: bool, epoch: int | None = None) -> None:
    """What the plan leaves out, in one line (nothing silently dropped); verbose: every step."""
    where = "" if epoch is None else f" epoch {epoch}:"
    if plan.too_long:
        shown = ", ".join(map(str, plan.too_long[:10])) + (", ..." if len(plan.too_long) > 10 else "")
        log.warning("dynamic batching:%s %d samples longer than max_tokens=%d are left out (ids %s)", where,
                    len(plan.too_long), max_tokens, shown)
    log.info("dynamic batching:%s %d steps of %d-%d samples (mean %.1f)%s", where, plan.steps,
             min(plan.batch_sizes), max(plan.batch_sizes), sum(plan.batch_sizes) / plan.steps,
             f"; {plan.left_out} samples after the last whole step left out" if plan.left_out else "")
    if verbose:
        per = len(plan.packs) // plan.steps
        for s in range(plan.steps):
            packs = plan.packs[s * per:(s + 1) * per]
            log.info("dynamic batching: step %d: %d samples in %d packs %s, longest %d", s, plan.batch_sizes[s], per,
                     [p.tolist() for p in packs], plan.batch_max_seqlens[s])


# ---- what a sample is ---------------------------------------------------------------------
def _first_sequence(sample):
    if isinstance(sample, Mapping):
        return sample["input_ids"] if "input_ids" in sample else next(iter(sample.values()))
    if isinstance(sample, tuple) or (isinstance(sample, list) and sample and not isinstance(sample[0], (int, float))):
        return sample[0]
    return sample


def sample_length(sample) -> int:
    """Tokens in a sample: the length (dim 0) of a tensor or list, of a dict's input_ids (else
    its first value), of a tuple's first element."""
    seq = _first_sequence(sample)
    if torch.is_tensor(seq) or isinstance(seq, np.ndarray):
        if seq.ndim == 0:
            raise DataError(f"{WHERE}: a sample's sequence is a scalar; give each sample a sequence (its first "
                            "element, or input_ids) or pass dataset_seqlens")
        return int(seq.shape[0])
    return len(seq)


def _pad(t, length: int, value):
    if not torch.is_tensor(t) or t.dim() == 0 or t.shape[0] >= length:
        return t
    return torch.cat([t, t.new_full((length - t.shape[0], *t.shape[1:]), value)])


def pad_sample(sample, length: int, padding_value=0):
    """Right-pad every tensor of a sample along dim 0 to `length` (a dict's "labels" with -100,
    the loss's ignore index)."""
    if torch.is_tensor(sample):
        return _pad(sample, length, padding_value)
    if isinstance(sample, Mapping):
        return type(sample)({k: _pad(v, length, -100 if k == "labels" else padding_value) for k, v in sample.items()})
    if isinstance(sample, (tuple, list)) and any(torch.is_tensor(v) for v in sample):
        return type(sample)(_pad(v, length, padding_value) for v in sample)
    return sample


def pad_collate(samples: list, padding_value=0):
    """Collate samples of different lengths: pad each to the longest, then stack."""
    longest = max((sample_length(s) for s in samples), default=0)
    return default_collate([pad_sample(s, longest, padding_value) for s in samples])


class _PaddedDataset(Dataset):
    """Indexed by (sample id, pad_to): the sample, padded to pad_to when given."""

    def __init__(self, dataset, pad_fn):
        self.dataset, self.pad_fn = dataset, pad_fn or pad_sample

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key):
        index, pad_to = key
        sample = self.dataset[index]
        if pad_to is None:
            return sample
        if sample_length(sample) > pad_to:
            raise DataError(f"{WHERE}: sample {index} has {sample_length(sample)} tokens but its seqlen says at most "
                            f"{pad_to}: the sequence lengths were made for other data")
        return self.pad_fn(sample, pad_to)


# ---- the sampler --------------------------------------------------------------------------
class DynamicBatchSampler:
    """Yields this rank's micro-batches of the current epoch as lists of (sample id, pad_to)
    (pad_to: the step's longest sample with pad_to_step, which defaults to equal_micro_batches;
    else None); one epoch per iteration. `batch_size(step)`: the samples of a global step,
    counted from epoch 0."""

    def __init__(self, seqlens, max_tokens: int, micro_batch_size: int, gradient_accumulation_steps: int,
                 rank: int = 0, world_size: int = 1, ids=None, min_batch_size: int = 1,
                 max_batch_size: int | None = None, sequence_picking_order: str = "dataloader",
                 equal_micro_batches: bool = False, seed: int = 1234, verbose: bool = False,
                 pad_to_step: bool | None = None):
        self.seqlens = np.asarray(seqlens, dtype=np.int64).reshape(-1)
        self.ids = ids
        self.max_tokens, self.micro, self.rank, self.world_size = max_tokens, micro_batch_size, rank, world_size
        self.gradient_accumulation_steps = gradient_accumulation_steps
        self.effective_batch_size = micro_batch_size * gradient_accumulation_steps * world_size
        self.min_batch_size, self.max_batch_size = min_batch_size, max_batch_size
        self.order, self.equal, self.seed, self.verbose = sequence_picking_order, equal_micro_batches, seed, verbose
        self.pad_to_step = equal_micro_batches if pad_to_step is None else pad_to_step
        self.epoch, self.position = 0, 0
        self._plans: dict[int, EpochPlan] = {}
        self._steps: dict[int, int] = {}

    def plan(self, epoch: int) -> EpochPlan:
        key = epoch if self.order == "random" else 0  # other orders make the same plan every epoch
        if key not in self._plans:
            plan = plan_epoch(self.seqlens, self.max_tokens, self.effective_batch_size, self.ids, self.min_batch_size,
                              self.max_batch_size, self.order, self.equal, self.seed + key)
            if self.rank == 0:
                describe(plan, self.max_tokens, self.verbose, key if self.order == "random" else None)
            if len(self._plans) >= 2:  # keep the plans of the epochs in use, not all of them
                self._plans.pop(min(self._plans))
            self._plans[key] = plan
            self._steps[key] = plan.steps
        return self._plans[key]

    def batch_size(self, step: int) -> int:
        epoch = 0
        while True:
            steps = self._steps.get(epoch if self.order == "random" else 0) or self.plan(epoch).steps
            if step < steps:
                return self.plan(epoch).batch_sizes[step]
            step, epoch = step - steps, epoch + 1

    def __len__(self) -> int:
        return len(self.plan(self.epoch).packs) // (self.micro * self.world_size)

    def __iter__(self):
        plan = self.plan(self.epoch)
        while self.position < len(self):
            j = self.position
            pad_to = plan.batch_max_seqlens[j // self.gradient_accumulation_steps] if self.pad_to_step else None
            first = self.rank + self.world_size * j * self.micro
            packs = plan.packs[first:first + self.world_size * self.micro:self.world_size]
            self.position += 1  # before the yield: a state saved now continues after this micro-batch
            yield [(int(i), pad_to) for p in packs for i in p.tolist()]
        self.epoch, self.position = self.epoch + 1, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.position = epoch, 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        if state["seed"] != self.seed:
            log.warning("dynamic batching: the checkpoint's seed %s replaces data_efficiency.seed %s, so that the "
                        "resumed run continues its batches", state["seed"], self.seed)
            self._plans.clear()
            self._steps.clear()
        self.epoch, self.position, self.seed = state["epoch"], state["position"], state["seed"]


def variable_batch_loader(dataset, sampler: DynamicBatchSampler, collate_fn=None, sample_padding_fn=None,
                          num_workers: int = 0, pin_memory: bool = False) -> DataLoader:
    """The loader of a DynamicBatchSampler: samples padded to the step's longest under equal
    micro-batches (sample_padding_fn(sample, length), pad_sample by default), then collated
    (pad_collate by default: padded to the micro-batch's longest and stacked). With
    num_workers 0 the sampler's state at a checkpoint is exactly what was handed out."""
    return DataLoader(_PaddedDataset(dataset, sample_padding_fn), batch_sampler=sampler,
                      collate_fn=collate_fn or pad_collate, num_workers=num_workers, pin_memory=pin_memory)
