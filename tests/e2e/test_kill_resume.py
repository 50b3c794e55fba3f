"""One trial of harness/kill_resume.py in CI: ZeRO-3 with curriculum, layer drop and
dropout, SIGKILLed mid-run, resumed, and bit-identical to the uninterrupted run (~40 s).

The script repeats this for many kill points and stages; here the kill step is fixed inside
the curriculum's ramp and the first epoch, so the resume has the most state to get right.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_SCRIPT = Path(__file__).resolve().parents[2] / "harness" / "kill_resume.py"


def _load_script():
    """harness/ is not a package: load the file as a module (registered, for dataclasses)."""
    spec = importlib.util.spec_from_file_location("kill_resume", _SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


kr = _load_script()


def test_killed_zero3_run_with_curriculum_and_pld_resumes_bit_identical(tmp_path):
    kr.prepare(tmp_path)
    reference = kr.reference_run(tmp_path, stage=3)
    seqlens = [r["seqlen"] for r in reference]
    assert seqlens[0] < seqlens[7] < seqlens[-1] and reference[7]["pld_theta"] < 1.0  # both features act by then

    t = kr.trial(tmp_path, kr.Trial(stage=3, kill_step=7, jitter=0.5), reference, "cut")
    assert t.matched, t.problem
    assert kr.SAVE_STEPS <= t.resumed_from <= t.killed_at < kr.MAX_STEPS
    merged = kr.records(tmp_path / "cut")
    assert [r["loss"] for r in merged] == [r["loss"] for r in reference]
