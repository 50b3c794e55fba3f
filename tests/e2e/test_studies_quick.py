"""The studies (benchmarks/curriculum.py, pld_glue.py, data_efficiency.py) in their --quick mode: a
tiny model and a few steps on the real text, so the scripts keep working; their full runs are
not part of the tests. Also the fixed spike/divergence rules, and that a rerun resumes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def run(script: str, out: Path, *extra: str, timeout: int = 120) -> subprocess.CompletedProcess:
    from e2e_helpers import env

    proc = subprocess.run([sys.executable, str(BENCH / script), "--quick", "--out", str(out), *extra],
                          env=env(out.parent), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_spike_and_divergence_rules():
    sys.path.insert(0, str(BENCH))
    from study_runs import count_events

    # warmup 2: the 9.0 in the warmup is not counted; 2.5 and 2.6 (> 1.2 x 2.0) are one spike of two steps
    assert count_events([5.0, 9.0, 3.0, 2.0, 2.5, 2.6, 1.9, 2.4], 2) == {
        "spikes": 2, "spike_steps": 3, "diverged": False, "diverged_at_step": None}
    assert count_events([5.0, 4.0, 3.0, 5.5, 1.0], 2)["diverged_at_step"] == 4  # above the first loss
    assert count_events([5.0, float("nan")], 5)["diverged_at_step"] == 2  # non-finite, even in warmup


def test_mrpc_like_pairs_are_consistent_renamings_or_other_shapes():
    import random

    sys.path.insert(0, str(BENCH))
    from code_tasks import FIXED, NAME, paraphrase_pairs, skeleton

    funcs = [["total = count(items, 1)", "return items + extra", "if count: print(total)", "x = 0x1f + len(y)"],
             ["for i in range(n): acc += i", "self.value = f'{name}'", "def run(self, job):", "yield job.name"]]
    pairs = paraphrase_pairs(funcs, 60, random.Random(0))
    assert [y for *_, y in pairs] == [1, 0] * 30
    for a, b, y in pairs:
        assert skeleton(a) != a  # a line with something to rename
        if y == 0:
            assert skeleton(a) != skeleton(b)
            continue
        assert b != a and len(b) == len(a) and skeleton(b) == skeleton(a)
        mapping = {}
        for x, z in zip(NAME.findall(a), NAME.findall(b)):
            assert mapping.setdefault(x, z) == z  # one name, one new name, everywhere in the line
            assert (x in FIXED) == (x == z)  # keywords and builtins kept, every other name changed
        assert len(set(mapping.values())) == len(mapping)


def test_curriculum_quick_runs_reports_and_resumes(tmp_path):
    out = tmp_path / "curriculum"
    first = run("curriculum.py", out)
    assert "tokens" in first.stdout and "held out" in first.stdout  # says what it read
    runs = sorted(p.name for p in (out / "runs").glob("*.json"))
    assert "headline-curriculum-s0.json" in runs and "stab-lr2x-b2x-s0-none.json" in runs and len(runs) == 6
    rec = json.loads((out / "runs" / "headline-curriculum-s0.json").read_text())
    assert rec["ds_config"]["token_budget"]["train_tokens"] == rec["token_budget"] == rec["final"]["tokens"]
    assert rec["ds_config"]["curriculum_learning"]["schedule_config"]["difficulty_step"] == 8
    lengths = [s[2] for s in rec["steps"]]  # the seqlen ramp, in multiples of 8, up to the full 64
    assert lengths[0] < 64 and lengths == sorted(lengths) and lengths[-1] == 64 and all(n % 8 == 0 for n in lengths)
    results = (out / "results.md").read_text()
    assert "Headline" in results and "Stability" in results and "the study is complete" in results
    assert (out / "headline.png").stat().st_size > 0
    (out / "runs" / "sweep-lr4e-3-s0.json").unlink()
    again = run("curriculum.py", out)  # resumes: only the missing run is redone
    assert again.stdout.count("[study] wrote") == 1


def test_pld_glue_quick_runs_and_reports(tmp_path):
    out = tmp_path / "pld"
    proc = run("pld_glue.py", out)
    names = {p.stem for p in (out / "runs").glob("*.json")}
    assert {"pretrain-baseline-s0", "pretrain-pld-s0", "ft-random-stsb-s0", "ft-pld-cola-s0"} <= names
    pld = json.loads((out / "runs" / "pretrain-pld-s0.json").read_text())
    assert pld["ds_config"]["optimizer"]["params"]["bias_correction"] is True
    assert pld["ds_config"]["progressive_layer_drop"]["theta"] == 0.5 and pld["steps"][-1][2] < 1.0
    # PLD's LR schedule is its own, planned for 1.35x the baseline's steps, and ends the arm there at the latest
    base = json.loads((out / "runs" / "pretrain-baseline-s0.json").read_text())
    assert (base["planned_steps"], pld["planned_steps"]) == (6, 8) and len(pld["steps"]) <= 8
    ft = json.loads((out / "runs" / "ft-pld-mrpc-s0.json").read_text())
    assert {"accuracy", "f1", "majority"} <= set(ft["metrics"])
    for folder, first in (("CoLA", "py\t"), ("MRPC", "\ufeffQuality"), ("STS-B", "index\t")):
        assert (out / "glue" / folder / "train.tsv").read_text(encoding="utf-8").startswith(first)
    assert "Pretraining" in proc.stdout and "Fine-tuning" in proc.stdout
    assert (out / "pretraining.png").is_file()


def test_pld_glue_probe_of_unpretrained_pld_shape_is_one_line(tmp_path):
    from e2e_helpers import env

    out = tmp_path / "pld"
    proc = subprocess.run([sys.executable, str(BENCH / "pld_glue.py"), "--quick", "--out", str(out), "--probe-task",
                           "mrpc", "--probe-start", "pld", "--probe-pretrain", "32,4,3"],
                          env=env(tmp_path), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and proc.stderr.strip().count("\n") == 0, proc.stderr[-2000:]
    assert "pretrain-pld-s0-seq32x4-3steps.pt: no PLD weights of this shape" in proc.stderr
    assert not (out / "probes").exists()  # nothing written


def test_data_efficiency_quick_runs_reports_and_resumes(tmp_path):
    out = tmp_path / "de"
    run("data_efficiency.py", out, timeout=300)  # the analyzer, 4 arms and the profile: ~6 s of CPU
    names = {p.stem for p in (out / "runs").glob("*.json")}
    assert names == {"analysis", "ltd-profile", "baseline-s0", "curriculum-s0", "random_ltd-s0", "both-s0"}
    assert (out / "index" / "vocab_rarity" / "vocab_rarity_index_to_sample_percentile_merged.idx").is_file()
    base, cur, ltd, both = (json.loads((out / "runs" / f"{a}-s0.json").read_text())
                            for a in ("baseline", "curriculum", "random_ltd", "both"))
    budget = base["token_budget"]
    assert base["final"]["tokens"] == ltd["final"]["tokens"] == budget  # random-LTD trains every data token
    assert all(budget <= r["final"]["tokens"] < budget + 4 * 64 for r in (cur, both))  # the step that reaches it
    lengths = [s[2] for s in cur["steps"]]  # seqlen_truncate's fixed_root ramp cuts the early batches
    assert lengths[0] < 64 and lengths == sorted(lengths) and lengths[-1] == 64 and len(cur["steps"]) > len(base["steps"])
    metrics = cur["ds_config"]["data_efficiency"]["data_sampling"]["curriculum_learning"]["curriculum_metrics"]
    assert metrics["vocab_rarity"]["difficulty_type"] == "percentile" and "data_routing" not in cur["ds_config"]["data_efficiency"]
    kept = [s[3] for s in ltd["steps"]]  # random-LTD keeps 16 -> 64 of 64 tokens while the data stays whole
    assert kept[0] == 16 and kept[-1] == 64 and {s[2] for s in ltd["steps"]} == {64}
    assert ltd["final"]["layer_tokens"] < ltd["final"]["tokens"]
    assert all(s[3] <= s[2] for s in both["steps"]) and both["steps"][0][3] == 16
    results = (out / "results.md").read_text()
    assert "To the baseline's final held-out loss" in results and "the study is complete" in results
    assert "Where random-LTD's step time goes" in results and (out / "held_out.png").stat().st_size > 0
    (out / "runs" / "ltd-profile.json").unlink()
    again = run("data_efficiency.py", out, timeout=300)  # resumes: only the missing job is redone
    assert again.stdout.count("[study] wrote") == 1
    shutil.rmtree(out / "index")  # a fresh checkout: the committed records, no index files (build/ is not in git)
    listed = run("data_efficiency.py", out, "--list").stdout.splitlines()
    assert listed[0].split()[:2] == ["analysis", "done"] and all(line.split()[1] == "done" for line in listed)
    (out / "runs" / "both-s0.json").unlink()
    again = run("data_efficiency.py", out, timeout=300)  # the race needs the index: made again first
    assert "running the analyzer again" in again.stdout and "runs/analysis.json" not in again.stdout  # job done
    assert (out / "index" / "vocab_rarity" / "vocab_rarity_index_to_sample_percentile_merged.idx").is_file()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
