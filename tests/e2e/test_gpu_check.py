"""harness/gpu_check.py runs only where there is a CUDA GPU, which this suite does not need: its
dry run (tiny model, CPU, gloo) keeps the script working on CPU, so that GPU time is
not spent on the script's own bugs. Two of its cases, one with offload (~10 s)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

_SCRIPT = Path(__file__).resolve().parents[2] / "harness" / "gpu_check.py"
_NO_GPU = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # the same on a machine that has one


def test_dry_run_checks_pass(tmp_path):
    proc = subprocess.run([sys.executable, str(_SCRIPT), "--dry-run", "--cases", "s0,s3-offload",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=300, env=_NO_GPU)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all checks passed" in proc.stdout
    results = json.loads((tmp_path / "gpu_check-summary.json").read_text())
    assert [r["case"] for r in results] == ["s0", "s3-offload"]
    for r in results:
        assert r["tokens_per_s"] > 0 and all(ok for _, ok, _ in r["checks"])
    # the offloaded optimizer's state was counted on the host
    assert results[1]["breakdown"]["optimizer_states"]["host"] > 0
    assert results[1]["breakdown"]["optimizer_states"]["device"] == 0


def test_refuses_to_run_without_a_gpu_unless_asked_for_a_dry_run(tmp_path):
    proc = subprocess.run([sys.executable, str(_SCRIPT), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, env=_NO_GPU)
    assert proc.returncode == 2 and "--dry-run" in proc.stderr
