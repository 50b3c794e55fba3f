"""What the two studies share: a fixed list of jobs run in order, each writing its runs' raw
per-step JSON under docs/results/<study>/runs/<run-id>.json the moment it ends; a job whose
files all exist is skipped, so rerunning the command resumes the study. A job being run by
another live process (its `.running` file names the pid) is skipped too, so two shells can
share a study.

Spike and divergence rules, fixed before any run (`count_events`):

    warmup      the run's LR warmup steps; nothing before their end counts
    spike       a training step whose loss is above 1.2 x the lowest training loss seen since
                the warmup ended; consecutive such steps are one spike (`spikes`), and every
                such step is counted too (`spike_steps`)
    divergence  a non-finite training loss at any step, or, after the warmup, a training loss
                above the run's first-step loss (a model back at or past its untrained loss);
                the run stops there, is marked diverged, and its remaining budget is not spent
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable


SPIKE_FACTOR = 1.2


def count_events(losses: list[float], warmup: int) -> dict:
    """Spikes and divergence of a training-loss curve (index = optimizer step - 1)."""
    spikes = spike_steps = 0
    diverged_at = None
    low = math.inf
    inside = False
    first = losses[0] if losses else math.nan
    for k, v in enumerate(losses):
        if not math.isfinite(v):
            diverged_at = k + 1
            break
        if k < warmup:
            continue
        if v > first:
            diverged_at = k + 1
            break
        if v > SPIKE_FACTOR * low:
            spike_steps += 1
            spikes += not inside
            inside = True
        else:
            inside = False
        low = min(low, v)
    return {"spikes": spikes, "spike_steps": spike_steps, "diverged": diverged_at is not None,
            "diverged_at_step": diverged_at}


def diverging(losses: list[float], warmup: int) -> bool:
    """The divergence rule on the newest loss (the runs stop at the first one)."""
    v = losses[-1]
    return not math.isfinite(v) or (len(losses) > warmup and v > losses[0])


def machine() -> dict:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (math.nan,) * 3
    return {"host_cpus": os.cpu_count(), "load_avg_1m": round(load[0], 2), "python": platform.python_version(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S")}


@dataclass
class Job:
    """One unit of work: writes every run id in `runs` (a pair raced in one process, or one run)."""

    name: str
    runs: list[str]
    fn: Callable[[], dict]  # -> {run_id: record}
    note: str = ""
    needs: list[str] = field(default_factory=list)  # run ids that must exist first
    done: Callable[[], bool] | None = None  # an extra condition for "done" (e.g. saved weights still there)

    def finished(self, study: Study) -> bool:
        return all(study.have(r) for r in self.runs) and (self.done is None or self.done())


class Study:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.runs_dir = self.root / "runs"

    def path(self, run_id: str) -> Path:
        return self.runs_dir / f"{run_id}.json"

    def have(self, run_id: str) -> bool:
        return self.path(run_id).is_file()

    def load(self, run_id: str) -> dict | None:
        p = self.path(run_id)
        return json.loads(p.read_text()) if p.is_file() else None

    def all_runs(self) -> dict[str, dict]:
        return {p.stem: json.loads(p.read_text()) for p in sorted(self.runs_dir.glob("*.json"))}

    def _lock(self, job: Job) -> Path | None:
        lock = self.runs_dir / f"{job.name}.running"
        if lock.exists():
            try:
                pid = int(lock.read_text().strip())
                os.kill(pid, 0)
                return None  # another live process runs it
            except (ValueError, ProcessLookupError, PermissionError):
                lock.unlink(missing_ok=True)
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return None
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        return lock

    def status(self, jobs: list[Job]) -> list[tuple[Job, str]]:
        out = []
        for job in jobs:
            done = sum(self.have(r) for r in job.runs)
            state = "done" if job.finished(self) else f"{done}/{len(job.runs)} runs"
            if (self.runs_dir / f"{job.name}.running").exists() and state != "done":
                state += ", running"
            out.append((job, state))
        return out

    def run(self, jobs: list[Job], report: Callable[[], None] | None = None, limit: int | None = None) -> int:
        """Run the jobs not done yet, in order; returns how many ran. A job that waits for runs
        another live process is making is tried again (every 30 s) until that process ends."""
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        ran = 0
        while True:
            blocked = False
            for job in jobs:
                if job.finished(self):
                    continue
                if limit is not None and ran >= limit:
                    return ran
                missing = [r for r in job.needs if not self.have(r)]
                if missing:
                    blocked = True
                    continue
                lock = self._lock(job)
                if lock is None:
                    continue
                try:
                    print(f"[study] {job.name}: {job.note}", flush=True)
                    started = time.perf_counter()
                    self._write(job.fn(), time.perf_counter() - started)
                finally:
                    lock.unlink(missing_ok=True)
                ran += 1
                if report is not None:
                    report()
                break  # start over: an earlier job may have become runnable
            else:
                if not (blocked and self._others_running()):
                    return ran
                time.sleep(30)

    def _others_running(self) -> bool:
        for lock in self.runs_dir.glob("*.running"):
            try:
                os.kill(int(lock.read_text().strip()), 0)
                return True
            except (ValueError, ProcessLookupError, PermissionError, FileNotFoundError):
                continue
        return False

    def _write(self, records: dict, seconds: float) -> None:
        for run_id, record in records.items():
            record.setdefault("id", run_id)
            record["job_wall_s"] = round(seconds, 1)
            record["machine_end"] = machine()
            tmp = self.path(run_id).with_suffix(".tmp")
            tmp.write_text(json.dumps(record, indent=None, separators=(",", ":")))
            tmp.replace(self.path(run_id))
            print(f"[study] wrote {self.path(run_id)}", flush=True)


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def mean(xs: list[float]) -> float:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return sum(xs) / len(xs) if xs else math.nan


def first_reach(evals: list[dict], target: float, key: str) -> float | None:
    """The `key` (tokens, wall_s, ...) at which held-out loss first reaches `target`, linearly
    interpolated between the two evaluations around the crossing; None if it never does."""
    prev = None
    for e in evals:
        if e["val_loss"] <= target:
            if prev is None or prev["val_loss"] == e["val_loss"]:
                return e[key]
            f = (prev["val_loss"] - target) / (prev["val_loss"] - e["val_loss"])
            return prev[key] + f * (e[key] - prev[key])
        prev = e
    return None


def plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    return pyplot


def held_out_plot(path: Path, runs: dict, colors: dict, first_seed: int, tokens_label: str, top: float,
                  title: str) -> None:
    """Held-out loss against tokens trained and against wall-clock, one line per run (the first
    seed solid, the others dashed), as the studies' headline figures draw it."""
    pyplot = plt()
    fig, axes = pyplot.subplots(1, 2, figsize=(12, 4.2))
    for _, r in sorted(runs.items()):
        ls = "-" if r["seed"] == first_seed else "--"
        for ax, key in zip(axes, ("tokens", "wall_s")):
            ax.plot([e[key] for e in r["evals"]], [e["val_loss"] for e in r["evals"]], ls, color=colors[r["arm"]],
                    marker="o", ms=2, label=f"{r['arm']} seed {r['seed']}")
    for ax, label in zip(axes, (tokens_label, "training wall-clock (s, steps only)")):
        ax.set_xlabel(label)
        ax.set_ylabel("held-out loss (nats/byte)")
        ax.set_ylim(top=min(top, ax.get_ylim()[1]))
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    pyplot.close(fig)


