"""Checkpoint tensors that live in files, saved and loaded file to file.

ZeRO-Infinity keeps fp32 masters, optimizer state and stage-3 parameter shards in swap
files (zero/offload/nvme_swap.FileStore); a 3B-parameter model holds tens of GB there per rank.
A state dict may hold such a FileStore where a tensor would be: saving copies its bytes into
the checkpoint folder beside the .pt file (by the kernel, never through this process's
memory) and leaves a small marker in the .pt; loading turns the marker into a `RawTensor`,
which reads only the ranges asked of it (consolidate takes a parameter at a time; a swap
file is refilled by a file copy). The copied files are covered by the manifest like the rest.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from ..zero.offload.nvme_swap import FileStore, Ranged

RAW_KEY = "__zerotrain_raw__"
_DTYPES = {str(t): t for t in (torch.float32, torch.float16, torch.bfloat16, torch.float64)}


class RawTensor:
    """A flat tensor in a checkpoint file, read by ranges: `t[lo:hi]`, `t.load()`."""

    def __init__(self, path: Path, numel: int, dtype: torch.dtype):
        self.path, self._numel, self.dtype = Path(path), int(numel), dtype
        self.itemsize = torch.empty((), dtype=dtype).element_size()

    def numel(self) -> int:
        return self._numel

    def __getitem__(self, index: slice) -> torch.Tensor:
        lo, hi, _ = index.indices(self._numel)
        out = torch.empty(max(0, hi - lo), dtype=self.dtype)
        if out.numel():
            with open(self.path, "rb") as f:
                view = memoryview(out.view(torch.uint8).numpy())
                got = os.preadv(f.fileno(), [view], lo * self.itemsize)
                if got != len(view):
                    raise OSError(f"{self.path}: short read ({got} of {len(view)} bytes)")
        return out

    def load(self) -> torch.Tensor:
        return self[0 : self._numel]


def externalize(obj: Any, folder: Path, stem: str) -> Any:
    """`obj` with each FileStore inside it copied to `folder/<stem>.<n>.bin` and replaced by a marker."""
    count = [0]

    def walk(node):
        if isinstance(node, FileStore):
            name = f"{stem}.{count[0]}.bin"
            count[0] += 1
            node.copy_to(folder / name)
            return {RAW_KEY: name, "numel": node.numel, "dtype": str(node.dtype)}
        if isinstance(node, dict):
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, (list, tuple)):
            return type(node)(walk(v) for v in node)
        return node

    return walk(obj)


def internalize(obj: Any, folder: Path) -> Any:
    """The reverse: each marker becomes a RawTensor over its file in `folder`."""
    if isinstance(obj, dict):
        if RAW_KEY in obj:
            name = obj[RAW_KEY]
            if not isinstance(name, str) or "/" in name or name.startswith("."):
                raise ValueError(f"bad raw file name {name!r}")
            return RawTensor(Path(folder) / name, obj["numel"], _DTYPES[obj["dtype"]])
        return {k: internalize(v, folder) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(internalize(v, folder) for v in obj)
    return obj


def in_memory(obj: Any) -> Any:
    """`obj` with each value read by ranges (a RawTensor, a resharded piece) read whole into
    memory: for torch's optimizer, which keeps its state there."""
    if isinstance(obj, Ranged) and not torch.is_tensor(obj):
        return obj.load()
    if isinstance(obj, dict):
        return {k: in_memory(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(in_memory(v) for v in obj)
    return obj
