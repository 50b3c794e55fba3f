"""`zerotrain plot RUN_DIR [--out FILE]`: a PNG of a run's curves (see trainer/report/plot.py)."""

from __future__ import annotations


def add_arguments(parser) -> None:
    parser.add_argument("run_dir", help="output_dir of a `zerotrain train` run (holds metrics.jsonl)")
    parser.add_argument("--out", default=None, help="PNG to write (default: RUN_DIR/plot.png)")


def run(args) -> int:
    from ..trainer.report.plot import plot_run

    print(f"wrote {plot_run(args.run_dir, args.out)}")
    return 0
