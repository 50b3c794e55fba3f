"""zerotrain's pipeline against DeepSpeed's PipelineModule / PipelineEngine, side by side.

    python benchmarks/compare_pipeline.py [--quick] [--rounds 2] [--schedules 1f1b,gpipe,interleaved_1f1b]

One GPT written as pipeline layers (a tied token embedding, positions, zerotrain's PreLNBlock
x L, a final LayerNorm, the tied head), cut into 2 stages by parameter count (DeepSpeed's default), on 4 ranks:
data parallel 2 x pipeline 2 (gloo, one thread each), fp32, AdamW (torch's, "torch_adam" on
both), clipping at 1.0, ZeRO stage 0, micro batch x gradient_accumulation_steps micro-batches
per pipeline, seed_layers=True so both frameworks start from the same weights. The script is
the same for both: `PipelineModule(layers, num_stages=2, loss_fn=...)`, `initialize`,
`engine.train_batch(data_iter)`, only the import differs.

Jobs, each its own torchrun, interleaved round by round: zerotrain (1f1b), DeepSpeed, the
compute floor (each rank's stage forward, backward and fused AdamW step with no communication at
all, the four ranks at once: no engine's step can be shorter; zerotrain's and DeepSpeed's step
times are printed as multiples of it), then zerotrain with a sequence-length curriculum (which DeepSpeed's pipeline engine cannot run:
it never passes curriculum_seqlen and its buffers keep the first shape), and zerotrain under
each extra schedule of --schedules. Reported: median step time (barrier to the max over
ranks; and the process CPU time of a step, steadier on a shared machine), peak RSS per rank
(VmHWM), the losses side by side; the bubble of each stage, the
share of the step a stage does not compute (1 - its forward/backward seconds / step time),
against the schedule's theory (p-1)/(m+p-1) for GPipe and 1F1B, (p-1)/(v m+p-1) interleaved;
and what a new sequence length costs (the first step at a length builds torch's stages for it
and runs their shape pass) against a step at a length seen before. DeepSpeed's venv is made as
compare_zero.py makes it. Four ranks share this machine's cores, so while one stage computes
the other may be waiting for a core: the bubble figures are an upper bound of the schedule's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import common  # noqa: E402  (paths, process and RSS helpers)
import compare_zero as cz  # noqa: E402  (DeepSpeed's venv)

TIME_TARGET, RSS_TARGET = 0.9, 1.0
THEORY = {"1f1b": 1, "gpipe": 1, "interleaved_1f1b": 2, "looped_bfs": 2, "interleaved_zero_bubble": 2}


# ============================================================================================
# worker: one framework on every rank of a torchrun job
# ============================================================================================

def _layers(framework: str, args):
    import torch
    import torch.nn.functional as F
    from torch import nn

    if framework == "deepspeed" and "zerotrain" not in sys.modules:
        pkg = types.ModuleType("zerotrain")  # zerotrain's model files only, not its engine
        pkg.__path__ = [str(Path(os.environ.get("COMPARE_ZERO_SRC", common.SRC)) / "zerotrain")]
        sys.modules["zerotrain"] = pkg
    from zerotrain.models.block import PreLNBlock

    if framework == "deepspeed":
        from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec
    else:
        from zerotrain.pipe import LayerSpec, PipelineModule, TiedLayerSpec

    class TokenEmbed(nn.Embedding):
        def __init__(self, vocab, dim):
            super().__init__(vocab, dim)
            nn.init.normal_(self.weight, std=0.02)

    class AddPositions(nn.Module):
        def __init__(self, positions, dim):
            super().__init__()
            self.pos = nn.Embedding(positions, dim)
            nn.init.normal_(self.pos.weight, std=0.02)

        def forward(self, x):
            return x + self.pos(torch.arange(x.shape[1], device=x.device))

    def head(embed, x):
        return x @ embed.weight.t()

    def loss_fn(out, labels):
        return F.cross_entropy(out.flatten(0, 1).float(), F.pad(labels[:, 1:], (0, 1), value=-100).flatten())

    specs = ([TiedLayerSpec("embed", TokenEmbed, args.vocab, args.embd), LayerSpec(AddPositions, args.seq, args.embd)]
             + [LayerSpec(PreLNBlock, args.embd, args.heads, 0.0, True) for _ in range(args.layers)]
             + [LayerSpec(nn.LayerNorm, args.embd), TiedLayerSpec("embed", TokenEmbed, args.vocab, args.embd, forward_fn=head)])
    extra = {}
    if framework == "zerotrain" and THEORY.get(args.schedule, 1) > 1:
        extra = {"virtual_stages": THEORY[args.schedule]}
    # DeepSpeed 0.19.8's own seeding fails here: its balanced partition yields numpy integers,
    # which random.seed refuses on Python >= 3.11; the same seeding, given as seed_fn, on both
    return PipelineModule(specs, num_stages=2, loss_fn=loss_fn, seed_layers=True, seed_fn=_seed_all, base_seed=1234,
                          partition_method="parameters", **extra)


def _seed_all(seed) -> None:
    import random

    import numpy as np
    import torch

    random.seed(int(seed))
    np.random.seed(int(seed))
    torch.manual_seed(int(seed))


def floor_worker(args) -> None:
    """The compute floor of a pipeline step: each rank runs its own stage's forward and backward
    for its m micro-batches and a fused AdamW step, with no communication at all (no activations
    or gradients sent, no tied or data-parallel all-reduce), the four ranks at once on the same
    cores as the real jobs. No pipeline engine can take a step in less time than this."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    net = _layers("zerotrain", args)  # zerotrain's PipelineModule: the same cut into stages
    stage = net.stages()[0]
    params = [p for p in stage.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01, fused=True)
    last = stage.index == net.num_stages - 1
    g = torch.Generator().manual_seed(0)
    act = torch.randn(args.micro, args.seq, args.embd, generator=g)
    times, cpu = [], []
    for step in range(args.warmup + args.steps):
        ids = torch.randint(0, args.vocab, (args.accum, args.micro, args.seq), generator=g)
        dist.barrier()
        start, cpu_start = time.perf_counter(), time.process_time()
        for x in ids:
            if last:  # the input's gradient too: a real last stage sends it back
                net.loss_fn(stage(act.clone().requires_grad_()), x).backward()
            else:
                out = stage(x)
                out.backward(act)
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        spent = torch.tensor([time.perf_counter() - start, time.process_time() - cpu_start], dtype=torch.float64)
        dist.all_reduce(spent, op=dist.ReduceOp.MAX)
        if step >= args.warmup:
            times.append(spent[0].item())
            cpu.append(spent[1].item())
    peak = torch.tensor([common.status_kib("VmHWM")], dtype=torch.int64)
    peaks = [torch.zeros_like(peak) for _ in range(dist.get_world_size())]
    dist.all_gather(peaks, peak)
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps({"times": times, "cpu": cpu, "losses": [], "peak_kib": [int(t) for t in peaks],
                                              "params": sum(p.numel() for p in params)}))
    dist.barrier()
    dist.destroy_process_group()


