"""Writing safetensors files one tensor at a time.

The format is an 8-byte little-endian header length, a JSON header (each tensor's dtype,
shape and byte range; `__metadata__`), then the tensors' bytes back to back. The header
needs only shapes and dtypes, so a writer can put it down first and then fetch, write and
drop one tensor after another: consolidating a model far larger than memory holds one
parameter at a time. Files are written to a temporary name and renamed, so no partial file
ever has the final name.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from pathlib import Path

import torch

from ..errors import ConfigError

_CODES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
          torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
          torch.bool: "BOOL"}

Entry = tuple[str, tuple, torch.dtype, Callable[[], torch.Tensor]]


def output_file(out) -> Path:
    """OUT is a .safetensors file, or a folder that gets model.safetensors."""
    out = Path(out)
    return out if out.suffix == ".safetensors" else out / "model.safetensors"


def write_safetensors(entries: list[Entry], out, overwrite: bool = False, metadata: dict | None = None) -> Path:
    """(name, shape, dtype, fetch) per tensor, in file order; each fetch() is called once, as
    its bytes are written."""
    target = output_file(out)
    if target.exists() and not overwrite:
        raise ConfigError(f"{target} exists; pass --overwrite to replace it")
    if target.parent.exists() and not target.parent.is_dir():
        raise ConfigError(f"{target.parent} is a file, not a folder")
    target.parent.mkdir(parents=True, exist_ok=True)
    header, offset = {}, 0
    for name, shape, dtype, _ in entries:
        nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        header[name] = {"dtype": _CODES[dtype], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header["__metadata__"] = {"format": "pt", **(metadata or {})}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text)
            for name, shape, dtype, fetch in entries:
                value = fetch().detach().to("cpu", dtype).contiguous()
                if tuple(value.shape) != tuple(shape):
                    raise ValueError(f"{name}: shape {tuple(value.shape)}, the header says {tuple(shape)}")
                f.write(memoryview(value.reshape(-1).view(torch.uint8).numpy()) if value.numel() else b"")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def save_safetensors(tensors: dict[str, torch.Tensor], out, overwrite: bool = False) -> Path:
    """Write `tensors` to OUT. Shared tensors (tied weights) are written once per name, since
    safetensors stores no aliasing; the metadata entry `tied` lists which names were one
    parameter."""
    seen, tied = {}, {}
    for name, t in tensors.items():
        first = seen.setdefault(id(t), name)
        if first != name:
            tied.setdefault(first, []).append(name)
    entries = [(name, tuple(t.shape), t.dtype, lambda t=t: t) for name, t in tensors.items()]
    metadata = {"producer": "zerotrain consolidate", **({"tied": json.dumps(tied)} if tied else {})}
    return write_safetensors(entries, out, overwrite, metadata)
