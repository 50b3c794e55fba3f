import importlib.util
import os
import sys
import types

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
    other package as installed. (The real wandb is a 20 MB download with a service binary.)"""
    fake = FakeWandb()
    real = importlib.util.find_spec
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: object() if name == "wandb"
                        else None if name in ("mlflow", "comet_ml") else real(name, *a))
    return fake