def worker(args) -> None:
    import torch

    if args.worker == "floor":
        floor_worker(args)
        return
    torch.set_num_threads(1)
    t_init = time.perf_counter()
    if args.worker == "deepspeed":
        import deepspeed as engine_lib

        engine_lib.init_distributed(dist_backend="gloo")
    else:
        import zerotrain as engine_lib
        from zerotrain.features.engine_methods import curriculum_seqlen
    import torch.distributed as dist

    net = _layers(args.worker, args)
    world, rank = dist.get_world_size(), dist.get_rank()
    dp = world // 2
    config = {"train_batch_size": args.micro * args.accum * dp, "train_micro_batch_size_per_gpu": args.micro,
              "gradient_clipping": 1.0, "steps_per_print": 10**9, "zero_optimization": {"stage": 0},
              "optimizer": {"type": "AdamW", "params": {"lr": args.lr, "weight_decay": 0.01, "torch_adam": True}}}
    if args.curriculum:
        config["curriculum_learning"] = {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": 16,
                                         "max_difficulty": args.seq, "schedule_type": "fixed_linear",
                                         "schedule_config": {"total_curriculum_step": args.curriculum,
                                                             "difficulty_step": 16}}
        args.warmup, args.steps = 0, args.curriculum + 2  # every length, each about twice, then the top
    if args.worker == "zerotrain":
        virtual = THEORY.get(args.schedule, 1)
        config["pipeline"] = {"schedule": args.schedule, "virtual_stages": virtual}
    params = [p for p in net.parameters() if p.requires_grad]
    engine, *_ = engine_lib.initialize(model=net, model_parameters=params, config=config)
    init_s, init_hwm = time.perf_counter() - t_init, common.status_kib("VmHWM")
    reset = common.reset_peak_rss()
    d = engine.grid.get_data_parallel_id()
    times, cpu, losses, busy, lengths, new = [], [], [], [], [], []
    for step in range(args.warmup + args.steps):
        g = torch.Generator().manual_seed(1000 + step)
        batch = torch.randint(0, args.vocab, (args.micro * args.accum * dp, args.seq), generator=g)
        mine = batch[d * args.micro * args.accum:(d + 1) * args.micro * args.accum].split(args.micro)
        built = engine._stages.built if args.worker == "zerotrain" else 0
        dist.barrier()
        start, cpu_start = time.perf_counter(), time.process_time()
        loss = engine.train_batch(iter([(x, x) for x in mine]))
        spent = torch.tensor([time.perf_counter() - start, time.process_time() - cpu_start], dtype=torch.float64)
        dist.all_reduce(spent, op=dist.ReduceOp.MAX)
        if step >= args.warmup:
            times.append(spent[0].item())
            cpu.append(spent[1].item())
            losses.append(float(loss))
            if args.worker == "zerotrain":
                busy.append((engine.stage_busy_s, engine.stage_run_s))
                lengths.append(curriculum_seqlen(engine) or args.seq)
                new.append(engine._stages.built != built)
    mine_stats = torch.tensor([common.status_kib("VmHWM"), common.status_kib("VmHWM") if reset else -1, init_hwm],
                              dtype=torch.int64)
    stats = [torch.zeros_like(mine_stats) for _ in range(world)]
    dist.all_gather(stats, mine_stats)
    gathered = [None] * world
    dist.all_gather_object(gathered, busy)
    stage = engine.grid.get_stage_id()
    stages = [None] * world
    dist.all_gather_object(stages, stage)
    if rank == 0:
        Path(args.out).write_text(json.dumps({
            "times": times, "cpu": cpu, "losses": losses, "busy": gathered, "stages": stages, "lengths": lengths, "new": new,
            "init_s": init_s, "peak_kib": [int(t[0]) for t in stats], "train_peak_kib": [int(t[1]) for t in stats],
            "params": sum(p.numel() for p in params)}))
    dist.barrier()
    dist.destroy_process_group()