def replace_section(page: Path, name: str, text: str) -> None:
    """Put `text` between the page's `<!-- name:begin ... -->` and `<!-- name:end -->` marks (a
    page without them is left as it is)."""
    src = page.read_text()
    begin, end = f"<!-- {name}:begin (written by the study's --report) -->", f"<!-- {name}:end -->"
    if begin in src and end in src:
        head, rest = src.split(begin, 1)
        page.write_text(head + begin + "\n" + text + "\n" + end + rest.split(end, 1)[1])


def finish_report(study: Study, jobs: list[Job], parts: list[str], page: Path | None, section: str,
                  link_plots: bool = False) -> str:
    """The report's common tail: the jobs still to run, the study's plots, results.md beside the
    runs (its links relative to it) and the page's generated section (links from docs/)."""
    todo = [f"`{job.name}` ({state})" for job, state in study.status(jobs) if state != "done"]
    parts.append("Still to run: " + (", ".join(todo) if todo else "none; the study is complete") + ".")
    pngs = [p.name for p in sorted(study.root.glob("*.png"))]
    if pngs:
        images = "\n".join(f"![{n}](results/{study.root.name}/{n})" for n in pngs)
        links = "Plots: " + ", ".join(f"[{n}](results/{study.root.name}/{n})" for n in pngs) + "\n\n"
        parts.append((links if link_plots else "") + images)
    text = "\n\n".join(parts)
    (study.root / "results.md").write_text(text.replace(f"](results/{study.root.name}/", "](") + "\n")
    if page is not None and page.is_file():
        replace_section(page, section, text)
    return text


def evaluate_held_out(run, val_batches: list) -> None:
    """Append to `run.evals` the held-out loss (eval mode, the mean over the fixed batches) with
    where the run stands: its steps, tokens, wall-clock and CPU seconds so far."""
    import torch

    run.engine.eval()
    with torch.no_grad():
        loss = sum(run.engine(b, labels=b).item() for b in val_batches) / len(val_batches)
    run.engine.train()
    run.evals.append({"step": len(run.steps), "tokens": run.tokens, "wall_s": round(run.wall, 3),
                      "cpu_s": round(run.cpu, 3), "val_loss": loss})


def race_by_tokens(runs: list, val_batches: list, eval_every: int, step) -> None:
    """Step (`step(run)`) whichever live run has trained fewest tokens until none is live, each
    evaluated at the start, every `eval_every` tokens and at its end: runs that share a process
    this way share the machine's load alike."""
    for run in runs:
        evaluate_held_out(run, val_batches)
    while True:
        live = [r for r in runs if r.live]
        if not live:
            return
        run = min(live, key=lambda r: r.tokens)
        before = run.tokens // eval_every
        step(run)
        if run.tokens // eval_every > before or not run.live:
            evaluate_held_out(run, val_batches)
