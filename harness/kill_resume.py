"""Exact resume under SIGKILL: a killed and resumed `zerotrain train` run must log the same
losses, bit for bit, as a run that was never interrupted.

    python harness/kill_resume.py --trials 3 --stages 0 2 3 [--seed S] [--fp16] [--keep DIR]

Per ZeRO stage: one uninterrupted reference run, then N trials. A trial launches the same
job, SIGKILLs all of it once a step drawn uniformly from [save_steps, max_steps) has been
logged and a checkpoint exists (a random fraction of a step later, so the kill lands
anywhere in the next step, checkpoint writes included), resumes it with the same command
plus `--resume_from_checkpoint latest`, and compares metrics.jsonl with the reference's.
"All of it" is the launcher's process group and each rank's: torch elastic starts every
rank in a session of its own, so killing the launcher's group alone leaves the ranks running.

The run is built so that the resumable state shows in the losses:

    2 ranks, fp32, CPU      ZeRO stage 0 / 2 / 3 (stage 3 shards every parameter)
    dropout 0.1             torch RNG of each rank (each draws its own masks)
    PLD theta 0.5           theta(t); the block masks are keyed by the step
    curriculum 16 -> 64     seqlen grows until step 12
    12 steps per epoch      sampler epoch and position inside the epoch (24 steps: 2 epochs)
    warmup + linear decay   LR scheduler; AdamW moments; weight decay groups
    --fp16                  dynamic loss scaler whose scale doubles every 4 steps

A step matches when loss, lr, grad_norm, seqlen, pld_theta, loss_scale, tokens and epoch are
all equal (floats as JSON writes them: repr, so exact). The steps the killed run logged
before it died are checked as well: if those differ, the runs are not deterministic to begin
with and the resume is not to blame. Not visible in the losses: the python and numpy RNGs
(nothing in a clm run draws from them) and the curriculum's stored difficulty (fixed_linear
recomputes it from the step).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from common import kill_job  # noqa: E402

MAX_STEPS, SAVE_STEPS = 24, 3
FIELDS = ("loss", "lr", "grad_norm", "seqlen", "pld_theta", "loss_scale", "tokens", "epoch")
WORDS = ("def class return import self if else for in while print value data list dict none true "
         "false yield lambda with as try except raise pass break").split()
MODEL = {"zerotrain_model": "gpt", "n_embd": 32, "n_layer": 4, "n_head": 2, "n_positions": 64, "dropout": 0.1}
ARGS = ["--model_config", "model.json", "--train_file", "train.txt", "--cache_dir", "cache",
        "--validation_split_percentage", "0", "--block_size", "64", "--per_device_train_batch_size", "4",
        "--max_steps", str(MAX_STEPS), "--save_steps", str(SAVE_STEPS), "--save_total_limit", "2",
        "--learning_rate", "3e-3", "--warmup_steps", "4", "--weight_decay", "0.01", "--logging_steps", "1",
        "--report_to", "none", "--disable_tqdm", "--seed", "1234"]


def ds_config(stage: int, fp16: bool = False) -> dict:
    zero = {"stage": stage}
    if stage == 3:
        zero["stage3_param_persistence_threshold"] = 0  # shard every parameter, however small
    # a short window: the scale doubles every 4 clean steps, so the scaler has state to lose
    half = {"fp16": {"enabled": "auto", "initial_scale_power": 8, "loss_scale_window": 4, "hysteresis": 2,
                     "min_loss_scale": 1}} if fp16 else {}
    return {**half, "zero_optimization": zero, "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": "auto",
            "curriculum_learning": {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": 16,
                                    "max_difficulty": "auto", "schedule_type": "fixed_linear",
                                    "schedule_config": {"total_curriculum_step": 12, "difficulty_step": 8}},
            "progressive_layer_drop": {"enabled": True, "theta": 0.5, "gamma": 0.05}}


def prepare(work: Path, fp16: bool = False) -> Path:
    """Training text (~6 KB: 96 blocks of 64 bytes, 12 steps of 2 ranks x 4 per epoch) and the model."""
    work.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 14))) for _ in range(143)]
    (work / "train.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (work / "model.json").write_text(json.dumps(MODEL), encoding="utf-8")
    for stage in (0, 1, 2, 3):
        (work / f"ds{stage}.json").write_text(json.dumps(ds_config(stage, fp16)), encoding="utf-8")
    return work


def command(stage: int, out: str, resume: bool = False, fp16: bool = False) -> list[str]:
    cmd = [sys.executable, "-m", "zerotrain", "train", "--nproc_per_node", "2", "--output_dir", out,
           "--deepspeed", f"ds{stage}.json", *ARGS]
    return cmd + (["--fp16"] if fp16 else []) + (["--resume_from_checkpoint", "latest"] if resume else [])


def _env(work: Path) -> dict:
    # torchrun's variables would make the launcher think it is a rank already
    drop = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "ZEROTRAIN_ERROR_DIR")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", XDG_CACHE_HOME=str(work / "xdg"))
    return env


def run(work: Path, cmd: list[str], timeout: int = 600) -> str:
    """Run to the end; its stdout (a failure raises with the output's tail)."""
    proc = subprocess.run(cmd, cwd=work, env=_env(work), capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        what = " ".join(cmd[2:8]) + (" (resumed)" if "--resume_from_checkpoint" in cmd else "")
        raise RuntimeError(f"{what}: exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout


def records(run_dir: Path) -> list[dict]:
    """Training records of metrics.jsonl (a line torn by the kill is skipped)."""
    from zerotrain.trainer.report.metrics_log import read_metrics

    return [r for r in read_metrics(run_dir) if "loss" in r] if (run_dir / "metrics.jsonl").is_file() else []


def _last_step(run_dir: Path) -> int:
    try:
        text = (run_dir / "metrics.jsonl").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return 0
    steps = [int(m) for m in re.findall(r'^\{"step": (\d+)', text, re.M)]
    return max(steps, default=0)


def kill_at(work: Path, cmd: list[str], out: Path, step: int, jitter: float = 0.0, timeout: float = 300) -> bool:
    """Launch, and SIGKILL the whole job once `step` is logged and a checkpoint is complete,
    `jitter` (0..1) of a step's time later, so the kill lands anywhere in the next step: in
    forward, backward, the optimizer step or a checkpoint write. False if the job ended (or
    timed out) first."""
    job = subprocess.Popen(cmd, cwd=work, env=_env(work), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)
    deadline = time.time() + timeout
    seen, seen_at, interval = 0, time.time(), 0.05
    try:
        while job.poll() is None and time.time() < deadline:
            last = _last_step(out)
            if last > seen:
                now = time.time()
                if seen:
                    interval = (now - seen_at) / (last - seen)
                seen, seen_at = last, now
            if last >= step and (out / "latest").is_file():
                time.sleep(jitter * interval)
                break
            time.sleep(0.005)
        killed = job.poll() is None and time.time() < deadline
    finally:
        if job.poll() is None:
            kill_job(job.pid)
        job.wait()
    return killed


def first_difference(ref: list[dict], got: list[dict]) -> str | None:
    """None when `got` has the reference's steps with equal FIELDS; else where it first differs."""
    by_step = {r["step"]: r for r in ref}
    for r in got:
        want = by_step.get(r["step"])
        if want is None:
            return f"step {r['step']} is not in the reference"
        for key in FIELDS:
            if r.get(key) != want.get(key):
                return f"step {r['step']} {key}: {r.get(key)!r} != reference {want.get(key)!r}"
    return None


@dataclasses.dataclass
class Trial:
    stage: int
    kill_step: int  # the drawn step; the kill comes `jitter` of a step after it is logged
    jitter: float = 0.0
    killed_at: int = 0  # last step logged before the kill
    resumed_from: int = 0  # the checkpoint's step
    matched: bool = False
    problem: str = ""

    @property
    def lost(self) -> int:
        """Steps the resumed run had to do again."""
        return self.killed_at - self.resumed_from


def trial(work: Path, t: Trial, reference: list[dict], name: str, fp16: bool = False) -> Trial:
    """Kill, resume, compare; fills in `t`."""
    out = work / name
    shutil.rmtree(out, ignore_errors=True)
    if not kill_at(work, command(t.stage, name, fp16=fp16), out, t.kill_step, t.jitter):
        t.problem = f"not killed: the job ended (or timed out) before step {t.kill_step}"
        return t
    before = records(out)
    t.killed_at = max((r["step"] for r in before), default=0)
    problem = first_difference(reference, before)
    if problem:
        t.problem = f"before the kill (the runs are not deterministic): {problem}"
        return t
    try:
        stdout = run(work, command(t.stage, name, resume=True, fp16=fp16))
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        t.problem = f"the resumed run failed: {e}"
        return t
    m = re.search(r"resumed from \S+ at step (\d+)", stdout)
    t.resumed_from = int(m.group(1)) if m else -1
    merged = records(out)
    steps = [r["step"] for r in merged]
    if steps != list(range(1, MAX_STEPS + 1)):
        t.problem = f"logged steps {steps}, expected 1..{MAX_STEPS}"
        return t
    t.problem = first_difference(reference, merged) or ""
    t.matched = not t.problem
    return t


def reference_run(work: Path, stage: int, fp16: bool = False) -> list[dict]:
    name = f"ref{stage}"
    shutil.rmtree(work / name, ignore_errors=True)
    run(work, command(stage, name, fp16=fp16))
    ref = records(work / name)
    if [r["step"] for r in ref] != list(range(1, MAX_STEPS + 1)):
        raise RuntimeError(f"reference run of stage {stage} logged steps {[r['step'] for r in ref]}")
    return ref


def draw_trials(rng: random.Random, stage: int, n: int) -> list[Trial]:
    """Kill steps uniform over [save_steps, max_steps): the first checkpoint exists by then."""
    return [Trial(stage, rng.randrange(SAVE_STEPS, MAX_STEPS), round(rng.random(), 3)) for _ in range(n)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=3, help="kill points per stage")
    p.add_argument("--stages", type=int, nargs="+", default=[0, 2, 3], choices=[0, 1, 2, 3])
    p.add_argument("--seed", type=int, default=None, help="seed of the kill points (default: random, printed)")
    p.add_argument("--fp16", action="store_true", help="train in fp16 (dynamic loss scaler) instead of fp32")
    p.add_argument("--keep", default=None, help="work folder to keep (default: a temporary one, removed)")
    a = p.parse_args(argv)
    seed = a.seed if a.seed is not None else random.randrange(2**31)
    rng = random.Random(seed)
    work = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="kill_resume_"))
    prepare(work, a.fp16)
    print(f"kill_resume: seed {seed}, {a.trials} trials per stage, {MAX_STEPS} steps, checkpoint every "
          f"{SAVE_STEPS}, 2 ranks, {'fp16' if a.fp16 else 'fp32'}, curriculum + PLD + dropout, work folder {work}",
          flush=True)
    start, results = time.time(), []
    try:
        for stage in a.stages:
            t0 = time.time()
            ref = reference_run(work, stage, a.fp16)
            done = [trial(work, t, ref, f"s{stage}_t{i}", a.fp16)
                    for i, t in enumerate(draw_trials(rng, stage, a.trials))]
            results += done
            print(f"stage {stage}: matched {sum(t.matched for t in done)}/{len(done)}  "
                  f"kill steps {[t.kill_step for t in done]}  killed at {[t.killed_at for t in done]}  "
                  f"resumed from {[t.resumed_from for t in done]}  steps lost {[t.lost for t in done]}  "
                  f"({time.time() - t0:.0f} s)", flush=True)
            for i, t in enumerate(done):
                if not t.matched:
                    print(f"  trial {i} (kill step {t.kill_step}): {t.problem}", flush=True)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    matched = sum(t.matched for t in results)
    print(f"summary: {matched}/{len(results)} trials bit-identical to the uninterrupted run, stages "
          f"{' '.join(map(str, a.stages))}, seed {seed}, {time.time() - start:.0f} s", flush=True)
    return 0 if matched == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
