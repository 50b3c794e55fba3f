"""`zerotrain consolidate CKPT_DIR OUT`: full fp32 weights as safetensors from the per-rank
shards of a checkpoint of any ZeRO stage, so a model trained sharded can be used anywhere.
It streams: one parameter is put together, written and dropped at a time, so a model far
larger than memory consolidates (pieces in swap-file copies are read where each sits)."""

from __future__ import annotations

import torch

from ..checkpoint.consolidate import consolidated_entries
from ..checkpoint.safetensors_out import write_safetensors
from ..zero.estimate import human_bytes


def add_arguments(parser) -> None:
    parser.add_argument("ckpt_dir", help="the save_dir given to save_checkpoint (uses 'latest'), or one tag folder")
    parser.add_argument("out", help="output .safetensors file, or a folder that gets model.safetensors")
    parser.add_argument("--tag", default=None, help="checkpoint tag to read (default: the one 'latest' names)")
    parser.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")


def run(args) -> int:
    entries = consolidated_entries(args.ckpt_dir, tag=args.tag)
    target = write_safetensors(entries, args.out, overwrite=args.overwrite,
                               metadata={"producer": "zerotrain consolidate"})
    values = sum(torch.Size(shape).numel() for _, shape, _, _ in entries)
    size = sum(torch.Size(shape).numel() * torch.empty((), dtype=dt).element_size() for _, shape, dt, _ in entries)
    print(f"wrote {target}: {len(entries)} tensors, {values:,} values ({human_bytes(size)})")
    return 0
