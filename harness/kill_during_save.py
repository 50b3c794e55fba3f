"""SIGKILL in the middle of save_checkpoint, again and again: is what a restart loads always whole?

    python harness/kill_during_save.py --trials 20 [--world-size 1|2] [--stage S] [--seed N]

Every trial resumes one training job (one process, or 2 ranks under torchrun) on the same
save_dir. It trains a ~4M-param GPT with AdamW, so a save writes ~50 MB and takes 0.07-0.3 s
of writing, fsync and hashing on 2 cores. It saves every step as step-N (half the jobs first
save the step they resumed from again, which replaces an existing folder). The parent kills the whole
job with SIGKILL, mostly a random fraction of a save after rank 0 announces one, sometimes at
an arbitrary moment (start-up, load, training). A fresh job then checks what a restart finds:

    latest          if present, names a checkpoint whose manifest verifies
    load(tag=None)  loads exactly that one; a newer complete folder may exist only if the
                    killed save had published it and not yet moved latest
    steps lost      last step whose save began, minus the step loaded (at most 1 here)
    resume          train a step, save it over any leftover staging folder, load it again
    corruption      truncate or flip a byte of one file of the newest checkpoint: load raises
                    one line naming the file; fallback_to_complete=True loads the one before

Prints a table; exits 1 on any failure. tests/e2e/test_kill_during_save.py runs a few trials.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from common import kill_job  # noqa: E402

VOCAB, SEQ, MICRO = 4096, 32, 4
KEEP = 3  # tags the job keeps behind the newest, so 20 trials do not fill the disk
ARBITRARY_SHARE = 0.25  # kills at any moment rather than inside an announced save


# ---- the jobs (run in the child processes) -------------------------------------------------

def _build_engine(args):
    import torch

    import zerotrain
    from zerotrain.models import GPT, GPTConfig

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=VOCAB, n_positions=SEQ, n_embd=args.embd, n_layer=args.layers, n_head=4))
    world = int(os.environ.get("WORLD_SIZE", 1))
    engine, _, _, _ = zerotrain.initialize(model=model, config={
        "train_batch_size": MICRO * world, "train_micro_batch_size_per_gpu": MICRO,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": args.stage}})
    return engine


def _train_step(engine) -> None:
    """Batches depend only on the step, so a resumed job sees what the killed one would have."""
    import torch

    g = torch.Generator().manual_seed(engine.global_steps)
    x = torch.randint(0, VOCAB, (engine.world_size, MICRO, SEQ), generator=g)[engine.global_rank]
    engine.backward(engine(x, labels=x))
    engine.step()


def tag_of(step: int) -> str:
    return f"step-{step}"


def step_of(tag: str | None) -> int:
    return int(tag.split("-", 1)[1]) if tag else 0


def _line(text: str) -> None:
    """One write per line: both ranks share the pipe, and print() may write a line in pieces."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _say(engine, *words) -> None:
    if engine.global_rank == 0:
        _line(" ".join(map(str, words)))


def _prune(save_dir: Path, keep_from: int) -> None:
    """Old tags leave by one rename first, so a kill mid-delete leaves no half folder in sight."""
    for p in save_dir.glob(".prune-*"):
        shutil.rmtree(p, ignore_errors=True)
    latest = save_dir / "latest"
    latest = latest.read_text().strip() if latest.is_file() else None
    for p in list(save_dir.glob("step-*")):
        if p.is_dir() and p.name != latest and step_of(p.name) < keep_from:
            gone = save_dir / f".prune-{p.name}"
            os.rename(p, gone)
            shutil.rmtree(gone, ignore_errors=True)


def run_train(args) -> None:
    """Resume, then save every step until killed; rank 0 prints BEGIN/END around each save."""
    save_dir = Path(args.save_dir)
    engine = _build_engine(args)
    path, _ = engine.load_checkpoint(save_dir)
    _say(engine, "READY", engine.global_steps)

    def save() -> None:
        step = engine.global_steps
        _say(engine, "BEGIN", step)
        start = time.perf_counter()
        engine.save_checkpoint(save_dir, tag=tag_of(step), client_state={"step": step})
        _say(engine, "END", step, f"{time.perf_counter() - start:.4f}")
        if engine.global_rank == 0:
            _prune(save_dir, step - KEEP)

    if args.resave and path is not None:
        save()  # replaces the folder it just loaded: the rename-over-an-existing-tag path
    for _ in range(args.max_steps):
        _train_step(engine)
        save()


