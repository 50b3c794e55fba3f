"""zerotrain ZeRO stages 0-3 against DeepSpeed's (and torch's DDP at stage 0, FSDP2 at stage 3), side by side.

    python benchmarks/compare_zero.py [--quick] [--stages 0,1,2,3] [--skip-deepspeed] [--skip-torch]

One workload for everyone: a GPT-2-style model (zerotrain.models.GPT, 42M parameters by
default), micro batch 4 x 128 tokens per rank, 2 ranks on gloo with one thread each, fp32,
AdamW (lr 1e-4, weight decay 0.01) and gradient clipping at 1.0, the same fixed batches and
the same initial weights (seed 0). zerotrain and DeepSpeed read the very same config dict;
DeepSpeed gets `"torch_adam": true` so it steps torch's AdamW, as zerotrain does.

The model is mid-range of the 20-50M the benchmark is specified for. At 21M (`--embd 384
--layers 10 --heads 6`) what stage 3 saves over stage 2 per rank, half the parameters less
the tied embedding and the prefetch window kept whole at the activation peak, is about
25 MiB: no more than the heap's own wander from step to step, so the two stages tie there.

DeepSpeed is installed on first use into its own venv (benchmarks/.ds-venv: the local torch
wheel, then `DS_BUILD_OPS=0 pip install --no-build-isolation deepspeed`); where that fails
the script says so and compares zerotrain with FSDP2 only. Each venv has its own
TORCH_EXTENSIONS_DIR, and DeepSpeed's shared-memory comm op is compiled once before any job
runs, so no compile time lands in a timing. (That op only serves DeepSpeed's inference
all-reduce: its training gradients go through torch.distributed on gloo, as ours do.)

torch's DDP beside stage 0 is the floor there: the same compute and the same gloo all-reduce
with almost nothing around them. At 42M and micro batch 4 x 128 it lands at 0.86-1.04 of
DeepSpeed's step time round by round (median 0.91 over 6 rounds), and zerotrain within a few
percent of it either way: 0.9 of DeepSpeed is at or below that floor, so stage 0's step time
is judged against DDP instead (zt/DDP at most 1.02); its memory is still judged against
DeepSpeed. The margin over DeepSpeed grows with fewer tokens per step (`--micro 2`, `--micro
1`): the compute shrinks with them, while what DeepSpeed's engine adds to it depends on the
parameters only.

Every (framework, stage) pair runs as its own torchrun job, so the peak RSS a job reports is
that configuration's own. Jobs are interleaved round by round (zerotrain, DeepSpeed, torch,
next stage, ..., next round) so machine drift hits all alike. A job runs a few untimed warmup
steps, then times each step between a barrier and the max over ranks. Reported per stage:
median step time, peak RSS per rank (VmHWM at the end of the job), the ratios zerotrain /
DeepSpeed, torch's DDP / FSDP2 and zerotrain / torch, and the loss of every step of all, side by side; then CPU time
per step (steadier than wall time on a shared machine), the peak during training alone and by
the end of initialisation. zerotrain's source is copied when the run starts, so edits made
to src/ meanwhile cannot mix two versions into one table.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import (REPO, SRC, describe, import_gpt, launch_worker, reset_peak_rss, run_quiet,  # noqa: E402
                    say, status_kib, venv_env)

# step-time and peak-RSS targets for zerotrain / DeepSpeed; at stage
# 0 the step time is judged against torch's DDP instead, the floor there: at most 2% slower
TIME_TARGET, RSS_TARGET = 0.9, 1.0
DDP_TIME_TARGET = 1.02
# torch's own counterpart, run beside the two engines where there is one
TORCH_REFERENCE = {0: "ddp", 3: "fsdp2"}
TORCH_NAME = {0: "DDP", 3: "FSDP2"}  # as the table names them


# ============================================================================================
# worker: one (framework, stage) on every rank of a torchrun job
# ============================================================================================

def shared_config(args, stage: int) -> dict:
    """The one config both engines read."""
    return {
        "train_micro_batch_size_per_gpu": args.micro,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": args.clip,  # DeepSpeed's default would be 1.0: set it on both
        "optimizer": {"type": "AdamW", "params": {"lr": args.lr, "weight_decay": 0.01, "torch_adam": True}},
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def worker(args) -> None:
    import torch

    torch.set_num_threads(1)
    framework, stage = args.worker, args.stage
    GPT, GPTConfig = import_gpt(framework)
    t_init = time.perf_counter()

    if framework == "deepspeed":
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=args.vocab, n_positions=args.seq, n_embd=args.embd, n_layer=args.layers,
                    n_head=args.heads)
    model = GPT(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    config = shared_config(args, stage)

    if framework in ("zerotrain", "deepspeed"):
        if framework == "zerotrain":
            import zerotrain

            engine, *_ = zerotrain.initialize(model=model, config=config)
        else:
            engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)

        def step(x):  # the one training loop both engines share
            loss = engine(x, labels=x)
            engine.backward(loss)
            engine.step()
            return loss
    elif framework == "ddp":
        # torch's own data parallelism at its best: C++ reducer, gradients as views of its
        # buckets, fused AdamW. The floor for stage 0: the same compute and the same gloo
        # all-reduce with (almost) no engine around them.
        from torch.nn.parallel import DistributedDataParallel

        ddp = DistributedDataParallel(model, gradient_as_bucket_view=True)
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, fused=True)

        def step(x):
            loss = ddp(x, labels=x)
            loss.backward()
            if args.clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip, foreach=True)
            opt.step()
            opt.zero_grad(set_to_none=False)  # keep the bucket views
            return loss
    elif framework == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)

        def step(x):
            loss = model(x, labels=x)
            loss.backward()
            if args.clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss
    else:
        raise SystemExit(f"unknown framework {framework}")
    init_s = time.perf_counter() - t_init
    init_hwm = status_kib("VmHWM")
    reset = reset_peak_rss()

    def batch(i: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(1000 + i * world + rank)
        return torch.randint(0, cfg.vocab_size, (args.micro, args.seq), generator=g)

    times, cpu, losses = [], [], []
    for i in range(args.warmup + args.steps):
        x = batch(i)
        dist.barrier()
        start, cpu_start = time.perf_counter(), time.process_time()
        loss = step(x)
        # wall time and CPU time (all threads of the process, gloo's included) of this rank;
        # a step is as slow as its slowest rank
        spent = torch.tensor([time.perf_counter() - start, time.process_time() - cpu_start], dtype=torch.float64)
        dist.all_reduce(spent, op=dist.ReduceOp.MAX)
        mean_loss = loss.detach().double().reshape(1)
        dist.all_reduce(mean_loss)
        losses.append(mean_loss.item() / world)
        if i >= args.warmup:
            times.append(spent[0].item())
            cpu.append(spent[1].item())

    mine = torch.tensor([status_kib("VmHWM"), status_kib("VmHWM") if reset else -1, init_hwm,
                         status_kib("VmRSS")], dtype=torch.int64)
    everyone = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(everyone, mine)
    if rank == 0:
        out = {"framework": framework, "stage": stage, "params": n_params, "times": times, "cpu": cpu, "losses": losses,
               "init_s": init_s, "world": world,
               "peak_kib": [int(t[0]) for t in everyone],  # whole job
               "train_peak_kib": [int(t[1]) for t in everyone] if reset else None,  # since the reset
               "init_peak_kib": [int(t[2]) for t in everyone],
               "end_rss_kib": [int(t[3]) for t in everyone]}
        Path(args.out).write_text(json.dumps(out))
    dist.barrier()
    dist.destroy_process_group()


# ============================================================================================
# parent: DeepSpeed's venv, the job schedule, the table
# ============================================================================================

def _short(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def ensure_deepspeed(reinstall: bool = False) -> Path | None:
    """The DeepSpeed venv's python, installing it on first use; None (with the reason
    printed) where that is not possible."""
    import torch

    py = common.DS_VENV / "bin" / "python"
    probe = "import deepspeed, numpy, torch; print(deepspeed.__version__, torch.__version__)"
    env = venv_env(common.DS_VENV)
    if py.exists() and not reinstall:
        r = run_quiet([py, "-c", probe], env=env)
        if r.returncode == 0:
            return py
    # The very torch this script runs on (e.g. "2.13.0+cpu"): with its local label the pin can
    # only match that build, so pip can never swap in a multi-GB CUDA one.
    torch_pin = f"torch=={torch.__version__}"
    say(f"DeepSpeed: installing into {_short(common.DS_VENV)} ({torch_pin}, then deepspeed "
        "with DS_BUILD_OPS=0); cached for later runs")
    start = time.perf_counter()
    steps = [[sys.executable, "-m", "venv", "--clear", common.DS_VENV]]
    constraints = Path(tempfile.mkstemp(suffix=".txt")[1])
    constraints.write_text(torch_pin + "\n")
    pip = [py, "-m", "pip", "install", "-q", "-c", constraints]
    steps += [pip + [torch_pin, "numpy", "setuptools", "wheel"],
              pip + ["--no-build-isolation", "deepspeed"]]
    env["DS_BUILD_OPS"] = "0"
    try:
        for cmd in steps:
            r = run_quiet(cmd, env=env, timeout=1200)
            if r.returncode != 0:
                tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-15:])
                say(f"DeepSpeed: could not install ({' '.join(map(str, cmd[:6]))} ... failed):\n{tail}")
                return None
        r = run_quiet([py, "-c", probe], env=env)
        if r.returncode != 0:
            say(f"DeepSpeed: installed but does not import:\n{r.stderr.strip()[-2000:]}")
            return None
    except (OSError, subprocess.TimeoutExpired) as e:
        say(f"DeepSpeed: could not install ({e})")
        return None
    finally:
        constraints.unlink(missing_ok=True)
    say(f"DeepSpeed: {r.stdout.strip()} installed in {time.perf_counter() - start:.0f} s")
    return py


def warm_deepspeed(py: Path) -> bool:
    """Compile DeepSpeed's shared-memory comm op now (it is built on first use, ~30 s), so that
    no job's first step or init waits for the compiler."""
    start = time.perf_counter()
    code = "from deepspeed.comm.torch import build_shm_op; build_shm_op()"
    r = run_quiet([py, "-c", code], env=venv_env(common.DS_VENV), timeout=900)
    if r.returncode != 0:
        say(f"DeepSpeed: building its shared-memory comm op failed:\n{(r.stdout + r.stderr)[-2000:]}")
        return False
    say(f"DeepSpeed: shared-memory comm op ready ({time.perf_counter() - start:.0f} s, "
        f"TORCH_EXTENSIONS_DIR={_short(common.DS_VENV)}/torch_extensions)")
    return True


