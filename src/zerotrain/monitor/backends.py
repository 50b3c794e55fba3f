"""Where monitored numbers go, one small class per backend, all with DeepSpeed's monitor call:

    write_events([(name, value, step), ...])     e.g. ("Train/Samples/train_loss", 2.31, 1024)
    close()

    csv            one file per event name under the folder: step,value rows (zerotrain's own)
    tensorboard    event files (zerotrain's own writer, monitor/tensorboard.py)
    wandb          wandb.init(...) once, wandb.log({name: value}, step=step)      zerotrain[wandb]
    mlflow         mlflow.start_run() once, mlflow.log_metric(name, value, step)  zerotrain[mlflow]
    comet          comet_ml.start(...) once, experiment.log_metric(name, value, step=step)
                                                                                 zerotrain[comet]

The packages are optional extras: `require` says which extra to install in one line, before
anything is trained. Only rank 0 makes a backend (monitor/feature.py, the trainer's sinks).
"""

from __future__ import annotations

import csv
import importlib
import importlib.util
import re
from pathlib import Path

from ..errors import ConfigError

# package to import -> the extra that installs it
EXTRAS = {"wandb": "wandb", "mlflow": "mlflow", "comet_ml": "comet"}


def require(package: str, what: str) -> None:
    """One line naming the extra when `package` is not installed (`what`: the setting that asks)."""
    if importlib.util.find_spec(package) is None:
        raise ConfigError(f"{what}: the {package} package is not installed; pip install "
                          f"zerotrain[{EXTRAS[package]}] (or pip install {package})")


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


class CSVBackend:
    """One `<event name>.csv` per event (slashes become underscores), rows of step,value."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def write_events(self, events) -> None:
        for name, value, step in events:
            path = self.folder / f"{_safe(name)}.csv"
            new = not path.exists()
            with open(path, "a", newline="", encoding="utf-8") as f:
                out = csv.writer(f)
                if new:
                    out.writerow(["step", name])
                out.writerow([int(step), float(value)])

    def close(self) -> None:
        pass


class TensorBoardBackend:
    def __init__(self, folder: str | Path):
        from .tensorboard import EventWriter

        self.writer = EventWriter(folder)

    def write_events(self, events) -> None:
        for step, scalars in _by_step(events).items():
            self.writer.add_scalars(step, scalars)

    def close(self) -> None:
        self.writer.close()


class WandbBackend:
    def __init__(self, what: str, **init):
        require("wandb", what)
        self.wandb = importlib.import_module("wandb")
        self.run = self.wandb.init(**{k: v for k, v in init.items() if v is not None})

    def write_events(self, events) -> None:
        for step, values in _by_step(events).items():
            self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


class MLflowBackend:
    def __init__(self, what: str, **start):
        require("mlflow", what)
        self.mlflow = importlib.import_module("mlflow")
        self.run = self.mlflow.start_run(**{k: v for k, v in start.items() if v is not None})

    def write_events(self, events) -> None:
        for name, value, step in events:
            self.mlflow.log_metric(_safe(name), float(value), step=int(step))

    def close(self) -> None:
        self.mlflow.end_run()


class CometBackend:
    def __init__(self, what: str, every: int = 1, **start):
        require("comet_ml", what)
        comet_ml = importlib.import_module("comet_ml")
        self.experiment = comet_ml.start(**{k: v for k, v in start.items() if v is not None})
        self.every, self.last = every, None

    def write_events(self, events) -> None:
        for name, value, step in events:
            if self.last is None or step - self.last >= self.every or step == self.last:
                self.experiment.log_metric(name, float(value), step=int(step))
                self.last = step

    def close(self) -> None:
        self.experiment.end()


def _by_step(events) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    for name, value, step in events:
        out.setdefault(int(step), {})[name] = float(value)
    return out
