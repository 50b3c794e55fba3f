"""One short pass over zerotrain's CUDA paths, on a machine with a CUDA GPU.

    python3 harness/gpu_check.py --out DIR     on the GPU machine: about 2-3 minutes
    python harness/gpu_check.py --dry-run      here, on CPU and gloo: the script's own logic

Every case is its own 1-rank torchrun job on NCCL (a world of one: the engine's collectives
are skipped, so this checks the GPU paths, not the reductions), training a GPT-2-small-sized model
(124M parameters, 16 x 1024 tokens per step) in bf16:

    s0, s2, s3         ZeRO stage 0, 2 and 3 with torch's fused AdamW on the GPU
    s2-offload         stage 2, optimizer in pinned host memory: it steps on the CPU
    s3-offload         stage 3, parameters offloaded to pinned host memory as well

Each job checks what its case is there to exercise: the backend is NCCL, parameters compute
in bf16 on the GPU, the GPU optimizer is the fused kernel, an offloaded optimizer steps on
the host with its fp32 masters pinned, and the loss falls on a repeated batch (a gradient
copied out of the GPU and read before it arrived would show there, and in the offloaded
cases' losses, which must follow those of the same stage on the GPU). It reports tokens
per second, model FLOPs utilisation (6N + 12 L d T FLOPs per token, against the chip's dense
bf16 peak: 989 TFLOP/s on an H100 or H200) and peak GPU memory. The exit status is non-zero
when a check fails.

The GPU machine's python3 holds a CUDA torch but not pydantic. Its wheels travel in `.whl`
(ignored by git); fetch them once, here, with
    python -m pip download --no-deps --only-binary=:all: --python-version 3.12 \\
        --implementation cp --platform manylinux2014_x86_64 -d .whl \\
        pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
then copy `.whl` to the GPU machine along with the tree and run (it finishes within 7 minutes):
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl &&
    PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 python3 harness/gpu_check.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from common import free_port  # noqa: E402

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"

PINNED = {"device": "cpu", "pin_memory": True}
CASES = {
    "s0": {"stage": 0},
    "s2": {"stage": 2},
    "s3": {"stage": 3},
    "s2-offload": {"stage": 2, "offload_optimizer": PINNED},
    "s3-offload": {"stage": 3, "offload_optimizer": PINNED, "offload_param": PINNED},
}
# dense bf16 peak, TFLOP/s, by a name the device reports
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0}
LOSS_GAP = 0.05  # between a case and its offloaded twin, any step; losses start near 10.8

FULL = dict(vocab=50304, seq=1024, embd=768, layers=12, heads=12, micro=16, warmup=3, steps=20)
TINY = dict(vocab=256, seq=64, embd=64, layers=2, heads=2, micro=2, warmup=1, steps=6)


# ============================================================================================
# worker: one case, one rank
# ============================================================================================

def worker(args) -> None:
    sys.path.insert(0, str(SRC))
    import torch
    import torch.distributed as dist

    import zerotrain
    from zerotrain.models import GPT, GPTConfig

    size = TINY if args.dry_run else FULL
    cuda = torch.cuda.is_available()
    zero = CASES[args.case]
    config = {
        "train_micro_batch_size_per_gpu": size["micro"],
        "gradient_clipping": 1.0,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.01}},
        "zero_optimization": zero,
        "steps_per_print": 10**9,
    }
    # a world of one skips every collective inside the engine; joining the group here at
    # least brings NCCL up, and one all-reduce shows it answers
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if cuda else "gloo")
    probe = torch.ones(4, device="cuda" if cuda else "cpu")
    dist.all_reduce(probe)
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=size["vocab"], n_positions=size["seq"], n_embd=size["embd"],
                    n_layer=size["layers"], n_head=size["heads"])
    model = GPT(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    engine, *_ = zerotrain.initialize(model=model, config=config)
    device = engine.device

    checks: list[tuple[str, bool, str]] = []

    def check(name: str, ok: bool, detail: str) -> None:
        checks.append((name, bool(ok), detail))

    backend = dist.get_backend()
    check("backend", backend == ("nccl" if cuda else "gloo") and probe.sum().item() == 4, backend)
    check("compute", engine.compute_dtype == torch.bfloat16 and device.type == ("cuda" if cuda else "cpu"),
          f"{engine.compute_dtype} on {device}")
    opt = engine.optimizer
    first = opt.param_groups[0]["params"][0]
    kernel = "fused" if opt.defaults.get("fused") else "foreach" if opt.defaults.get("foreach") else "loop"
    offloaded = "offload_optimizer" in zero

    # a few fixed batches, repeated: the loss must fall as the model learns them
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, cfg.vocab_size, (size["micro"], size["seq"]), generator=g).to(device)
               for _ in range(2)]

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    losses, times = [], []
    for i in range(size["warmup"] + size["steps"]):
        x = batches[i % len(batches)]
        sync()
        start = time.perf_counter()
        loss = engine(x, labels=x)
        engine.backward(loss)
        engine.step()
        sync()
        if i >= size["warmup"]:
            times.append(time.perf_counter() - start)
        losses.append(loss.item())

    state = [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t) and t.numel() > 1]
    where = {str(t.device) for t in state}
    if offloaded:
        check("optimizer on host", first.device.type == "cpu" and where == {"cpu"},
              f"master on {first.device}, state on {sorted(where)}, {kernel} kernel")
        if cuda:  # the masters travel to the GPU after every step; the state stays put
            check("masters pinned", first.is_pinned(), f"is_pinned() {first.is_pinned()}")
    else:
        check("fused optimizer on device", kernel == "fused" or not cuda,
              f"{kernel} kernel, state on {sorted(where)}")
    early, late = statistics.mean(losses[:2]), statistics.mean(losses[-2:])
    check("loss falls", all(map(math.isfinite, losses)) and late < early, f"{early:.3f} -> {late:.3f}")

    step_s = statistics.median(times)
    tokens = size["micro"] * size["seq"]
    flops_per_token = 6 * n_params + 12 * cfg.n_layer * cfg.n_embd * cfg.n_positions
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    peak = args.peak_tflops or next((v for k, v in PEAK_TFLOPS.items() if k in name), None)
    result = {
        "case": args.case, "device": name, "torch": torch.__version__, "params": n_params,
        "step_ms": step_s * 1e3, "tokens_per_s": tokens / step_s,
        "mfu": tokens / step_s * flops_per_token / (peak * 1e12) if peak and cuda else None,
        "peak_gpu_mib": torch.cuda.max_memory_allocated(device) / 2**20 if cuda else None,
        "breakdown": engine.memory_breakdown(), "losses": losses, "checks": checks,
    }
    Path(args.result).write_text(json.dumps(result))
    engine.destroy()
    dist.destroy_process_group()


# ============================================================================================
# parent: the cases one by one, then the table
# ============================================================================================

def run_case(case: str, args, out: Path) -> dict:
    result = out / f"gpu_check-{case}.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1",
           "--master_port", str(free_port()), __file__, "--worker", "--case", case, "--result", str(result)]
    if args.dry_run:
        cmd.append("--dry-run")
    if args.peak_tflops:
        cmd += ["--peak-tflops", str(args.peak_tflops)]
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "8"))
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"case": case, "error": f"no result within {args.timeout} s"}
    if proc.returncode != 0 or not result.exists():
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-25:])
        return {"case": case, "error": f"exit {proc.returncode}:\n{tail}"}
    res = json.loads(result.read_text())
    res["wall_s"] = time.perf_counter() - start
    return res


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny model: checks the script itself, on CPU too")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--out", default=None, help="where the per-case JSON and the summary go (default: a temp dir)")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the chip's peak, if its name is not known")
    parser.add_argument("--timeout", type=int, default=150, help="seconds per case")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--case", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0

    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        parser.error(f"unknown case {unknown[0]!r}; choose from {', '.join(CASES)}")
    import torch

    out = Path(args.out or tempfile.mkdtemp(prefix="gpu_check-"))
    out.mkdir(parents=True, exist_ok=True)
    if not torch.cuda.is_available() and not args.dry_run:
        print("gpu_check: no CUDA device here; --dry-run checks the script on CPU", file=sys.stderr)
        return 2
    print(f"torch {torch.__version__}, "
          + (f"{torch.cuda.get_device_name()}, NCCL {torch.cuda.nccl.version()}"
             if torch.cuda.is_available() else "no CUDA: dry run on CPU and gloo"), flush=True)

    results, failed = [], 0
    for case in cases:
        res = run_case(case, args, out)
        results.append(res)
        if "error" in res:
            failed += 1
            print(f"{case:11s} FAILED: {res['error']}", flush=True)
            continue
        mfu = f"{100 * res['mfu']:.1f}%" if res["mfu"] is not None else "n/a"
        mem = f"{res['peak_gpu_mib']:.0f} MiB" if res["peak_gpu_mib"] is not None else "n/a"
        print(f"{case:11s} {res['step_ms']:8.1f} ms/step  {res['tokens_per_s']:10.0f} tokens/s  MFU {mfu:>6s}  "
              f"peak GPU {mem}  ({res['wall_s']:.0f} s)", flush=True)
        for name, ok, detail in res["checks"]:
            failed += not ok
            print(f"    {'ok  ' if ok else 'FAIL'} {name}: {detail}")
    # offload moves where the optimizer steps, not what it computes: the losses must track
    # the same stage on the device (bf16 rounding apart)
    done = {r["case"]: r for r in results if "error" not in r}
    for on_device, offloaded in (("s2", "s2-offload"), ("s3", "s3-offload")):
        if on_device in done and offloaded in done:
            gap = max(abs(a - b) for a, b in zip(done[on_device]["losses"], done[offloaded]["losses"]))
            ok = gap <= LOSS_GAP
            failed += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {offloaded} follows {on_device}: largest loss gap {gap:.4f} "
                  f"(at most {LOSS_GAP})")
    (out / "gpu_check-summary.json").write_text(json.dumps(results, indent=1))
    print(f"{'all checks passed' if not failed else f'{failed} check(s) failed'}; results in {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
