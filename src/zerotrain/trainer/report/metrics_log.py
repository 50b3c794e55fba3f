"""Where logged numbers go, all written by rank 0: metrics.jsonl (one JSON object per logging
or eval step, always), and the sinks `report_to` names (comma-separated, or HF's list):

    tensorboard   OUTPUT_DIR/tensorboard/ event files (no package needed)
    csv           OUTPUT_DIR/csv/<name>.csv, step,value rows (no package needed)
    wandb         a W&B run: project WANDB_PROJECT (default zerotrain), files under OUTPUT_DIR;
                  WANDB_MODE=offline keeps it on disk                       zerotrain[wandb]
    mlflow        an MLflow run named after OUTPUT_DIR (MLFLOW_TRACKING_URI) zerotrain[mlflow]
    comet_ml      a Comet experiment (COMET_* environment variables)       zerotrain[comet]

A sink whose package is missing is one line naming the extra, checked before anything loads
(`check_report_to`, from preflight). The backends are monitor/backends.py's, the ones the
engine's DeepSpeed monitor blocks write to."""

from __future__ import annotations

import json
import os
from pathlib import Path

METRICS_FILE = "metrics.jsonl"
TB_FOLDER = "tensorboard"
CSV_FOLDER = "csv"
REPORTERS = ("tensorboard", "csv", "wandb", "mlflow", "comet_ml", "none")
_PACKAGES = {"wandb": "wandb", "mlflow": "mlflow", "comet_ml": "comet_ml"}


def report_names(report_to: str) -> list[str]:
    """The sinks of a report_to value ("none" and empty give none); unknown names are errors."""
    from ...errors import ConfigError, did_you_mean

    names = [n.strip() for n in str(report_to).split(",") if n.strip()]
    for name in names:
        if name not in REPORTERS:
            raise ConfigError(f"report_to: {name!r} is not one of {', '.join(REPORTERS)}"
                              f"{did_you_mean(name, REPORTERS)}")
    return [n for n in names if n != "none"]


def check_report_to(report_to: str) -> None:
    """Each sink's package is installed (one line naming the extra when not)."""
    from ...monitor.backends import require

    for name in report_names(report_to):
        if name in _PACKAGES:
            require(_PACKAGES[name], f"report_to {name}")


def _open_sink(name: str, output_dir: Path):
    from ...monitor import backends

    if name == "csv":
        return backends.CSVBackend(output_dir / CSV_FOLDER)
    if name == "wandb":
        return backends.WandbBackend("report_to wandb", project=os.environ.get("WANDB_PROJECT", "zerotrain"),
                                     name=output_dir.name, dir=str(output_dir))
    if name == "mlflow":
        return backends.MLflowBackend("report_to mlflow", run_name=output_dir.name)
    return backends.CometBackend("report_to comet_ml")


class MetricsLog:
    """Rank 0's sinks: one JSON object per line in metrics.jsonl, and those report_to names."""

    def __init__(self, output_dir: Path, report_to: str, resume_step: int | None):
        self.path = output_dir / METRICS_FILE
        kept = []
        if resume_step is not None and self.path.is_file():  # drop what the killed run logged later
            kept = [json.dumps(r) for r in _records(self.path) if r.get("step", 0) <= resume_step]
        self.path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        names = report_names(report_to)
        self.tb = None
        if "tensorboard" in names:
            from ...monitor.tensorboard import EventWriter

            self.tb = EventWriter(output_dir / TB_FOLDER)
        self.sinks = [_open_sink(name, output_dir) for name in names if name != "tensorboard"]

    def write(self, record: dict) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        scalars = {k: v for k, v in record.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("step",)}
        if self.tb is not None:
            self.tb.add_scalars(int(record["step"]), scalars)
        events = [(name, value, int(record["step"])) for name, value in scalars.items()]
        for sink in self.sinks:
            sink.write_events(events)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        for sink in self.sinks:
            sink.close()
        self.sinks = []


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
