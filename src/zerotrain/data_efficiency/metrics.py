"""The analyzer's built-in metrics, as Megatron-DeepSpeed's data-efficiency examples define them.

    seqlen               tokens per sample: the batch's "length", else its mask's count, else
                         the row width (every token counts)
    total_vocab_freq     accumulated over the dataset: how often each token id occurs
    vocab_rarity         per sample: the sum over its tokens of -log p(token), p = the token's
                         share of total_vocab_freq (ids never seen count once, so no log 0),
                         truncated to an integer
    seqlen_vocab_rarity  seqlen * 10^k + vocab_rarity, with 10^k above the largest possible
                         rarity, so samples order by length first and rarity second

A batch is a 2-D array or tensor of token ids, or a dict holding one under "input_ids" (HF) or
"text" (Megatron), with an optional mask under "attention_mask" or "padding_mask": masked
positions are neither counted nor summed. Each function works on the whole batch at once
(numpy), and returns int64 values, the dtype to give the analyzer as metric_dtypes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from ..data.indexed import IndexedFile
from ..errors import DataError


def _array(x) -> np.ndarray:
    return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)


def tokens_and_mask(batch) -> tuple[np.ndarray, np.ndarray | None]:
    """(b, L) token ids and the (b, L) bool mask of real tokens (None: every token is real)."""
    mask = None
    if isinstance(batch, Mapping):
        key = next((k for k in ("input_ids", "text") if k in batch), None)
        if key is None:
            raise DataError(f"metric: the batch has keys {sorted(batch)}; the built-in metrics read token ids "
                            "from 'input_ids' or 'text'")
        ids = _array(batch[key])
        found = next((k for k in ("attention_mask", "padding_mask") if k in batch), None)
        mask = None if found is None else _array(batch[found]).astype(bool)
    else:
        ids = _array(batch)
    if ids.ndim != 2:
        raise DataError(f"metric: token ids should be a (batch, length) array, got shape {ids.shape}")
    if mask is not None and mask.all():
        mask = None
    return ids, mask


def seqlen(batch) -> np.ndarray:
    if isinstance(batch, Mapping) and "length" in batch:
        return _array(batch["length"]).astype(np.int64).reshape(-1)
    ids, mask = tokens_and_mask(batch)
    return mask.sum(axis=1, dtype=np.int64) if mask is not None else np.full(len(ids), ids.shape[1], np.int64)


def total_vocab_freq(vocab_size: int):
    """The accumulate metric: token counts, a vector of vocab_size (equal in every batch)."""

    def count(batch) -> np.ndarray:
        ids, mask = tokens_and_mask(batch)
        ids = ids[mask] if mask is not None else ids.reshape(-1)
        if ids.size and int(ids.max()) >= vocab_size:
            raise DataError(f"total_vocab_freq: token id {int(ids.max())} is outside the vocabulary of {vocab_size}; "
                            "give the tokenizer's full size (len(tokenizer))")
        return np.bincount(ids.astype(np.int64, copy=False), minlength=vocab_size).astype(np.int64)

    return count


def rarity_table(freq) -> np.ndarray:
    """-log p(token) per token id, from total_vocab_freq's counts (a zero count counts as one)."""
    freq = np.asarray(freq, dtype=np.float64).copy()
    freq[freq == 0] = 1
    return -np.log(freq / freq.sum())


def read_vocab_freq(save_path: str, name: str = "total_vocab_freq") -> np.ndarray:
    """The counts the analyzer wrote for metric `name` under save_path."""
    return np.array(IndexedFile(f"{save_path}/{name}/{name}_metric_value", f"{name} (run it first)")[0])


def _rarity_sums(table: np.ndarray, batch) -> np.ndarray:
    ids, mask = tokens_and_mask(batch)
    if ids.size and int(ids.max()) >= len(table):
        raise DataError(f"vocab_rarity: token id {int(ids.max())} has no frequency (the counts cover {len(table)} "
                        "ids); count total_vocab_freq with the same tokenizer")
    per_token = table[ids]
    if mask is not None:
        per_token = np.where(mask, per_token, 0.0)
    return per_token.sum(axis=1)


def vocab_rarity(freq):
    """The per-sample metric over token counts `freq` (total_vocab_freq's values)."""
    table = rarity_table(freq)
    return lambda batch: _rarity_sums(table, batch).astype(np.int64)


def seqlen_vocab_rarity(freq, seq_length: int):
    """Length first, rarity second: seqlen * coeff + vocab_rarity, coeff a power of ten above
    seq_length times the rarest token's -log p."""
    table = rarity_table(freq)
    coeff = 10 ** (math.ceil(math.log10(seq_length * float(table.max()))) + 1)
    return lambda batch: seqlen(batch) * coeff + _rarity_sums(table, batch).astype(np.int64)
