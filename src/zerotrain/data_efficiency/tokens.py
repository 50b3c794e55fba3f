"""Token datasets the analyzer reads a whole batch of at a time.

The analyzer asks a dataset with `get_batch(indices)` for each batch in one call instead of
item by item, so a million samples cost a few hundred vectorised gathers, not a million
Python calls. Both datasets here give the same batch:

    {"input_ids":      (b, L) token ids, rows shorter than L padded with 0
     "attention_mask": (b, L) bool, True on real tokens
     "length":         (b,)   int64 tokens per row}

    IndexedTokens(prefix)    Megatron's mmap .idx/.bin, one sample per row (data/indexed.py)
    ArrowTokens(dataset)     a HF datasets.Dataset with an input_ids column (what `zerotrain
                             train` tokenizes and caches), read through its Arrow buffers

Item access (`ds[i]`, one row's {"input_ids"}) is there for DataLoader and DeepSpeed's
analyzer, which read item by item.
"""

from __future__ import annotations

import numpy as np

from ..data.indexed import IndexedFile


def padded(flat: np.ndarray, lengths: np.ndarray) -> dict:
    """Ragged rows (back to back in `flat`) as the padded batch above; equal rows are a view."""
    lengths = np.asarray(lengths, dtype=np.int64)
    width = int(lengths.max()) if len(lengths) else 0
    if len(lengths) and (lengths == width).all():
        ids = flat.reshape(len(lengths), width)
        mask = np.ones(ids.shape, dtype=bool)
    else:
        mask = np.arange(width) < lengths[:, None]
        ids = np.zeros((len(lengths), width), dtype=flat.dtype)
        ids[mask] = flat
    return {"input_ids": ids, "attention_mask": mask, "length": lengths}


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The positions start_i .. start_i + length_i - 1 of every row, back to back."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    row_start = np.repeat(starts - np.concatenate(([0], np.cumsum(lengths)[:-1])), lengths)
    return row_start + np.arange(total, dtype=np.int64)


class IndexedTokens:
    """Megatron's mmap indexed dataset of token rows: `prefix.idx` / `prefix.bin`."""

    def __init__(self, prefix: str):
        self.file = IndexedFile(prefix, "token data")
        self.tokens = self.file.concatenated()
        self.starts = (self.file.pointers - int(self.file.pointers[0] if len(self.file) else 0)) \
            // self.file.dtype.itemsize

    def __len__(self) -> int:
        return len(self.file)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": np.array(self.file[i])}

    def get_batch(self, indices) -> dict:
        indices = np.asarray(indices, dtype=np.int64)
        lengths = self.file.sizes[indices].astype(np.int64)
        if len(indices) and (np.diff(indices) == 1).all():  # a contiguous run: one read
            size = self.file.dtype.itemsize
            with open(self.file.prefix + ".bin", "rb") as f:  # a read, not the map: memory stays one batch
                f.seek(int(self.file.pointers[indices[0]]))
                flat = np.frombuffer(f.read(int(lengths.sum()) * size), dtype=self.file.dtype)
            return padded(flat, lengths)
        return padded(self.tokens[_ranges(self.starts[indices], lengths)], lengths)


class ArrowTokens:
    """A HF `datasets.Dataset` (its `column` of token lists), read as Arrow arrays."""

    def __init__(self, dataset, column: str = "input_ids"):
        self.dataset, self.column = dataset.with_format("arrow"), column

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": np.asarray(self.dataset[int(i)].column(self.column)[0].as_py())}

    def get_batch(self, indices) -> dict:
        indices = np.asarray(indices, dtype=np.int64)
        if len(indices) and (np.diff(indices) == 1).all():
            table = self.dataset[int(indices[0]):int(indices[-1]) + 1]
        else:
            table = self.dataset[indices.tolist()]
        rows = table.column(self.column).combine_chunks()
        return padded(rows.flatten().to_numpy(zero_copy_only=False),
                      rows.value_lengths().to_numpy(zero_copy_only=False))
