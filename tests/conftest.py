import importlib.util
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

# One intra-op thread per process: on 2 cores, more threads only slow every rank down.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)


class FakeWandb(types.ModuleType):
    """wandb's call shape: init(**kwargs) -> run; run.log(dict, step=); run.finish()."""

    def __init__(self):
        super().__init__("wandb")
        self.inits, self.logged, self.finished = [], [], 0

    def init(self, **kwargs):
        self.inits.append(kwargs)
        return types.SimpleNamespace(log=lambda values, step: self.logged.append((step, dict(values))),
                                     finish=lambda: setattr(self, "finished", self.finished + 1))


@pytest.fixture
def fake_wandb(monkeypatch):
    """A stand-in `wandb` module that records its calls; mlflow and comet_ml look absent, every
    other package as installed. (`offline_wandb` runs the real package.)"""
    fake = FakeWandb()
    real = importlib.util.find_spec
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: object() if name == "wandb"
                        else None if name in ("mlflow", "comet_ml") else real(name, *a))
    return fake


class OfflineWandb:
    """Reads back the offline runs wandb wrote: wandb's own reader of a run's .wandb file,
    `wandb leet inspect --json`, prints one JSON object per record (run, history, summary, exit...)."""

    def __init__(self, home: Path):
        self.home = home  # WANDB_DIR

    def records(self, folder: Path | None = None) -> list[dict]:
        """The records of the one offline run under `folder` (default WANDB_DIR)."""
        found = list((folder or self.home).glob("wandb/offline-run-*/run-*.wandb"))
        assert len(found) == 1, f"{folder or self.home}: not one offline run file: {found}"
        run_file = found[0]
        done = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(run_file)],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]

    @staticmethod
    def of_type(records: list[dict], kind: str) -> list[dict]:
        """The records of one kind: "run" (project, run_group, display_name), "history", "exit" (on finish)..."""
        return [r[kind] for r in records if r["type"] == kind]

    @staticmethod
    def history(records: list[dict]) -> list[tuple[int, dict]]:
        """(step, {name: value}) per run.log call, in order."""
        return [(int(h["step"]["num"]), h["item"]) for h in OfflineWandb.of_type(records, "history")]


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    """The real wandb package in offline mode (skipped where it is not installed; the test extra
    installs it): no server, no login, quiet, its run, config and cache folders under tmp_path."""
    pytest.importorskip("wandb")
    home = tmp_path / "wandb_home"
    for name in [n for n in os.environ if n.startswith("WANDB_")]:
        monkeypatch.delenv(name)
    for name, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true",
                        "WANDB_CONSOLE": "off",             # leaves pytest's captured stdout alone
                        "WANDB_X_DISABLE_STATS": "true",    # no system-metrics sampler
                        "WANDB_DISABLE_GIT": "true", "WANDB_DISABLE_CODE": "true",
                        "WANDB_DIR": str(home), "WANDB_CONFIG_DIR": str(home / "config"),
                        "WANDB_CACHE_DIR": str(home / "cache"), "WANDB_DATA_DIR": str(home / "data")}.items():
        monkeypatch.setenv(name, value)
    yield OfflineWandb(home)
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.run.finish()  # a run a failed test left open would be the next test's wandb.init