def _one_line(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}".replace("\n", " | ")


def _corrupt(file: Path, how: str, at: float) -> None:
    data = bytearray(file.read_bytes())
    cut = min(int(at * len(data)), len(data) - 1)
    if how == "truncate":
        data = data[:cut]
    else:
        data[cut] ^= 0xFF
    file.write_bytes(bytes(data))


def run_check(args) -> dict:
    """What a restarted job finds after the kill, as this rank saw it."""
    from zerotrain.checkpoint import list_complete_tags, resolve_checkpoint, verify_checkpoint
    from zerotrain.errors import CheckpointError

    save_dir = Path(args.save_dir)
    out: dict = {"problems": []}
    problems = out["problems"]
    latest = save_dir / "latest"
    out["latest"] = latest.read_text().strip() if latest.is_file() else None
    if out["latest"] is not None:
        try:
            verify_checkpoint(resolve_checkpoint(save_dir))
        except CheckpointError as err:
            out["latest_incomplete"] = True
            problems.append(f"latest -> {out['latest']} is not complete: {_one_line(err)}")
    out["complete"] = sorted(step_of(t) for t in list_complete_tags(save_dir))
    out["staging_left"] = len(list(save_dir.glob(".*.staging")))
    try:
        engine = _build_engine(args)
        out["rank"] = engine.global_rank
        path, client = engine.load_checkpoint(save_dir)
        loaded = out["loaded"] = engine.global_steps
        out["loaded_from"] = Path(path).name if path else None
        if path is not None and client.get("step") != loaded:
            problems.append(f"loaded {path}: client_state step {client.get('step')} != global_steps {loaded}")
        if loaded != step_of(out["latest"]):
            problems.append(f"load(tag=None) gave step {loaded}, but latest names {out['latest']}")

        # resume: one more step, saved over whatever a killed save left, then loaded afresh
        _train_step(engine)
        engine.save_checkpoint(save_dir, tag=tag_of(loaded + 1), client_state={"step": loaded + 1})
        engine.destroy()
        engine = _build_engine(args)
        engine.load_checkpoint(save_dir)
        out["resumed"] = engine.global_steps == loaded + 1
        if not out["resumed"]:
            problems.append(f"saved step {loaded + 1} after resuming, loaded {engine.global_steps} back")

        # corruption of one file of the newest checkpoint
        newest = save_dir / tag_of(loaded + 1)
        names = sorted(json.loads((newest / "manifest.json").read_text())["files"])
        name = names[args.file_index % len(names)]
        previous = [t for t in list_complete_tags(save_dir) if t != newest.name]
        out["corrupted"] = f"{newest.name}/{name}"
        original = (newest / name).read_bytes()
        engine.comm.barrier()
        if engine.global_rank == 0:
            _corrupt(newest / name, args.corrupt, args.at)
        engine.comm.barrier()
        try:
            engine.load_checkpoint(save_dir)
            problems.append(f"{args.corrupt} of {out['corrupted']} was not noticed by load_checkpoint")
        except CheckpointError as err:
            msg = str(err)
            out["detected"] = "\n" not in msg and out["corrupted"] in msg
            out["error"] = msg
            if not out["detected"]:
                problems.append(f"{args.corrupt} of {out['corrupted']}: error does not name it on one line: {msg!r}")
        expected = step_of(previous[0]) if previous else None
        try:
            engine.load_checkpoint(save_dir, fallback_to_complete=True)
            got = engine.global_steps
        except CheckpointError:
            got = None  # right only when there is nothing to fall back to
        out["fallback"] = got == expected
        if got != expected:
            problems.append(f"fallback_to_complete loaded step {got}, expected {expected} ({previous[:1]})")
        engine.comm.barrier()
        if engine.global_rank == 0:
            (newest / name).write_bytes(original)  # the next trial resumes from here
        engine.comm.barrier()
        engine.destroy()
    except Exception as err:  # report it as the trial's failure rather than as a traceback
        problems.append(f"check crashed: {_one_line(err)}")
    return out


# ---- the parent: launch, kill, check --------------------------------------------------------

