"""Megatron's mmap indexed-dataset files, as DeepSpeed's data sampler and analyzer read them.

A dataset is two files sharing a prefix: `<prefix>.bin` holds every row's values back to back,
`<prefix>.idx` says where each row starts:

    .idx  magic  b"MMIDIDX\\x00\\x00"       9 bytes
          version                        uint64 little-endian, 1
          dtype code                     uint8 (table below)
          rows, documents                uint64, uint64
          sizes                          int32[rows]      values per row
          pointers                       int64[rows]      byte offset of each row in .bin
          document index                 int64[documents] first row of each document, then rows
    .bin  row 0's values, row 1's values, ...   (the dtype above, C order)

The curriculum's index files are such datasets: `index_to_sample` (row i: the samples whose
metric is the i-th smallest value), `index_to_metric` (row i: that value, one element) and the
cluster files (one row: the cluster's samples in draw order). The dtype codes are DeepSpeed's
(6-8 are unsigned; Megatron's own table differs there).
"""

from __future__ import annotations

import os
import struct

import numpy as np

from ..errors import DataError

MAGIC = b"MMIDIDX\x00\x00"
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.uint16, 7: np.uint32, 8: np.uint64}
_CODES = {np.dtype(t): c for c, t in DTYPES.items()}


def smallest_index_dtype(max_value: int) -> type:
    """The narrowest unsigned type holding 0..max_value (DeepSpeed picks cluster dtypes this way)."""
    return fit_int_dtype(0, max_value)


def fit_int_dtype(lo: int, hi: int) -> type:
    """The narrowest type DeepSpeed's analyzer stores values in lo..hi with: unsigned when lo
    >= 0 (uint8, uint16, uint32, uint64), else signed (int8 .. int64)."""
    kinds = (np.uint8, np.uint16, np.uint32, np.uint64) if lo >= 0 else (np.int8, np.int16, np.int32, np.int64)
    for t in kinds:
        if np.iinfo(t).min <= lo and hi <= np.iinfo(t).max:
            return t
    return kinds[-1]


def write_indexed(prefix: str, rows, dtype) -> None:
    """Write `rows` (a list of 1-D arrays) as one document of an mmap indexed dataset."""
    rows = [np.asarray(r).reshape(-1) for r in rows]
    flat = np.concatenate(rows) if rows else np.zeros(0, dtype=np.dtype(dtype))
    write_rows(prefix, flat, np.array([r.size for r in rows], dtype=np.int64), dtype)


def write_rows(prefix: str, values: np.ndarray, sizes: np.ndarray, dtype) -> None:
    """Write `values` cut into rows of `sizes` elements (a million rows cost no Python loop)."""
    dtype = np.dtype(dtype)
    if dtype not in _CODES:
        raise DataError(f"{prefix}: dtype {dtype} has no code in the indexed-dataset format "
                        f"(one of {', '.join(str(np.dtype(t)) for t in DTYPES.values())})")
    with open(f"{prefix}.bin", "wb") as f:
        f.write(np.ascontiguousarray(values, dtype=dtype).tobytes(order="C"))
    write_index(prefix, sizes, dtype)


def write_index(prefix: str, sizes: np.ndarray, dtype) -> None:
    """`prefix.idx` for rows of `sizes` elements lying back to back in `prefix.bin` (written
    by the caller, e.g. in pieces too large to hold at once)."""
    dtype = np.dtype(dtype)
    sizes = np.asarray(sizes, dtype=np.int64)
    pointers = np.zeros(len(sizes), dtype=np.int64)
    if len(sizes) > 1:
        pointers[1:] = np.cumsum(sizes[:-1]) * dtype.itemsize
    doc_idx = np.array([0, len(sizes)], dtype=np.int64)
    with open(f"{prefix}.idx", "wb") as f:
        f.write(MAGIC + struct.pack("<Q", 1) + struct.pack("<B", _CODES[dtype]))
        f.write(struct.pack("<QQ", len(sizes), len(doc_idx)))
        f.write(sizes.astype(np.int32).tobytes(order="C") + pointers.tobytes(order="C") + doc_idx.tobytes(order="C"))


class IndexedFile:
    """Read-only view of `<prefix>.idx` / `<prefix>.bin`: `len(f)` rows, `f[i]` a 1-D array
    (a view of the memory map), `f.sizes` the row lengths. `what` names the setting the prefix
    came from, for the one-line errors."""

    def __init__(self, prefix: str, what: str = "index file"):
        self.prefix = prefix
        for suffix in (".idx", ".bin"):
            if not os.path.isfile(prefix + suffix):
                raise DataError(f"{what}: {prefix}{suffix} not found (give the path without .idx/.bin; both "
                                "files are needed)")
        with open(prefix + ".idx", "rb") as f:
            head = f.read(len(MAGIC) + 8 + 1 + 16)
        if len(head) < len(MAGIC) + 25 or head[:len(MAGIC)] != MAGIC:
            raise DataError(f"{what}: {prefix}.idx is not an mmap indexed-dataset index (its header is not "
                            f"{MAGIC!r})")
        version, = struct.unpack_from("<Q", head, len(MAGIC))
        code, = struct.unpack_from("<B", head, len(MAGIC) + 8)
        rows, docs = struct.unpack_from("<QQ", head, len(MAGIC) + 9)
        if version != 1 or code not in DTYPES:
            raise DataError(f"{what}: {prefix}.idx has version {version} and dtype code {code}; this reader "
                            f"knows version 1 and codes {sorted(DTYPES)}")
        self.dtype = np.dtype(DTYPES[code])
        offset = len(head)
        index = np.memmap(prefix + ".idx", mode="r", dtype=np.uint8)
        need = offset + rows * 4 + rows * 8 + docs * 8
        if index.size < need:
            raise DataError(f"{what}: {prefix}.idx is cut short ({index.size} bytes, its header promises {need})")
        self.sizes = np.frombuffer(index, dtype=np.int32, count=rows, offset=offset)
        self.pointers = np.frombuffer(index, dtype=np.int64, count=rows, offset=offset + rows * 4)
        self.doc_idx = np.frombuffer(index, dtype=np.int64, count=docs, offset=offset + rows * 12)
        data_bytes = os.path.getsize(prefix + ".bin")
        end = int(self.pointers[-1]) + int(self.sizes[-1]) * self.dtype.itemsize if rows else 0
        if data_bytes < end:
            raise DataError(f"{what}: {prefix}.bin holds {data_bytes} bytes, its index needs {end}")
        self._data = np.memmap(prefix + ".bin", mode="r", dtype=np.uint8) if data_bytes else np.zeros(0, np.uint8)

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, i: int) -> np.ndarray:
        if not -len(self) <= i < len(self):
            raise IndexError(f"{self.prefix}: row {i} of {len(self)}")
        i %= len(self)
        return np.frombuffer(self._data, dtype=self.dtype, count=int(self.sizes[i]), offset=int(self.pointers[i]))

    def concatenated(self) -> np.ndarray:
        """Every row, in order, as one array (a view when the rows lie back to back, as written)."""
        total = int(self.sizes.sum(dtype=np.int64))
        if total == 0:
            return np.zeros(0, dtype=self.dtype)
        return np.frombuffer(self._data, dtype=self.dtype, count=total, offset=int(self.pointers[0]))
