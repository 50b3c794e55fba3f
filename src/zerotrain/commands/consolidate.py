"""`zerotrain consolidate CKPT_DIR OUT`: full fp32 weights as safetensors from the per-rank
shards of a checkpoint of any ZeRO stage, so a model trained sharded can be used anywhere."""

from __future__ import annotations

from ..checkpoint.consolidate import consolidate_checkpoint, save_safetensors
from ..zero.estimate import human_bytes


def add_arguments(parser) -> None:
    parser.add_argument("ckpt_dir", help="the save_dir given to save_checkpoint (uses 'latest'), or one tag folder")
    parser.add_argument("out", help="output .safetensors file, or a folder that gets model.safetensors")
    parser.add_argument("--tag", default=None, help="checkpoint tag to read (default: the one 'latest' names)")
    parser.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")


def run(args) -> int:
    tensors = consolidate_checkpoint(args.ckpt_dir, tag=args.tag)
    target = save_safetensors(tensors, args.out, overwrite=args.overwrite)
    unique = {id(t): t for t in tensors.values()}.values()
    size = sum(t.numel() * t.element_size() for t in unique)
    print(f"wrote {target}: {len(tensors)} tensors, {sum(t.numel() for t in unique):,} values "
          f"({human_bytes(size)})")
    return 0
