"""zerotrain's tensor parallelism against DeepSpeed 0.19.8's AutoTP on the same HF model.

    python benchmarks/compare_tp.py [--quick] [--rounds 2] [--steps 6]

One HF LLaMA built from a config (same seed on both sides, so the same weights), split over
2 tensor-parallel ranks (gloo, one thread each; by default ~20M parameters, the scale of the
other benchmarks), fp32, AdamW (torch's, "torch_adam"),
clipping at 1.0, ZeRO stage 1 over the (single) data-parallel rank. The script is the same
for both: `initialize(model=..., config={... "tensor_parallel": {"autotp_size": 2}})`, then
`loss = engine(input_ids=x, labels=x).loss`, `engine.backward(loss)`, `engine.step()`; only
the import differs. zerotrain splits by the model's base_model_tp_plan on torch's DTensor;
DeepSpeed replaces the same Linear layers with its own AutoTP layers.

Jobs, each its own torchrun, interleaved round by round. Reported: median step time (barrier
to the max over ranks; and the process CPU time of a step, steadier on a shared machine),
peak RSS per rank (VmHWM over the timed steps), the losses side by side and the ratios.
DeepSpeed's venv is compare_zero.py's (benchmarks/.ds-venv), with transformers added.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import common  # noqa: E402  (paths, process and RSS helpers)
import compare_zero as cz  # noqa: E402  (DeepSpeed's venv)

TIME_TARGET = 0.9


def _model(args):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                                        intermediate_size=args.inner, num_hidden_layers=args.layers,
                                        num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                                        max_position_embeddings=args.seq, attn_implementation="sdpa"))


def worker(args) -> None:
    import torch

    torch.set_num_threads(1)
    if args.worker == "deepspeed":
        import deepspeed as engine_lib

        engine_lib.init_distributed(dist_backend="gloo")
    else:
        import zerotrain as engine_lib
    import torch.distributed as dist

    net = _model(args)
    params = sum(p.numel() for p in net.parameters())
    first = torch.randint(0, args.vocab, (args.micro * args.accum, args.seq), generator=torch.Generator().manual_seed(1000))
    with torch.no_grad():  # the unsplit model on one process, plain transformers: what step 0 must give
        reference = sum(float(net(input_ids=x, labels=x).loss) for x in first.split(args.micro)) / args.accum
    config = {"train_batch_size": args.micro * args.accum, "train_micro_batch_size_per_gpu": args.micro,
              "gradient_clipping": 1.0, "steps_per_print": 10**9, "zero_optimization": {"stage": 1},
              "optimizer": {"type": "AdamW", "params": {"lr": args.lr, "weight_decay": 0.01, "torch_adam": True}},
              "tensor_parallel": {"autotp_size": 2}}
    engine, *_ = engine_lib.initialize(model=net, model_parameters=[p for p in net.parameters()], config=config)
    reset = common.reset_peak_rss()
    times, cpu, losses = [], [], []
    for step in range(args.warmup + args.steps):
        g = torch.Generator().manual_seed(1000 + step)
        batch = torch.randint(0, args.vocab, (args.micro * args.accum, args.seq), generator=g)
        dist.barrier()
        start, cpu_start = time.perf_counter(), time.process_time()
        total = 0.0
        for x in batch.split(args.micro):
            loss = engine(input_ids=x, labels=x).loss
            engine.backward(loss)
            engine.step()
            total += float(loss) / args.accum
        if step == 0:
            first_loss = total  # the same batch as `reference`, before any update
        spent = torch.tensor([time.perf_counter() - start, time.process_time() - cpu_start], dtype=torch.float64)
        dist.all_reduce(spent, op=dist.ReduceOp.MAX)
        if step >= args.warmup:
            times.append(spent[0].item())
            cpu.append(spent[1].item())
            losses.append(total)
    mine = torch.tensor([common.status_kib("VmHWM") if reset else -1], dtype=torch.int64)
    stats = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(stats, mine)
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps({"times": times, "cpu": cpu, "losses": losses, "params": params,
                                              "first": first_loss, "reference": reference,
                                              "peak_kib": [int(t[0]) for t in stats]}))
    dist.barrier()
    dist.destroy_process_group()


# ============================================================================================
# parent
# ============================================================================================

def ensure_transformers(py: Path) -> bool:
    """DeepSpeed's venv gets the transformers this one has (the same model code on both sides)."""
    import transformers

    env = common.venv_env(common.DS_VENV)
    probe = common.run_quiet([py, "-c", "import transformers; print(transformers.__version__)"], env=env)
    if probe.returncode == 0 and probe.stdout.strip() == transformers.__version__:
        return True
    import torch

    r = common.run_quiet([py, "-m", "pip", "install", "-q", f"transformers=={transformers.__version__}",
                         f"torch=={torch.__version__}"], env=env, timeout=1200)
    if r.returncode != 0:
        common.say("DeepSpeed venv: could not install transformers:\n" + (r.stdout + r.stderr)[-1500:])
    return r.returncode == 0


def run_job(python: Path, name: str, args, log_dir: Path, src: Path) -> dict | None:
    res = common.launch_worker(python, __file__, 2, name,
                           ["--worker", name, "--steps", args.steps, "--warmup", args.warmup, "--micro", args.micro,
                               "--accum", args.accum, "--seq", args.seq, "--vocab", args.vocab, "--hidden", args.hidden,
                               "--inner", args.inner, "--layers", args.layers, "--heads", args.heads,
                               "--kv_heads", args.kv_heads, "--lr", args.lr], log_dir, src, name, timeout=3600)
    if res is None:
        return None
    common.say(f"  {name:10s} median {1000 * statistics.median(res['times']):8.1f} ms/step, peak RSS "
               f"{max(res['peak_kib']) / 1024:6.0f} MiB/rank, last loss {res['losses'][-1]:.5f}")
    return res


