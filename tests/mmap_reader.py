"""An independent reader of Megatron's mmap indexed-dataset format (struct and numpy, written
from the format's description, not zerotrain's data/indexed.py), and the files DeepSpeed's
data analyzer writes for given per-sample values, derived by brute force."""

from __future__ import annotations

import struct

import numpy as np

CODES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.uint16, 7: np.uint32, 8: np.uint64}


def read_mmap(prefix: str) -> tuple[np.dtype, list[list[int]]]:
    head = open(prefix + ".idx", "rb").read()
    assert head[:9] == b"MMIDIDX\x00\x00"
    version, code, rows, docs = struct.unpack_from("<QBQQ", head, 9)
    assert version == 1
    dtype = np.dtype(CODES[code])
    sizes = np.frombuffer(head, np.int32, rows, 34)
    pointers = np.frombuffer(head, np.int64, rows, 34 + 4 * rows)
    assert len(head) == 34 + 12 * rows + 8 * docs
    data = open(prefix + ".bin", "rb").read()
    out = [np.frombuffer(data, dtype, int(n), int(p)).tolist() for n, p in zip(sizes, pointers)]
    assert sum(sizes) * dtype.itemsize == len(data)
    return dtype, out


def narrowest(lo: int, hi: int):
    if lo >= 0:
        return next(t for t, top in ((np.uint8, 255), (np.uint16, 65535), (np.uint32, 2 ** 32 - 1)) if hi <= top)
    return next(t for t, top in ((np.int8, 127), (np.int16, 32767), (np.int32, 2 ** 31 - 1))
                if -top - 1 <= lo and hi <= top)


def expected_files(values: list[int], order: list[int] | None = None) -> dict:
    """values[i]: sample i's value; order: the sample ids in map order (default 0..N-1)."""
    order = order if order is not None else list(range(len(values)))
    vdt, sdt = np.dtype(narrowest(min(values), max(values))), np.dtype(narrowest(0, len(values) - 1))
    levels = sorted(set(values))
    i2s = [[s for s in order if values[s] == v] for v in levels]
    step = max(1, len(levels) // 100)
    merged = [sum(i2s[j:j + step], []) for j in range(0, len(levels), step)]
    return {"sample_to_metric": (vdt, [[v] for v in values]), "index_to_metric": (vdt, [[v] for v in levels]),
            "index_to_sample": (sdt, i2s), "index_to_sample_percentile_merged": (sdt, merged)}
