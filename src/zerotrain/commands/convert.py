"""`zerotrain convert --to deepspeed-universal CKPT_DIR DST`: a zerotrain checkpoint of any ZeRO
stage and data-parallel size as a DeepSpeed universal checkpoint folder, which DeepSpeed resumes
with `"checkpoint": {"load_universal": true}` (optimizer state and step included), so trying
zerotrain is never a one-way door. One parameter's states are held at a time.
(`zerotrain consolidate` writes the weights alone, as safetensors.)"""

from __future__ import annotations

from ..checkpoint.universal_out import write_universal

TARGETS = ("deepspeed-universal",)


def add_arguments(parser) -> None:
    parser.add_argument("--to", required=True, choices=TARGETS, help="the format to write")
    parser.add_argument("ckpt_dir", help="the save_dir given to save_checkpoint (uses 'latest'), or one tag folder")
    parser.add_argument("dst", help="the universal folder to write (e.g. ds_ckpts/global_step100_universal); "
                                    "'latest_universal' beside it names it, as DeepSpeed's ds_to_universal does")
    parser.add_argument("--tag", default=None, help="checkpoint tag to read (default: the one 'latest' names)")
    parser.add_argument("--overwrite", action="store_true", help="replace DST if it exists")


def run(args) -> int:
    out = write_universal(args.ckpt_dir, args.dst, tag=args.tag, overwrite=args.overwrite)
    print(f"wrote {out['folder']}: {out['parameters']} parameters, {out['values']:,} values, states "
          f"{', '.join(['fp32', *out['states']])}; DeepSpeed resumes it with \"checkpoint\": "
          f"{{\"load_universal\": true}} and load_checkpoint('{out['folder'].parent}')")
    print(f"not carried over: {'; '.join(out['not_carried'])}")
    return 0