# ============================================================================================
# parent
# ============================================================================================

def run_job(python: Path, name: str, framework: str, args, log_dir: Path, src: Path, curriculum: int = 0,
            schedule: str = "1f1b") -> dict | None:
    res = common.launch_worker(python, __file__, 4, framework,
                           ["--worker", framework, "--steps", args.steps, "--warmup", args.warmup,
                               "--micro", args.micro, "--accum", args.accum, "--seq", args.seq, "--vocab", args.vocab,
                               "--embd", args.embd, "--layers", args.layers, "--heads", args.heads, "--lr", args.lr,
                               "--curriculum", curriculum, "--schedule", schedule], log_dir, src, name, timeout=3600)
    if res is None:
        return None
    last = f", last loss {res['losses'][-1]:.5f}" if res["losses"] else ""
    common.say(f"  {name:22s} median {1000 * statistics.median(res['times']):8.1f} ms/step, peak RSS "
               f"{max(res['peak_kib']) / 1024:6.0f} MiB/rank{last}")
    return res


def bubble_lines(res: dict, schedule: str, m: int) -> list[str]:
    p, v = 2, THEORY.get(schedule, 1)
    theory = (p - 1) / (v * m + p - 1)
    lines = []
    for stage in (0, 1):
        idle = [1 - b / t for rank, busy in enumerate(res["busy"]) if res["stages"][rank] == stage for b, t in busy]
        lines.append(f"  {schedule:24s} stage {stage}: idle {100 * statistics.median(idle):5.1f}% of the run "
                     f"(theory {100 * theory:4.1f}%, m={m}, p={p}" + (f", v={v})" if v > 1 else ")"))
    return lines


