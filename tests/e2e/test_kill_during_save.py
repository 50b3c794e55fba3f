"""SIGKILL during save_checkpoint: a few trials of harness/kill_during_save.py (run the
script for 20 and more), and a two-kill sequence whose windows are too narrow for random kills."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

from zerotrain.checkpoint.store import CheckpointWriter, load_file, resolve_checkpoint, verify_checkpoint

SCRIPT = Path(__file__).resolve().parents[2] / "harness" / "kill_during_save.py"


def load_script():
    spec = importlib.util.spec_from_file_location("kill_during_save", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up while building the class
    spec.loader.exec_module(module)
    return module


def test_sigkill_during_save_leaves_a_loadable_latest(tmp_path, monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    kds = load_script()
    lines = []
    # a ~1M-param model and the check in this process keep 3 trials at 8-25 s on 2 cores
    summary = kds.run_trials(3, seed=1, embd=128, layers=2, work_dir=tmp_path, say=lines.append,
                             check_in_process=True)
    report = "\n".join(lines + [kds.table(summary, 1, 0, 1)])
    assert not summary.failures, report
    assert summary.trials == 3 and summary.latest_incomplete == 0, report
    assert summary.inside >= 1, report  # each save-aimed kill waits a fraction of a typical save
    assert summary.loads_ok == summary.resumes_ok == summary.corrupt_detected == summary.fallback_ok == 3, report
    assert max(summary.lost) <= 1, report


class Killed(BaseException):
    """Stands for SIGKILL at the point it is raised: no except clause or cleanup handles it."""


def save(folder: Path, value: float, killed_while_writing: bool = False) -> None:
    with CheckpointWriter(folder, "last", is_main=True, barrier=lambda: None) as writer:
        writer.save("model.pt", torch.full((64,), value))
        if killed_while_writing:
            raise Killed
        writer.save("optim.pt", torch.full((64,), value))


def loaded_value(folder: Path) -> float:
    path = resolve_checkpoint(folder)
    verify_checkpoint(path)
    return load_file(path, "model.pt")[0].item()


@pytest.mark.parametrize("second_kill", ["clearing staging", "writing"])
def test_kill_between_the_renames_then_in_the_next_save(tmp_path, monkeypatch, second_kill):
    """Kill 1 cuts the replacement of a tag between its two renames, so its new copy exists only
    as the staging folder; kill 2 hits the next save of that tag. A restart must still find a
    complete copy, and never an older one than it found after kill 1."""
    save(tmp_path, 1.0)
    real_rename, renames = os.rename, []

    def rename(src, dst):
        renames.append(src)
        if len(renames) == 2:  # <tag> -> .<tag>.old happened, .<tag>.staging -> <tag> did not
            raise Killed
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(Killed):
        save(tmp_path, 2.0)
    monkeypatch.setattr(os, "rename", real_rename)
    assert loaded_value(tmp_path) == 2.0

    if second_kill == "clearing staging":
        real_rmtree = shutil.rmtree

        def rmtree(path, ignore_errors=False):
            path = Path(path)
            if (path / "manifest.json").is_file():  # the data files go, the kill comes before the manifest
                for f in path.iterdir():
                    if f.name != "manifest.json":
                        f.unlink()
                raise Killed
            real_rmtree(path, ignore_errors=ignore_errors)

        monkeypatch.setattr(shutil, "rmtree", rmtree)
        try:
            save(tmp_path, 3.0)
        except Killed:
            pass
        monkeypatch.setattr(shutil, "rmtree", real_rmtree)
        assert loaded_value(tmp_path) in (2.0, 3.0)
    else:
        with pytest.raises(Killed):
            save(tmp_path, 3.0, killed_while_writing=True)
        assert loaded_value(tmp_path) == 2.0
