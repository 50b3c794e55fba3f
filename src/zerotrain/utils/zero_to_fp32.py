"""`deepspeed.utils.zero_to_fp32` under zerotrain's name: the DeepSpeed-named alias of
checkpoint/consolidate.py, for zerotrain's checkpoints of any stage and world size.

    state_dict = get_fp32_state_dict_from_zero_checkpoint("ckpt")           # latest tag
    model = load_state_dict_from_zero_checkpoint(model, "ckpt", tag="global_step10")

As a script: `python -m zerotrain.utils.zero_to_fp32 CKPT_DIR OUTPUT_DIR [--tag T]
[--safe_serialization] [--exclude_frozen_parameters]` (`zerotrain consolidate` streams instead).
"""

from __future__ import annotations

import argparse
import sys

from ..checkpoint.consolidate import (consolidate_checkpoint, convert_zero_checkpoint_to_fp32_state_dict,
                                      load_state_dict_from_zero_checkpoint)
from ..helpers.refusals import missing


def get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag: str | None = None,
                                             exclude_frozen_parameters: bool = False, lazy_mode: bool = False) -> dict:
    """The full fp32 state dict of the checkpoint's model (`tag`: the folder; default: `latest`).
    `lazy_mode` has no effect (the tensors are made at once)."""
    state = consolidate_checkpoint(checkpoint_dir, tag)
    if exclude_frozen_parameters:
        from ..checkpoint.consolidate import _plans

        frozen = set().union(*(plan.all_frozen for plan in _plans(checkpoint_dir, tag)[1]))
        state = {k: v for k, v in state.items() if k not in frozen}
    return state


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zerotrain.utils.zero_to_fp32",
                                     description="write a checkpoint's full fp32 weights to OUTPUT_DIR")
    parser.add_argument("checkpoint_dir")
    parser.add_argument("output_dir")
    parser.add_argument("-t", "--tag", default=None)
    parser.add_argument("--safe_serialization", action="store_true")
    parser.add_argument("--exclude_frozen_parameters", action="store_true")
    args = parser.parse_args(argv)
    path = convert_zero_checkpoint_to_fp32_state_dict(args.checkpoint_dir, args.output_dir, tag=args.tag,
                                                      exclude_frozen_parameters=args.exclude_frozen_parameters,
                                                      safe_serialization=args.safe_serialization)
    print(f"wrote {path}")
    return 0


__all__ = ["get_fp32_state_dict_from_zero_checkpoint", "load_state_dict_from_zero_checkpoint",
           "convert_zero_checkpoint_to_fp32_state_dict"]
__getattr__ = missing(__name__, way="zerotrain.utils.zero_to_fp32 has get_fp32_state_dict_from_zero_checkpoint, "
                                    "load_state_dict_from_zero_checkpoint and convert_zero_checkpoint_to_fp32_state_dict")

if __name__ == "__main__":
    sys.exit(main())
