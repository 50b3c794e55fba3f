"""What each rank of `zerotrain launch` runs (under torchrun): the user's script as `__main__`,
with `--local_rank=<LOCAL_RANK>` before its own arguments unless the launch said
--no_local_rank, and the script's folder first on sys.path, as `python script.py` has it."""

from __future__ import annotations

import os
import runpy
import sys


def main() -> None:
    from ..comm.launch import die_with_launcher

    die_with_launcher()
    script, *args = sys.argv[1:]
    if os.environ.get("ZEROTRAIN_LAUNCH_LOCAL_RANK", "1") == "1":
        args = [f"--local_rank={os.environ.get('LOCAL_RANK', '0')}", *args]
    sys.argv = [script, *args]
    if os.environ.get("ZEROTRAIN_LAUNCH_MODULE") == "1":
        runpy.run_module(script, run_name="__main__", alter_sys=True)
    else:
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
