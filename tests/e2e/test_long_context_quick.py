"""benchmarks/long_context.py in its --quick mode (a tiny LLaMA, 2 sequence-parallel ranks,
two lengths), so the script keeps working; its full run is not part of the tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def test_long_context_quick_measures_the_line_and_reports(tmp_path):
    from e2e_helpers import env

    out = tmp_path / "lc"
    proc = subprocess.run([sys.executable, str(BENCH / "long_context.py"), "--quick", "--sizes", "2", "--locals",
                           "256,2048", "--parts", "on", "--rate-len", "0", "--ds-venv", "none", "--out", str(out)],
                          env=env(tmp_path), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    line = res["longest"]["on"]["S2"]
    assert [p["length"] for p in line["points"]] == [512, 4096] and all(p["ok"] for p in line["points"])
    # a tiny model's peaks at two short lengths can differ by less than the allocator's noise, so
    # the line's arithmetic is checked on fixed numbers below, not on these
    assert all(p["fb_peak_mib"] <= line["step_peak_mib"] for p in line["points"])
    assert line["step_peak_mib"] <= res["budget_gib"] * 1024
    assert "| zerotrain | 2 | on |" in (out / "results.md").read_text()
    assert (out / "longest.png").stat().st_size > 0


def test_the_line_through_two_peaks_and_its_crossing():
    sys.path.insert(0, str(BENCH))
    from long_context import line_through

    # 600 MiB fixed + 0.5 MiB per position of a rank's share, at S = 2: 2062.5 MiB is crossed at
    # (2062.5 - 600) / 0.5 = 2925 positions a rank, 5850 in all, rounded down to 64 x 2 = 128
    points = [{"length": 1024, "fb_peak_mib": 856.0, "peak_mib": 900.0},
              {"length": 4096, "fb_peak_mib": 1624.0, "peak_mib": 1700.0}]
    line = line_through(points, 2, 2062.5)
    assert line["fixed_mib"] == 600.0 and line["kib_per_position"] == 512.0 and line["step_peak_mib"] == 1700.0
    assert line["longest"] == 5760
    flat = [dict(points[0]), dict(points[1], fb_peak_mib=855.0)]
    assert line_through(flat, 2, 2048.0)["longest"] is None  # no growth: no crossing
    assert line_through(points, 2, 1600.0)["longest"] is None  # the step alone is over the budget


def test_the_search_brackets_the_longest_length_within_the_resolution(monkeypatch):
    """The search on a fake trial that fits up to 3000 positions (S = 2: in steps of 128)."""
    sys.path.insert(0, str(BENCH))
    import long_context as lc

    seen = []

    def fake(a, framework, size, length, pieces, steps=1, budget=None):
        seen.append(length)
        if length <= 3000:
            return {"ok": True, "peak_mib": 600 + length / 100, "fb_peak_mib": 590 + length / 100,
                    "times": [length / 1000], "wall_s": 0.0}
        return {"ok": False, "why": "over budget", "phase": "forward/backward", "wall_s": 0.0}

    monkeypatch.setattr(lc, "trial", fake)
    a = type("A", (), {"max_len": 1 << 20, "resolution": 0.125, "memory_steps": 1})()
    found = lc.search(a, "zerotrain", 2, True, 1000, 2.0)
    assert seen[:3] == [896, 1792, 3584]  # snapped to 128, doubled until a failure
    assert found["longest"] <= 3000 < found["first_failed"]
    assert found["first_failed"] - found["longest"] <= found["longest"] / 8
    assert abs(found["tokens_per_s"] - 1000.0) < 1e-6
    # the optimizer step alone over the budget: no length fits, and the search says so at once
    monkeypatch.setattr(lc, "trial", lambda *_, **__: {"ok": False, "why": "over budget", "phase": "step",
                                                       "wall_s": 0.0})
    found = lc.search(a, "zerotrain", 1, True, 2048, 2.0)
    assert found["longest"] is None and "step" in found["error"] and len(found["trials"]) == 1
