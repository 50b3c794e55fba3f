"""What a run writes for people to read: metrics.jsonl, TensorBoard events, the plot."""

from __future__ import annotations

import pytest
from trainer_helpers import options, run

from zerotrain.trainer.report.tensorboard import read_scalars


def losses(records):
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def test_metrics_go_to_jsonl_and_tensorboard(tmp_path):
    _, recs = run(options(tmp_path, report_to="tensorboard", eval_strategy="steps", eval_steps=3))
    scalars = read_scalars(tmp_path / "out" / "tensorboard")
    assert [(s, pytest.approx(v)) for s, v in scalars["loss"]] == sorted(losses(recs).items())
    assert [s for s, _ in scalars["eval_loss"]] == [3, 6] and "tokens_per_s" in scalars


def test_plot_command_writes_a_png(tmp_path):
    from zerotrain.cli import main

    run(options(tmp_path, eval_strategy="steps", eval_steps=2))
    assert main(["plot", str(tmp_path / "out")]) == 0
    png = tmp_path / "out" / "plot.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
