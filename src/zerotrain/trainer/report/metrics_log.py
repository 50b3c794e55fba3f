"""Where logged numbers go: metrics.jsonl (one JSON object per logging or eval step, always)
and TensorBoard scalars (report_to tensorboard), both written by rank 0."""

from __future__ import annotations

import json
from pathlib import Path

METRICS_FILE = "metrics.jsonl"
TB_FOLDER = "tensorboard"


class MetricsLog:
    """Rank 0's sinks: one JSON object per line in metrics.jsonl, and TensorBoard scalars."""

    def __init__(self, output_dir: Path, tensorboard: bool, resume_step: int | None):
        self.path = output_dir / METRICS_FILE
        kept = []
        if resume_step is not None and self.path.is_file():  # drop what the killed run logged later
            kept = [json.dumps(r) for r in _records(self.path) if r.get("step", 0) <= resume_step]
        self.path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        self.tb = None
        if tensorboard:
            from .tensorboard import EventWriter

            self.tb = EventWriter(output_dir / TB_FOLDER)

    def write(self, record: dict) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        if self.tb is not None:
            scalars = {k: v for k, v in record.items() if isinstance(v, (int, float)) and k not in ("step",)}
            self.tb.add_scalars(int(record["step"]), scalars)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def write_predictions(output_dir: Path, predictions: list[int], names: list | None) -> Path:
    """predictions.jsonl: one {"index", "label"} per row of the test set, in its order; the
    label as the data spelled it when the classes have names."""
    path = output_dir / "predictions.jsonl"
    lines = [json.dumps({"index": i, "label": names[c] if names else c}) for i, c in enumerate(predictions)]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def read_metrics(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        from ...errors import DataError

        raise DataError(f"{path}: not found; pass the output_dir of a `zerotrain train` run")
    return _records(path)


def _records(path: Path) -> list[dict]:
    """The JSON lines of a metrics file; a line torn by a killed run is skipped."""
    records = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records
