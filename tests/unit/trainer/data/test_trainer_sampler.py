"""The training sampler: disjoint per rank, seeded, resumable; group_by_length cuts padding."""

from __future__ import annotations

import random

import pytest
import torch

from zerotrain.trainer.data.collate import Collator, pad_to_length
from zerotrain.trainer.data.sampler import EvalSampler, TrainSampler, plan_epoch


@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("n, batch, world", [(64, 4, 2), (67, 3, 2), (50, 4, 3), (10, 8, 2)])
def test_ranks_get_disjoint_equal_shares(n, batch, world, grouped):
    lengths = [random.Random(i).randint(1, 100) for i in range(n)] if grouped else None
    parts = plan_epoch(lengths, n, batch, world, seed=3, epoch=1)
    flat = [i for p in parts for i in p]
    assert len(flat) == len(set(flat)) == n - n % world  # disjoint, only the n % world tail left out
    assert len({len(p) for p in parts}) == 1
    assert [TrainSampler(n, batch, r, world, 3, lengths).__len__() for r in range(world)] == [len(parts[0])] * world


def test_epochs_and_seeds_change_the_order_and_skip_resumes():
    s = TrainSampler(40, 4, 0, 2, seed=1)
    first = list(s)
    s.set_epoch(1)
    second = list(s)
    assert second == plan_epoch(None, 40, 4, 2, 1, 1)[0] and second != first
    other = TrainSampler(40, 4, 1, 2, seed=1)
    other.set_epoch(1)
    assert sorted(second + list(other)) == list(range(40))  # the new order still covers every sample once
    assert plan_epoch(None, 40, 4, 2, 1, 0) != plan_epoch(None, 40, 4, 2, 2, 0)
    s.set_epoch(0, skip=8)
    assert list(s) == first[8:]
    assert list(s) == first  # the skip applies once


def padding_fraction(lengths: list[int], batch: int, world: int, grouped: bool) -> float:
    collate = Collator("clm", pad_id=0)
    pad = total = 0
    for rank in range(world):
        order = plan_epoch(lengths if grouped else None, len(lengths), batch, world, seed=0, epoch=0)[rank]
        for s in range(0, len(order), batch):
            b = collate([{"input_ids": [1] * lengths[i]} for i in order[s: s + batch]])
            pad += int((b["attention_mask"] == 0).sum())
            total += b["attention_mask"].numel()
    return pad / total


def test_group_by_length_pads_much_less_than_random_batches():
    rng = random.Random(0)
    lengths = [rng.choice([rng.randint(4, 16), rng.randint(100, 400)]) for _ in range(1000)]
    grouped = padding_fraction(lengths, 8, 2, grouped=True)
    shuffled = padding_fraction(lengths, 8, 2, grouped=False)
    assert grouped < 0.05 < 0.3 < shuffled, (grouped, shuffled)


def test_group_by_length_puts_the_longest_batch_first_and_ranks_step_together():
    lengths = list(range(1, 201))
    parts = plan_epoch(lengths, 200, 4, 2, seed=0, epoch=0)
    assert max(lengths[i] for i in parts[0][:4] + parts[1][:4]) == 200
    for s in range(0, len(parts[0]), 4):  # the two ranks' micro-batches at one step have similar lengths
        a = [lengths[i] for i in parts[0][s: s + 4]]
        b = [lengths[i] for i in parts[1][s: s + 4]]
        assert abs(max(a) - max(b)) <= 8


def test_eval_sampler_pads_with_invalid_repeats():
    parts = [list(EvalSampler(5, r, 2)) for r in range(2)]
    valid = [EvalSampler(5, r, 2).valid() for r in range(2)]
    assert parts == [[0, 2, 4], [1, 3, 4]] and valid == [[True] * 3, [True, True, False]]
    kept = sorted(i for p, v in zip(parts, valid) for i, ok in zip(p, v) if ok)
    assert kept == [0, 1, 2, 3, 4]


def test_collator_labels_ignore_padding():
    b = Collator("clm", pad_id=7)([{"input_ids": [1, 2, 3]}, {"input_ids": [4]}])
    assert b["input_ids"].tolist() == [[1, 2, 3], [4, 7, 7]]
    assert b["labels"].tolist() == [[1, 2, 3], [4, -100, -100]]
    c = Collator("classification", 0)([{"input_ids": [1], "labels": 1}, {"input_ids": [2, 3], "labels": 0}])
    assert c["labels"].tolist() == [1, 0] and torch.equal(c["attention_mask"], torch.tensor([[1, 0], [1, 1]]))


def test_pad_to_length_pads_as_the_collator_does_for_a_longer_batch():
    """A micro-batch padded to its pipeline step's longest sample is the collator's batch with
    that sample beside it, less its row: the loss sees the same tokens."""
    samples = [{"input_ids": [1, 2, 3]}, {"input_ids": [4]}]
    longer = Collator("clm", pad_id=7)(samples + [{"input_ids": [5] * 6}])
    padded = pad_to_length(Collator("clm", pad_id=7)(samples), 6, pad_id=7)
    assert padded.keys() == longer.keys()
    for key in padded:
        assert torch.equal(padded[key], longer[key][:2]), key
    pairs = [{"input_ids": [1], "labels": 1}, {"input_ids": [2, 3], "labels": 0}]
    c = pad_to_length(Collator("classification", 0)(pairs), 4)
    assert c["labels"].tolist() == [1, 0] and c["attention_mask"].tolist() == [[1, 0, 0, 0], [1, 1, 0, 0]]
    packed = {"input_ids": torch.tensor([[1, 2]]), "position_ids": torch.tensor([[0, 1]])}
    assert pad_to_length(packed, 4)["position_ids"].tolist() == [[0, 1, 2, 3]]
    assert pad_to_length(packed, 2) is packed  # wide enough already
