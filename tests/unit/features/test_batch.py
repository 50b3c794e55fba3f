"""Finding and cutting the token tensor of a forward call (features/batch.py)."""

from __future__ import annotations

import torch
from transformers import BatchEncoding

from zerotrain.features.batch import cut_sequences, find_sequence


def test_input_ids_by_name_wins_over_other_token_tensors():
    ids, other = torch.zeros(2, 8, dtype=torch.long), torch.ones(2, 5, dtype=torch.long)
    assert find_sequence((other,), {"input_ids": ids}) is ids
    assert find_sequence(({"other": other, "input_ids": ids},), {}) is ids
    assert find_sequence(({"nested": {"ids": other}},), {}) is other  # dicts inside dicts are searched


def test_only_tensors_of_the_full_length_are_cut_and_dict_types_are_kept():
    ids, scores, flat = torch.zeros(2, 16, dtype=torch.long), torch.ones(2, 12), torch.ones(16)
    batch = BatchEncoding({"input_ids": ids, "scores": scores})
    (out,), kw = cut_sequences((batch,), {"flat": flat, "labels": ids}, 16, 8)
    assert type(out) is BatchEncoding and out["input_ids"].shape == (2, 8) and out["scores"] is scores
    assert kw["flat"] is flat and kw["labels"].shape == (2, 8)


def test_a_cut_to_the_full_length_copies_nothing():
    ids = torch.zeros(2, 16, dtype=torch.long)
    args, kwargs = (ids,), {"labels": ids}
    assert cut_sequences(args, kwargs, 16, 16) == (args, kwargs)
    out_args, out_kwargs = cut_sequences(args, kwargs, 16, 16)
    assert out_args is args and out_kwargs is kwargs
