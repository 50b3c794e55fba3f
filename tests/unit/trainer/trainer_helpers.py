"""Helpers for the trainer tests: tiny data files and one-process training runs.

Every run here is in this process with world size 1, a 2-layer, 64-wide model and a few
hundred tokens, so a run takes about a second. The tokenization cache goes to tmp_path.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from zerotrain.trainer import TrainerCallback

WORDS = "the quick brown fox jumps over a lazy dog and the cat runs fast or slow".split()


def lines(n: int, seed: int = 0, lo: int = 3, hi: int = 20) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi))) for _ in range(n)]


def write_text(path: Path, n: int = 300, seed: int = 0) -> Path:
    path.write_text("".join(line + "\n" for line in lines(n, seed)), encoding="utf-8")
    return path


def write_classification(path: Path, n: int = 120, seed: int = 0) -> Path:
    rng = random.Random(seed)
    rows = []
    for text in lines(n, seed, 2, 12):
        label = rng.randint(0, 1)
        rows.append({"text": ("good " if label else "bad ") + text, "label": ["neg", "pos"][label]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def options(tmp_path: Path, **extra) -> dict:
    base = {"model_config": "gpt-tiny", "train_file": str(write_text(tmp_path / "train.txt")),
            "output_dir": str(tmp_path / "out"), "block_size": 32, "per_device_train_batch_size": 4,
            "max_steps": 6, "logging_steps": 1, "learning_rate": 1e-3, "save_strategy": "no",
            "cache_dir": str(tmp_path / "cache"), "disable_tqdm": True, "report_to": "none"}
    base.update(extra)
    return base


def run(values: dict, callbacks=()):
    """Train in this process; returns (results, metrics records)."""
    from zerotrain.trainer.assembly import run as assemble_and_train
    from zerotrain.trainer.plan import Options
    from zerotrain.trainer.report.metrics_log import read_metrics

    parsed = Options.parse(values)
    results = assemble_and_train(parsed, callbacks)
    return results, read_metrics(parsed.training.output_dir)


class Capture(TrainerCallback):
    """A callback that keeps the trainer, to look at the engine after a run."""

    def on_train_end(self, trainer):
        self.trainer = trainer


def train_logged(values: dict) -> dict:
    """Train in this process; the logged steps' losses, gradient norms and sequence lengths, the
    run's results and the trainer itself (for its engine and model)."""
    capture = Capture()
    results, _ = run(values, [capture])
    logged = [r for r in capture.trainer.history if "loss" in r]
    return {"losses": [r["loss"] for r in logged], "norms": [r["grad_norm"] for r in logged],
            "seqlens": [r.get("seqlen") for r in logged], "results": results, "trainer": capture.trainer}