def run_job(python: Path, framework: str, stage: int, args, log_dir: Path, src: Path) -> dict | None:
    res = launch_worker(python, __file__, args.nproc, framework,
                        ["--worker", framework, "--stage", stage, "--steps", args.steps, "--warmup", args.warmup,
                         "--micro", args.micro, "--seq", args.seq, "--vocab", args.vocab, "--embd", args.embd,
                         "--layers", args.layers, "--heads", args.heads, "--lr", args.lr, "--clip", args.clip],
                        log_dir, src, f"{framework} stage {stage}")
    if res is None:
        return None
    say(f"  {framework:9s} stage {stage}: median {1000 * statistics.median(res['times']):7.1f} ms/step, "
        f"peak RSS {max(res['peak_kib']) / 1024:6.0f} MiB/rank, final loss {res['losses'][-1]:.5f} "
        f"({res['wall_s']:.0f} s)")
    return res


def _merge(runs: list[dict]) -> dict | None:
    if not runs:
        return None
    times = [t for r in runs for t in r["times"]]
    cpu = [t for r in runs for t in r["cpu"]]
    peak = [max(r["peak_kib"]) for r in runs]  # the rank with the highest peak, per job
    train = [max(r["train_peak_kib"]) for r in runs if r.get("train_peak_kib")]
    init = [max(r["init_peak_kib"]) for r in runs]
    return {"ms": 1000 * statistics.median(times), "ms_all": [1000 * t for t in times],
            "cpu_ms": 1000 * statistics.median(cpu), "init_s": statistics.median(r["init_s"] for r in runs),
            "peak_mib": statistics.median(peak) / 1024, "init_peak_mib": statistics.median(init) / 1024,
            "train_peak_mib": statistics.median(train) / 1024 if train else float("nan"),
            "peak_per_rank_mib": [k / 1024 for k in runs[-1]["peak_kib"]],
            "losses": runs[0]["losses"], "repeatable": all(r["losses"] == runs[0]["losses"] for r in runs),
            "params": runs[0]["params"],
            # per round: (step ms, peak MiB, CPU ms), the numbers the ratios pair up
            "by_round": {r["round"]: (1000 * statistics.median(r["times"]), max(r["peak_kib"]) / 1024,
                                      1000 * statistics.median(r["cpu"])) for r in runs}}


