"""Stored loss curves: 20 steps of small runs on 2 gloo ranks, checked against files in the repo.

    loss_curves/zero0.json .. zero3.json   tiny GPT on counting sequences, AdamW, clipping 0.5, each ZeRO stage
    loss_curves/curriculum.json            the same at stage 1 with a seqlen curriculum
    loss_curves/pipeline.json              a 2-stage PipelineModule (curriculum, layer drop, tied embedding)

Each file holds the mean loss and the global gradient norm of every step, the environment it
was written in, and a tolerance. Where the test runs in that environment (the pinned torch,
one thread a rank, the same CPU kind) the numbers must be equal to the last bit: the runs are
deterministic there, so any change in the arithmetic (a norm summed in another order, a loss
scaled elsewhere) shows. Elsewhere another CPU's kernels round differently, and the relative
tolerance stored with the file applies (its "why" says how it was chosen).

Regenerate every file after a deliberate change of the arithmetic, then review the diff:

    ZEROTRAIN_WRITE_LOSS_CURVES=1 python -m pytest -q tests/distributed/test_loss_curves.py

(`make loss-curves` runs the same). All runs share one call to the 2-rank pool.
"""

from __future__ import annotations

import json
import math
import os
import platform
from pathlib import Path

import torch

import pipe_scenarios as ps
import scenarios

CURVES = Path(__file__).resolve().parent / "loss_curves"
WRITE = os.environ.get("ZEROTRAIN_WRITE_LOSS_CURVES") == "1"
STEPS, GLOBAL, MICRO = 20, 8, 2  # 2 ranks: 2 micro-batches of 2 a rank per step
PINNED_TORCH = "2.13.0"
# Measured: the five engine runs at 1 process (4 micro-batches, one rank) against 2 ranks
# (the same sums in another order, which is what another CPU's vector kernels do to the last
# bits) differ by at most 1.1e-7 (relative) in a loss and 7.2e-7 in a norm over the 20 steps;
# 2e-5 leaves over 25x room and still catches a changed algorithm (a wrong clip, a lost
# micro-batch or a skipped step move a loss by 1e-3 or more within a few steps).
TOLERANCE = {"rtol": 2e-5, "why": "off the pinned torch, thread count or CPU, kernels round the same sums "
             "differently; 1 process against 2 ranks (the same sums reordered) differs by <= 7.2e-7 relative "
             "over these 20 steps, 2e-5 leaves over 25x room and stays far below an algorithmic change (>= 1e-3)"}
CURRICULUM = {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": 8, "max_difficulty": scenarios.SEQ,
              "schedule_type": "fixed_linear", "schedule_config": {"total_curriculum_step": 10, "difficulty_step": 8}}


def environment() -> dict:
    model = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                  if ln.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() \
        else platform.processor()
    return {"torch": torch.__version__.split("+")[0], "threads": torch.get_num_threads(),
            "cpu": f"{platform.machine()} {model} {torch.backends.cpu.get_cpu_capability()}"}


def counting_batch(step: int, size: int) -> torch.Tensor:
    """Sequences that count up from a random start by a random stride (1-3), so the loss falls
    well below ln(vocabulary) within 20 steps and a changed update shows in every step."""
    g = torch.Generator().manual_seed(2000 + step)
    start = torch.randint(0, scenarios.VOCAB, (size, 1), generator=g)
    stride = torch.randint(1, 4, (size, 1), generator=g)
    return (start + stride * torch.arange(scenarios.SEQ)) % scenarios.VOCAB


def configs() -> dict:
    # clipping at 0.5 acts on most steps (the norms are ~0.5-2), so the norm's arithmetic
    # reaches the parameters
    common = {"gradient_clipping": 0.5, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}}}
    runs = {f"zero{stage}": scenarios.base_config(GLOBAL, MICRO, zero_optimization={"stage": stage}, **common)
            for stage in range(4)}
    runs["curriculum"] = scenarios.base_config(GLOBAL, MICRO, zero_optimization={"stage": 1},
                                               curriculum_learning=CURRICULUM, **common)
    return runs


def all_curves() -> dict:
    """On every rank: each run's per-step losses (this rank's) and global norms, and the environment."""
    out = {name: scenarios.train(cfg, STEPS, GLOBAL, batches=counting_batch) for name, cfg in configs().items()}
    out = {name: {"losses": r["losses"], "norms": r["norms"]} for name, r in out.items()}
    pipe = ps.pipeline_run(ps.config(GLOBAL, MICRO, 0), STEPS)
    out["pipeline"] = {"losses": pipe["losses"], "norms": pipe["norms"]}
    return {"curves": out, "environment": environment()}


def mean_over_ranks(results: list[dict], name: str) -> dict:
    """The mean loss a step over the ranks (each trains its slice; the pipeline's loss is the
    same on both), and the norm (global: the same on every rank)."""
    per_rank = [r["curves"][name] for r in results]
    assert all(p["norms"] == per_rank[0]["norms"] for p in per_rank), f"{name}: ranks disagree on the norm"
    losses = [math.fsum(p["losses"][s] for p in per_rank) / len(per_rank) for s in range(STEPS)]
    return {"losses": losses, "grad_norms": per_rank[0]["norms"]}


def test_loss_curves_match_the_stored_files(world2):
    results = world2.run(all_curves)
    env = results[0]["environment"]
    names = sorted(results[0]["curves"])
    assert names == sorted([*configs(), "pipeline"])
    if WRITE:
        CURVES.mkdir(exist_ok=True)
        for name in names:
            record = {"run": name, "steps": STEPS, "ranks": 2, **mean_over_ranks(results, name),
                      "environment": env, "tolerance": TOLERANCE}
            (CURVES / f"{name}.json").write_text(json.dumps(record, indent=1) + "\n")
    mismatches = []
    for name in names:
        path = CURVES / f"{name}.json"
        assert path.exists(), f"{path} is missing; write it with ZEROTRAIN_WRITE_LOSS_CURVES=1 (this module's docstring)"
        stored = json.loads(path.read_text())
        got = mean_over_ranks(results, name)
        exact = stored["environment"] == env and env["torch"] == PINNED_TORCH and env["threads"] == 1
        for key in ("losses", "grad_norms"):
            for step, (g, w) in enumerate(zip(got[key], stored[key], strict=True)):
                if not (g == w if exact else math.isclose(g, w, rel_tol=stored["tolerance"]["rtol"])):
                    mismatches.append(f"{name} step {step + 1} {key}: {g!r} != stored {w!r}"
                                      + ("" if exact else f" (rtol {stored['tolerance']['rtol']})"))
    assert not mismatches, ("the losses moved from the stored curves (if the arithmetic changed on purpose, "
                            "regenerate: ZEROTRAIN_WRITE_LOSS_CURVES=1 python -m pytest -q "
                            "tests/distributed/test_loss_curves.py):\n" + "\n".join(mismatches[:20]))