def report(results: dict, args, ds_state: str) -> bool:
    med = {k: [statistics.median(r["times"]) for r in v] for k, v in results.items()}
    cpu = {k: [statistics.median(r["cpu"]) for r in v] for k, v in results.items()}
    peak = {k: [max(r["peak_kib"]) / 1024 for r in v] for k, v in results.items()}
    zt, ds = results.get("zerotrain"), results.get("deepspeed")
    any_run = zt or ds
    print()
    if any_run:
        print(f"model: {any_run[0]['params'] / 1e6:.1f}M parameters (tied embedding counted per stage), vocab "
              f"{args.vocab}, n_embd {args.embd}, {args.layers} blocks, seq {args.seq}; 2 stages x 2 data-parallel "
              f"ranks, micro batch {args.micro} x {args.accum} micro-batches; fp32, ZeRO 0; DeepSpeed: {ds_state}")
    print(f"{'job':26s} | {'step ms':>8} | {'CPU ms':>7} | {'peak RSS MiB/rank (max)':>23} | per-rank peak (last round)")
    for name, runs in results.items():
        print(f"{name:26s} | {1000 * statistics.median(med[name]):8.1f} | {1000 * statistics.median(cpu[name]):7.0f} | "
              f"{statistics.median(peak[name]):23.0f} | " + ", ".join(f"{k / 1024:.0f}" for k in runs[-1]["peak_kib"]))
    ok = True
    if zt and ds:
        pairs = list(zip(med["zerotrain"], med["deepspeed"]))
        t_ratio = statistics.median(a / b for a, b in pairs)
        m_ratio = statistics.median(a / b for a, b in zip(peak["zerotrain"], peak["deepspeed"]))
        print(f"zerotrain / DeepSpeed: step time {t_ratio:.2f} (target <= {TIME_TARGET}; by round: "
              + ", ".join(f"{a / b:.2f}" for a, b in pairs) + f"), peak RSS {m_ratio:.2f} (target <= {RSS_TARGET})")
        c_ratio = statistics.median(a / b for a, b in zip(cpu["zerotrain"], cpu["deepspeed"]))
        print(f"  CPU time per step (process CPU incl. comm threads, max over ranks; steadier than wall time on a "
              f"shared machine): {c_ratio:.2f}")
        ok = t_ratio <= TIME_TARGET and m_ratio <= RSS_TARGET
        if results.get("floor"):
            fl = med["floor"]
            z_fl = statistics.median(a / b for a, b in zip(med["zerotrain"], fl))
            d_fl = statistics.median(a / b for a, b in zip(med["deepspeed"], fl))
            print(f"  the compute floor (each stage's forward, backward and optimizer step, no communication, the "
                  f"four ranks at once): zerotrain {z_fl:.2f}x it, DeepSpeed {d_fl:.2f}x it; the best step-time "
                  f"ratio any engine could reach here, floor / DeepSpeed: {1 / d_fl:.2f}")
        print()
        print("loss per step: zerotrain, DeepSpeed, |difference|")
        worst = 0.0
        for i, (a, b) in enumerate(zip(zt[0]["losses"], ds[0]["losses"])):
            worst = max(worst, abs(a - b))
            print(f"  {i:3d} {a:11.6f} {b:11.6f} {abs(a - b):10.2e}")
        print(f"largest |difference| {worst:.1e}" + ("  (agree)" if worst < 1e-3 else "  (DO NOT agree)"))
        ok &= worst < 1e-3
    cur = results.get("zerotrain+curriculum")
    if cur:
        r = cur[0]
        print()
        print("zerotrain with a seqlen curriculum (16 -> seq in steps of 16): step, length, new stages?, ms, loss")
        for i, (n, new, t, loss) in enumerate(zip(r["lengths"], r["new"], r["times"], r["losses"])):
            print(f"  {i:3d} {n:5d} {'new' if new else '   '} {1000 * t:8.1f} {loss:10.5f}")
        firsts = {n: t for n, new, t in zip(r["lengths"], r["new"], r["times"]) if new}
        again = {}
        for n, new, t in zip(r["lengths"], r["new"], r["times"]):
            if not new:
                again.setdefault(n, []).append(t)
        costs = [firsts[n] - statistics.median(again[n]) for n in firsts if n in again]
        if costs:
            print(f"a new length costs {1000 * statistics.median(costs):.1f} ms once (first step at a length minus "
                  f"the median of later steps at it, over {len(costs)} lengths)")
    print()
    print("bubble: the share of the schedule's run (forward and backward of every micro-batch) that a stage does")
    print("not compute (median over steps and the stage's ranks)")
    for name, runs in results.items():
        if name.startswith("zerotrain") and "curriculum" not in name:
            for line in bubble_lines(runs[0], name.split(":")[1] if ":" in name else "1f1b", args.accum):
                print(line)
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one round of few steps")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 2, quick 1)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per job (default 6, quick 3)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--micro", type=int, default=2)
    parser.add_argument("--accum", type=int, default=4, help="micro-batches per step (m)")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--embd", type=int, default=384)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--schedules", default="", help="extra zerotrain schedules for the bubble, e.g. gpipe,interleaved_1f1b")
    parser.add_argument("--skip-deepspeed", action="store_true")
    parser.add_argument("--json", default=None)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--curriculum", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--schedule", default="1f1b", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0
    args.rounds = args.rounds or (1 if args.quick else 2)
    args.steps = args.steps or (3 if args.quick else 6)
    t0 = time.perf_counter()
    ds_py, ds_state = None, "skipped"
    if not args.skip_deepspeed:
        ds_py = cz.ensure_deepspeed()
        if ds_py is not None and cz.warm_deepspeed(ds_py):
            ds_state = common.run_quiet([ds_py, "-c", "import deepspeed; print(deepspeed.__version__)"],
                                        env=common.venv_env(common.DS_VENV)).stdout.strip().splitlines()[-1]
        else:
            ds_py, ds_state = None, "unavailable"
    here = Path(sys.executable)
    jobs = [("zerotrain", "zerotrain", here, 0, "1f1b")]
    if ds_py is not None:
        jobs.append(("deepspeed", "deepspeed", ds_py, 0, "1f1b"))
    jobs.append(("floor", "floor", here, 0, "1f1b"))
    jobs.append(("zerotrain+curriculum", "zerotrain", here, 2 * ((args.seq - 16) // 16 + 1), "1f1b"))
    jobs += [(f"zerotrain:{s}", "zerotrain", here, 0, s) for s in args.schedules.split(",") if s.strip()]
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="compare_pipeline-") as tmp:
        src = Path(tmp) / "src"
        import shutil

        shutil.copytree(common.SRC, src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        common.say(f"zerotrain: {common.describe(common.SRC)}")
        for rnd in range(args.rounds):
            common.say(f"round {rnd + 1}/{args.rounds}")
            for name, framework, py, curriculum, schedule in (jobs if rnd % 2 == 0 else jobs[1::-1] + jobs[2:]):
                if curriculum and rnd:
                    continue  # one curriculum run is enough: it reports per length, not a median
                res = run_job(py, name, framework, args, Path(tmp), src, curriculum, schedule)
                if res is not None:
                    results.setdefault(name, []).append(res)
    ok = report(results, args, ds_state)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    print(f"\ntotal {time.perf_counter() - t0:.0f} s; targets met: "
          f"{'not checked' if 'deepspeed' not in results else 'yes' if ok else 'no'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