def _paired(a: dict | None, b: dict | None, what: int) -> list[float]:
    """a / b round by round, over the rounds both finished: machine drift between rounds,
    or a round one side lost to a crash, then weighs on neither side alone."""
    if not a or not b:
        return []
    return [a["by_round"][r][what] / b["by_round"][r][what] for r in sorted(a["by_round"]) if r in b["by_round"]]


def _paired_ratio(a: dict | None, b: dict | None, what: int) -> float | None:
    ratios = _paired(a, b, what)
    return statistics.median(ratios) if ratios else None


def _fmt(x, spec=".1f", width=8) -> str:
    return f"{'-':>{width}}" if x is None or x != x else f"{x:{width}{spec}}"


def report(results: dict, stages: list[int], args, ds_state: str) -> bool:
    zt = {s: _merge(results.get(("zerotrain", s), [])) for s in stages}
    ds = {s: _merge(results.get(("deepspeed", s), [])) for s in stages}
    ref = {s: _merge(results.get((TORCH_REFERENCE[s], s), [])) for s in stages if s in TORCH_REFERENCE}
    any_run = next((m for m in list(zt.values()) + list(ds.values()) if m), None)
    print()
    if any_run:
        tokens = args.micro * args.seq * args.nproc
        print(f"model: GPT {any_run['params'] / 1e6:.1f}M params (vocab {args.vocab}, n_embd {args.embd}, "
              f"{args.layers} layers, seq {args.seq}); micro batch {args.micro} per rank, {args.nproc} ranks "
              f"(gloo, 1 thread each), fp32, AdamW lr {args.lr}, clip {args.clip}; {tokens} tokens/step")
        print(f"per job: {args.warmup} warmup + {args.steps} timed steps; {args.rounds} round(s) interleaved; "
              f"DeepSpeed: {ds_state}")
    print()
    head = (f"{'stage':>5} | {'zt ms':>8} {'DS ms':>8} {'zt/DS':>6} | {'zt MiB':>7} {'DS MiB':>7} {'zt/DS':>6} | "
            f"{'torch':>5} {'ms':>8} {'MiB':>6} {'zt/torch':>8}")
    print("median step time (ms; each step timed between a barrier and the max over ranks) and")
    print("peak RSS per rank (MiB; VmHWM at the end of the job, the higher rank; median over rounds);")
    print("zt/DS: the median of the per-round ratios, over the rounds both finished")
    print(head)
    print("-" * len(head))
    ok = True
    ratios = {}
    for s in stages:
        z, d = zt[s], ds[s]
        # the ratios are medians of per-round ratios (rounds where both sides finished)
        t_ratio, m_ratio = _paired_ratio(z, d, 0), _paired_ratio(z, d, 1)
        f = ref.get(s)
        name = TORCH_NAME[s] if f else ""
        print(f"{s:>5} | {_fmt(z and z['ms'])} {_fmt(d and d['ms'])} {_fmt(t_ratio, '.2f', 6)} | "
              f"{_fmt(z and z['peak_mib'], '.0f', 7)} {_fmt(d and d['peak_mib'], '.0f', 7)} "
              f"{_fmt(m_ratio, '.2f', 6)} | {name:>5} {_fmt(f and f['ms'])} {_fmt(f and f['peak_mib'], '.0f', 6)} "
              f"{_fmt(_paired_ratio(z, f, 0), '.2f', 8)}")
        if s == 0 and f:  # the floor: torch's DDP
            t_ratio, limit = _paired_ratio(z, f, 0), DDP_TIME_TARGET
        else:
            limit = TIME_TARGET
        if t_ratio is not None and m_ratio is not None:
            ratios[s] = (t_ratio, m_ratio, limit)
            ok &= t_ratio <= limit and m_ratio <= RSS_TARGET
    for s in ratios:
        print(f"  stage {s} step time zt/DS by round: " + ", ".join(f"{r:.2f}" for r in _paired(zt[s], ds[s], 0)))
        if s in ref and ref[s]:
            print(f"  stage {s} step time zt/{TORCH_NAME[s]} by round: "
                  + ", ".join(f"{r:.2f}" for r in _paired(zt[s], ref[s], 0)))
    print()
    head2 = (f"{'stage':>5} | {'zt cpu':>7} {'DS cpu':>7} {'zt/DS':>6} | {'zt train':>8} {'DS train':>8} | "
             f"{'zt init':>7} {'DS init':>7} | {'zt init s':>9} {'DS init s':>9}")
    print("supplementary: CPU ms per step (process CPU time incl. comm threads, max over ranks; less")
    print("sensitive to other load on the machine than wall time), peak RSS during the training steps")
    print("alone ('train', VmHWM reset after initialisation), peak RSS by the end of initialisation")
    print("('init'), and initialisation wall time (s); zt/DS paired by round, as above")
    print(head2)
    print("-" * len(head2))
    for s in stages:
        z, d = zt[s], ds[s]
        c_ratio = _paired_ratio(z, d, 2)
        print(f"{s:>5} | {_fmt(z and z['cpu_ms'], '.0f', 7)} {_fmt(d and d['cpu_ms'], '.0f', 7)} "
              f"{_fmt(c_ratio, '.2f', 6)} | {_fmt(z and z['train_peak_mib'], '.0f')} "
              f"{_fmt(d and d['train_peak_mib'], '.0f')} | {_fmt(z and z['init_peak_mib'], '.0f', 7)} "
              f"{_fmt(d and d['init_peak_mib'], '.0f', 7)} | {_fmt(z and z['init_s'], '.1f', 9)} "
              f"{_fmt(d and d['init_s'], '.1f', 9)}")
    for s, f in ref.items():
        if f:
            print(f"{TORCH_NAME[s]} (stage {s}): cpu {f['cpu_ms']:.0f} ms, train peak "
                  f"{f['train_peak_mib']:.0f} MiB, init peak {f['init_peak_mib']:.0f} MiB, init {f['init_s']:.1f} s")
    print()
    print(f"targets: step time zt/DDP <= {DDP_TIME_TARGET} at stage 0 (the floor; zt/DS when DDP did not run), "
          f"zt/DS <= {TIME_TARGET} above it; zt/DS peak RSS <= {RSS_TARGET} at every stage; "
          "zerotrain's peak RSS falling as the stage rises")
    ran_deepspeed = any(ds.values())
    for s in stages:
        if s not in ratios:
            if ran_deepspeed:  # DeepSpeed ran, but no round of this stage has both sides
                print(f"  stage {s}: NOT CHECKED: no round where zerotrain and DeepSpeed both finished")
                ok = False
            continue
        t_ratio, m_ratio, limit = ratios[s]
        against = TORCH_NAME[0] if s == 0 and limit == DDP_TIME_TARGET else "DS"
        misses = ([f"step time zt/{against} {t_ratio:.2f} > {limit}"] if t_ratio > limit else []) + \
                 ([f"peak RSS {m_ratio:.2f} > {RSS_TARGET}"] if m_ratio > RSS_TARGET else [])
        print(f"  stage {s}: " + ("met" if not misses else "MISSED: " + ", ".join(misses)))
    zt_peaks = [(s, zt[s]["peak_mib"]) for s in stages if zt[s]]
    if len(zt_peaks) > 1:
        falling = all(b[1] <= a[1] for a, b in zip(zt_peaks, zt_peaks[1:]))
        print("zerotrain peak RSS by stage: " + ", ".join(f"{s}: {m:.0f}" for s, m in zt_peaks)
              + f" MiB -> {'falls' if falling else 'does NOT fall'} as the stage rises")
        ok &= falling

    # losses of both, side by side
    print()
    print("loss (mean over ranks) at each step, zerotrain vs DeepSpeed (and torch's DDP / FSDP2)")
    worst = {}
    for s in stages:
        z, d = zt[s], ds[s]
        if not z:
            continue
        cols = [("zt", z["losses"])] + ([("DS", d["losses"])] if d else []) + \
            ([(TORCH_NAME[s], ref[s]["losses"])] if ref.get(s) else [])
        print(f"stage {s}: step " + " ".join(f"{name:>10}" for name, _ in cols) + ("      |zt-DS|" if d else ""))
        n = min(len(c[1]) for c in cols)
        for i in range(n):
            diff = f"   {abs(z['losses'][i] - d['losses'][i]):10.2e}" if d else ""
            print(f"        {i:4d} " + " ".join(f"{c[1][i]:10.6f}" for c in cols) + diff)
        if d:
            worst[s] = max(abs(a - b) for a, b in zip(z["losses"], d["losses"]))
        if not z["repeatable"] or (d and not d["repeatable"]):
            print(f"        note: a framework's losses differed between rounds at stage {s}")
    if worst:
        print("largest |loss zt - loss DS| per stage: " + ", ".join(f"{s}: {w:.1e}" for s, w in worst.items())
              + ("  (agree)" if max(worst.values()) < 1e-3 else "  (DO NOT agree)"))
        ok &= max(worst.values()) < 1e-3
    for s, f in ref.items():
        if f and zt.get(s):
            print(f"largest |loss zt - loss {TORCH_NAME[s]}| at stage {s}: "
                  f"{max(abs(a - b) for a, b in zip(zt[s]['losses'], f['losses'])):.1e}")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one round of few steps: a smoke test")
    parser.add_argument("--stages", default="0,1,2,3", help="comma-separated ZeRO stages (default 0,1,2,3)")
    parser.add_argument("--skip-deepspeed", action="store_true", help="zerotrain and FSDP2 only")
    parser.add_argument("--skip-torch", "--skip-fsdp2", dest="skip_torch", action="store_true",
                        help="no torch reference jobs (DDP at stage 0, FSDP2 at stage 3)")
    parser.add_argument("--reinstall-deepspeed", action="store_true", help="rebuild DeepSpeed's venv")
    parser.add_argument("--ds-venv", default=str(common.DS_VENV), help="DeepSpeed's venv (default benchmarks/.ds-venv)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3, quick 1)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per job (default 5, quick 3)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps per job (default 2, quick 1)")
    parser.add_argument("--micro", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--embd", type=int, default=512)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--clip", type=float, default=1.0, help="gradient_clipping, the same on every side")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--src", default=str(SRC), help="zerotrain source tree to benchmark (default: this repo's src/)")
    parser.add_argument("--json", default=None, help="also write the raw results here")
    # worker mode (set by the parent)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--stage", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        worker(args)
        return 0

    common.DS_VENV = Path(args.ds_venv).resolve()
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.steps = args.steps or (3 if args.quick else 5)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
    stages = [int(s) for s in args.stages.split(",") if s.strip()]
    if any(s not in (0, 1, 2, 3) for s in stages):
        parser.error("--stages takes stages among 0,1,2,3")
    t0 = time.perf_counter()

    ds_py, ds_state = None, "skipped (--skip-deepspeed)"
    if not args.skip_deepspeed:
        ds_py = ensure_deepspeed(args.reinstall_deepspeed)
        if ds_py is not None and not warm_deepspeed(ds_py):
            ds_py = None
        if ds_py is None:
            ds_state = "could not be installed or started: zerotrain and FSDP2 only"
            say("DeepSpeed is unavailable: running the zerotrain and FSDP2 part alone.")
        else:
            ver = run_quiet([ds_py, "-c", "import deepspeed; print(deepspeed.__version__)"],
                            env=venv_env(common.DS_VENV)).stdout.strip().splitlines()[-1]
            ds_state = f"{ver} (venv {_short(common.DS_VENV)}, torch_adam)"

    jobs = []
    for s in stages:
        jobs.append(("zerotrain", s, Path(sys.executable)))
        if ds_py is not None:
            jobs.append(("deepspeed", s, ds_py))
        if s in TORCH_REFERENCE and not args.skip_torch:
            jobs.append((TORCH_REFERENCE[s], s, Path(sys.executable)))
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="compare_zero-") as tmp:
        log_dir = Path(tmp)
        # A copy of the source taken now: edits made to src/ while the run goes on cannot mix
        # two versions of zerotrain into one table.
        src = log_dir / "src"
        shutil.copytree(Path(args.src).resolve(), src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        say(f"zerotrain: {describe(Path(args.src).resolve())}")
        for rnd in range(args.rounds):
            say(f"round {rnd + 1}/{args.rounds}")
            # alternate which framework goes first at each stage, so neither always follows the other
            order = jobs if rnd % 2 == 0 else [j for s in stages for j in reversed([j for j in jobs if j[1] == s])]
            for framework, stage, py in order:
                res = run_job(py, framework, stage, args, log_dir, src)
                if res is not None:
                    res["round"] = rnd
                    results.setdefault((framework, stage), []).append(res)
    ok = report(results, stages, args, ds_state)
    if args.json:
        Path(args.json).write_text(json.dumps({f"{k[0]}-s{k[1]}": v for k, v in results.items()}, indent=1))
    verdict = ("not checked (no DeepSpeed results)" if not any(k[0] == "deepspeed" for k in results)
               else "yes" if ok else "no")
    print(f"\ntotal {time.perf_counter() - t0:.0f} s; all targets met: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
