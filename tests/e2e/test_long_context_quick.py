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
                           "256,2048", "--modes", "on", "--rate-len", "0", "--ds-venv", "none", "--out", str(out)],
                          env=env(tmp_path), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    line = res["longest"]["S2_on"]
    assert [p["length"] for p in line["points"]] == [512, 4096] and all(p["ok"] for p in line["points"])
    assert 0 < line["fixed_mib"] < line["points"][0]["fb_peak_mib"] <= line["step_peak_mib"] <= res["budget_gib"] * 1024
    # the line's crossing of the budget, in whole multiples of 64 x S positions
    crossing = (res["budget_gib"] * 1024 - line["fixed_mib"]) / (line["kib_per_position"] / 1024) * 2
    assert line["longest"] % 128 == 0 and crossing - 128 < line["longest"] <= crossing
    assert "| 2 | on |" in (out / "results.md").read_text()
    assert (out / "longest.png").stat().st_size > 0