def _env() -> dict:
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["OMP_NUM_THREADS"] = "1"
    return env


def _command(world_size: int, role_args: list[str]) -> list[str]:
    script = str(Path(__file__).resolve())
    if world_size == 1:
        return [sys.executable, script, *role_args]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
            str(world_size), script, *role_args]


class Job:
    """A launched job whose stdout lines arrive, timestamped, through a queue."""

    def __init__(self, cmd: list[str], log: Path) -> None:
        self.started = time.monotonic()
        self.killed_at: float | None = None
        with open(log, "ab") as err:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True,
                                         env=_env(), start_new_session=True)
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[tuple[float, str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put((time.monotonic(), line.rstrip("\n")))
        self.lines.put(None)

    def next(self, timeout: float) -> tuple[float, str] | None:
        item = self.lines.get(timeout=timeout)
        if item is not None:
            self.seen.append(item)
        return item

    def kill(self) -> None:
        """SIGKILL the whole job (every rank too), then reap the launcher."""
        if self.proc.poll() is None:
            self.killed_at = time.monotonic()
            kill_job(self.proc.pid)
        self.proc.wait()
        self._reader.join(timeout=10)
        while True:  # keep what the job printed before it died
            try:
                item = self.lines.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                self.seen.append(item)

    def finish(self, timeout: float) -> int:
        """Wait for a job meant to end by itself; kill it (every rank) if it takes too long."""
        deadline = time.monotonic() + timeout
        try:
            while self.next(max(0.1, deadline - time.monotonic())) is not None:
                pass
        except queue.Empty:
            self.kill()
            raise RuntimeError(f"job did not finish within {timeout:.0f} s") from None
        except BaseException:
            self.kill()  # Ctrl-C: leave no rank behind
            raise
        return self.proc.wait()


@dataclass
class Summary:
    trials: int = 0
    inside: int = 0
    inside_replacing: int = 0
    outside: int = 0
    latest_incomplete: int = 0
    published_not_latest: int = 0
    via_hidden_copy: int = 0
    loads_ok: int = 0
    resumes_ok: int = 0
    staging_seen: int = 0
    lost: list = field(default_factory=list)
    corrupt_detected: int = 0
    corrupt_kinds: dict = field(default_factory=lambda: {"truncate": 0, "flip": 0})
    fallback_ok: int = 0
    save_s: list = field(default_factory=list)
    failures: list = field(default_factory=list)
    wall_s: float = 0.0


def _job_args(save_dir: Path, opts: argparse.Namespace) -> list[str]:
    return ["--save-dir", str(save_dir), "--stage", str(opts.stage), "--embd", str(opts.embd),
            "--layers", str(opts.layers)]


def _kill_job(job: Job, kind: str, rng: random.Random, est: dict, summary: Summary) -> None:
    """Wait for the chosen moment, then kill: inside the n-th save, or after a random delay."""
    if kind == "any":
        deadline = job.started + rng.uniform(0, est["startup"] + 4 * est["cycle"])
    else:
        target, fraction, begins = rng.randint(1, 3), rng.uniform(0, 1.1), 0
        deadline = None
    last_begin = None
    while True:
        timeout = 300 if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            item = job.next(timeout)
        except queue.Empty:
            break  # the arbitrary moment has come
        if item is None:
            raise RuntimeError(f"the training job ended by itself (exit {job.proc.wait()})")
        t, words = item[0], item[1].split() or [""]
        if words[0] == "READY":
            est["startup"] = t - job.started
        elif words[0] == "END":
            summary.save_s.append(float(words[2]))
        elif words[0] == "BEGIN":
            if last_begin is not None:
                est["cycle"] = t - last_begin
            last_begin = t
            if deadline is None:
                begins += 1
                if begins >= target and summary.save_s:
                    deadline = t + fraction * statistics.median(summary.save_s[-20:])
    job.kill()


def _check(save_dir: Path, opts, i: int, rng: random.Random, log: Path) -> tuple[str, list[dict]]:
    """Trials take the files of the newest checkpoint and the two kinds of damage in turn."""
    how = ("truncate", "flip")[i % 2]
    check_args = ["--role", "check", *_job_args(save_dir, opts), "--corrupt", how, "--file-index", str(i // 2),
                  "--at", str(rng.random())]
    if opts.in_process:  # one rank: this process never held the killed job's state either
        return how, [run_check(_parser().parse_args(check_args))]
    cmd = _command(opts.world_size, check_args)
    job = Job(cmd, log)
    code = job.finish(600)
    results = [json.loads(line.split(" ", 1)[1]) for _, line in job.seen if line.startswith("RESULT ")]
    if code != 0 or len(results) != opts.world_size:
        with open(log, "a") as f:
            f.write("---- check job stdout\n" + "".join(line + "\n" for _, line in job.seen))
        raise RuntimeError(f"check job exit {code}, {len(results)} results; see {log}")
    return how, results


def run_trial(i: int, save_dir: Path, opts, rng: random.Random, est: dict, summary: Summary, say) -> None:
    kind = "save" if i == 0 or rng.random() >= ARBITRARY_SHARE else "any"
    resave = rng.random() < 0.5
    log = save_dir.parent / f"trial{i}.log"
    job = Job(_command(opts.world_size, ["--role", "train", *_job_args(save_dir, opts), "--max-steps", "40"]
                       + (["--resave"] if resave else [])), log)
    try:
        _kill_job(job, kind, rng, est, summary)
    finally:
        job.kill()
    events = [(t, w[0], int(w[1])) for t, w in ((t, line.split()) for t, line in job.seen)
              if w and w[0] in ("READY", "BEGIN", "END")]
    ready = [s for _, e, s in events if e == "READY"]
    begins = [(t, s) for t, e, s in events if e == "BEGIN"]
    ends = {s for _, e, s in events if e == "END"}
    inside = bool(begins) and begins[-1][1] not in ends
    replacing = inside and begins[-1][1] == ready[0]  # the --resave of the step it resumed from
    summary.trials += 1
    summary.inside += inside
    summary.inside_replacing += replacing
    summary.outside += not inside
    if inside:
        where = f"{job.killed_at - begins[-1][0]:.3f} s into {'re-' if replacing else ''}saving {tag_of(begins[-1][1])}"
    else:
        where = f"outside a save, after {len(ends)} saves"
    begins = [s for _, s in begins]

    how, results = _check(save_dir, opts, i, rng, log)
    first = results[0]
    problems = [f"rank {r.get('rank', '?')}: {p}" for r in results for p in r["problems"]]
    loaded, complete = first.get("loaded"), first["complete"]
    summary.latest_incomplete += bool(first.get("latest_incomplete"))
    summary.staging_seen = max(summary.staging_seen, first["staging_left"])
    last_started = begins[-1] if begins else est["resumed_from"]
    if loaded is not None:
        summary.loads_ok += all(r.get("loaded") == loaded for r in results) and not problems
        newest = max(complete, default=0)
        hidden = (first.get("loaded_from") or "").startswith(".")
        summary.via_hidden_copy += hidden
        if newest > loaded and inside and newest == begins[-1]:
            summary.published_not_latest += 1  # published, killed before latest moved
        elif newest != loaded and not (hidden and newest < loaded):
            problems.append(f"loaded step {loaded}, but the newest complete tag is step-{newest}")
        lost = last_started - loaded
        summary.lost.append(lost)
        if not 0 <= lost <= 1:
            problems.append(f"lost {lost} steps (last save began at step {last_started}, loaded {loaded})")
        est["resumed_from"] = loaded + 1
    summary.resumes_ok += all(r.get("resumed") for r in results)
    summary.corrupt_kinds[how] += 1
    summary.corrupt_detected += all(r.get("detected") for r in results)
    summary.fallback_ok += all(r.get("fallback") for r in results)
    say(f"trial {i + 1:>2}: {kind:<4} killed {where:<34} latest {first['latest']!s:<8} loaded {loaded!s:<3} "
        f"{how} {first.get('corrupted')}: {'detected' if first.get('detected') else 'MISSED'}")
    if problems:
        summary.failures += [f"trial {i + 1}: {p}" for p in problems]
        say("   FAIL " + "\n   FAIL ".join(problems))
        shutil.rmtree(save_dir, ignore_errors=True)  # start the next trial clean
        est["resumed_from"] = 0


def run_trials(trials: int, world_size: int = 1, stage: int = 0, seed: int = 0, embd: int = 256, layers: int = 4,
               work_dir: str | os.PathLike | None = None, say=print, check_in_process: bool = False) -> Summary:
    """check_in_process (world size 1 only) saves a process start per trial, for CI."""
    opts = argparse.Namespace(world_size=world_size, stage=stage, embd=embd, layers=layers,
                              in_process=check_in_process and world_size == 1)
    rng = random.Random(seed)
    root = Path(work_dir) if work_dir is not None else Path(tempfile.mkdtemp(prefix="kill_during_save_"))
    root.mkdir(parents=True, exist_ok=True)
    save_dir = root / "ckpt"
    est = {"startup": 4.0, "cycle": 0.5, "resumed_from": 0}
    summary = Summary()
    start = time.monotonic()
    try:
        for i in range(trials):
            try:
                run_trial(i, save_dir, opts, rng, est, summary, say)
            except RuntimeError as err:
                summary.failures.append(f"trial {i + 1}: {err}")
                say(f"   FAIL {err}")
                shutil.rmtree(save_dir, ignore_errors=True)
                est["resumed_from"] = 0
    finally:
        summary.wall_s = time.monotonic() - start
        if work_dir is None and not summary.failures:
            shutil.rmtree(root, ignore_errors=True)
        elif summary.failures:
            say(f"logs and checkpoints kept in {root}")
    return summary


def table(s: Summary, world_size: int, stage: int, seed: int) -> str:
    lost = f"{max(s.lost)} / {statistics.mean(s.lost):.2f}" if s.lost else "-"
    save = f"{statistics.median(s.save_s):.3f} s" if s.save_s else "-"
    rows = [
        ("trials", s.trials),
        ("kills inside a save", s.inside),
        ("  of them while replacing an existing tag", s.inside_replacing),
        ("kills outside a save", s.outside),
        ("latest pointing at an incomplete checkpoint", s.latest_incomplete),
        ("  newest folder published, latest not yet moved", s.published_not_latest),
        ("  loaded through the .staging / .old copy", s.via_hidden_copy),
        ("leftover .staging folders (most at once)", s.staging_seen),
        ("successful loads (tag=None)", f"{s.loads_ok}/{s.trials}"),
        ("resume: save + load again", f"{s.resumes_ok}/{s.trials}"),
        ("steps lost: max / mean", lost),
        ("corruption trials detected", f"{s.corrupt_detected}/{s.trials} "
                                       f"({s.corrupt_kinds['truncate']} truncated, {s.corrupt_kinds['flip']} flipped)"),
        ("fallback_to_complete loaded the previous tag", f"{s.fallback_ok}/{s.trials}"),
        ("median save time", save),
        ("wall time", f"{s.wall_s:.0f} s"),
    ]
    head = f"kill during save_checkpoint: world size {world_size}, ZeRO stage {stage}, seed {seed}"
    return "\n".join([head] + [f"  {name:<48} {value}" for name, value in rows])


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--world-size", type=int, default=1, choices=(1, 2))
    p.add_argument("--stage", type=int, default=0, choices=(0, 1, 2, 3))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--embd", type=int, default=256, help="GPT width: 256 with 4 layers is ~4M params")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--work-dir", default=None, help="kept afterwards; default: a temporary folder")
    # the child jobs
    p.add_argument("--role", choices=("parent", "train", "check"), default="parent", help=argparse.SUPPRESS)
    p.add_argument("--save-dir", help=argparse.SUPPRESS)
    p.add_argument("--max-steps", type=int, default=40, help=argparse.SUPPRESS)
    p.add_argument("--resave", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--corrupt", choices=("truncate", "flip"), default="flip", help=argparse.SUPPRESS)
    p.add_argument("--file-index", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--at", type=float, default=0.5, help=argparse.SUPPRESS)
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.role in ("train", "check"):
        from zerotrain.comm import shutdown

        if args.role == "train":
            run_train(args)
        else:
            _line("RESULT " + json.dumps(run_check(args)))
        shutdown()  # exiting with a live gloo group can abort the process
        return 0
    s = run_trials(args.trials, args.world_size, args.stage, args.seed, args.embd, args.layers, args.work_dir)
    print(table(s, args.world_size, args.stage, args.seed))
    for failure in s.failures:
        print("FAIL", failure)
    return 1 if s.failures or s.latest_incomplete else 0


if __name__ == "__main__":
    sys.exit(main())