def report(results: dict, args, ds_state: str) -> None:
    med = {k: [statistics.median(r["times"]) for r in v] for k, v in results.items()}
    cpu = {k: [statistics.median(r["cpu"]) for r in v] for k, v in results.items()}
    peak = {k: [max(r["peak_kib"]) / 1024 for r in v] for k, v in results.items()}
    any_run = next(iter(results.values()))[0] if results else None
    print()
    if any_run:
        print(f"model: HF LLaMA {any_run['params'] / 1e6:.1f}M parameters (hidden {args.hidden}, {args.layers} layers, "
              f"{args.heads} heads / {args.kv_heads} kv, MLP {args.inner}, vocab {args.vocab}), seq {args.seq}; "
              f"tensor parallel 2, micro batch {args.micro} x {args.accum}; fp32, ZeRO 1; DeepSpeed: {ds_state}")
    print(f"{'job':10s} | {'step ms':>8} | {'CPU ms':>7} | {'peak RSS MiB/rank (max)':>23}")
    for name in results:
        print(f"{name:10s} | {1000 * statistics.median(med[name]):8.1f} | {1000 * statistics.median(cpu[name]):7.0f} | "
              f"{statistics.median(peak[name]):23.0f}")
    zt, ds = results.get("zerotrain"), results.get("deepspeed")
    if zt and ds:
        pairs = list(zip(med["zerotrain"], med["deepspeed"]))
        t_ratio = statistics.median(a / b for a, b in pairs)
        m_ratio = statistics.median(a / b for a, b in zip(peak["zerotrain"], peak["deepspeed"]))
        c_ratio = statistics.median(a / b for a, b in zip(cpu["zerotrain"], cpu["deepspeed"]))
        print(f"zerotrain / DeepSpeed: step time {t_ratio:.2f} (target <= {TIME_TARGET}; by round: "
              + ", ".join(f"{a / b:.2f}" for a, b in pairs) + f"), CPU time {c_ratio:.2f}, peak RSS {m_ratio:.2f}")
        print()
        print("loss per step: zerotrain, DeepSpeed, |difference|")
        worst = 0.0
        for i, (a, b) in enumerate(zip(zt[0]["losses"], ds[0]["losses"])):
            worst = max(worst, abs(a - b))
            print(f"  {i:3d} {a:11.6f} {b:11.6f} {abs(a - b):10.2e}")
        ref = zt[0]["reference"]
        # DeepSpeed's AutoTP forward already differs from plain transformers at step 0; the runs
        # agree when they differ by no more than twice that (or 1e-3)
        bound = max(1e-3, 2 * abs(ds[0]["first"] - ref))
        print(f"largest |difference| {worst:.1e}" + (f"  (agree: within {bound:.1e}, twice DeepSpeed's step-0 "
                                                     f"distance from plain transformers, or 1e-3)" if worst <= bound
                                                     else f"  (DO NOT agree: bound {bound:.1e})"))
        print(f"step 0 before any update (the split model's forward): plain transformers on one process {ref:.6f}, "
              f"zerotrain {zt[0]['first']:.6f} (|diff| {abs(zt[0]['first'] - ref):.1e}), DeepSpeed "
              f"{ds[0]['first']:.6f} (|diff| {abs(ds[0]['first'] - ref):.1e})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one round of few steps")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 2, quick 1)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per job (default 6, quick 3)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--micro", type=int, default=4)
    parser.add_argument("--accum", type=int, default=2)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--inner", type=int, default=1408)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv_heads", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--skip-deepspeed", action="store_true")
    parser.add_argument("--ds-venv", default=str(common.DS_VENV), help="DeepSpeed's venv (default benchmarks/.ds-venv)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0
    common.DS_VENV = Path(args.ds_venv)
    args.rounds = args.rounds or (1 if args.quick else 2)
    args.steps = args.steps or (3 if args.quick else 6)
    t0 = time.perf_counter()
    ds_py, ds_state = None, "skipped"
    if not args.skip_deepspeed:
        ds_py = cz.ensure_deepspeed()
        if ds_py is not None and ensure_transformers(ds_py) and cz.warm_deepspeed(ds_py):
            ds_state = common.run_quiet([ds_py, "-c", "import deepspeed; print(deepspeed.__version__)"],
                                        env=common.venv_env(common.DS_VENV)).stdout.strip().splitlines()[-1]
        else:
            ds_py, ds_state = None, "unavailable"
    jobs = [("zerotrain", Path(sys.executable))] + ([("deepspeed", ds_py)] if ds_py is not None else [])
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="compare_tp-") as tmp:
        src = Path(tmp) / "src"
        import shutil

        shutil.copytree(common.SRC, src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        common.say(f"zerotrain: {common.describe(common.SRC)}")
        for rnd in range(args.rounds):
            common.say(f"round {rnd + 1}/{args.rounds}")
            for name, py in (jobs if rnd % 2 == 0 else jobs[::-1]):
                res = run_job(py, name, args, Path(tmp), src)
                if res is not None:
                    results.setdefault(name, []).append(res)
    report(results, args, ds_state)
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
