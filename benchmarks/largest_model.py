"""The largest GPT each framework trains on 2 ranks of this machine.

    python benchmarks/largest_model.py [--frameworks ddp,zerotrain,zerotrain-nvme,deepspeed-nvme]
        [--max-layers N] [--budget-gib G] [--nvme-path DIR] [--quick]

The model: zerotrain's GPT of width 2048 (16 heads, vocabulary 8192, 64 positions; a layer is
50.4M parameters, the embeddings 16.9M), bf16, AdamW (lr 1e-4, weight decay 0.01), clipping at
1.0, micro batch 1 x 64 tokens per rank, 2 ranks on gloo with one thread each. Frameworks:

  ddp              torch's DistributedDataParallel on a bf16 model, fused AdamW (foreach where
                   fused is not available), bf16 moments: the floor of data parallelism
  zerotrain        zerotrain ZeRO stage 3, nothing offloaded, built under zerotrain.zero.Init()
  zerotrain-nvme   the same with offload_param and offload_optimizer on nvme
  deepspeed-nvme   DeepSpeed 0.19.8 ZeRO-Infinity, the same config, built under
                   deepspeed.zero.Init() (its venv as compare_zero.py makes it)

For each, the layer count grows by doubling from --start-layers until a probe does not fit (or
--max-layers is reached), then is bisected to the exact largest count. Each probe is its own
torchrun job that builds the model, initialises the engine and trains --steps steps (3: with
the masters in NVMe zerotrain's optimizer step runs behind the next forward, so the third step
is the first whose time holds a whole steady optimizer step, state read and written).

Memory safety (the machine is shared): each rank runs under a budget, by default (MemAvailable
at start - 3 GiB) / 2, enforced by a watchdog thread started before torch is imported, which reads
/proc/self/statm every 0.1 s and leaves the process with exit code 86 once its resident memory
passes the budget: such a probe "does not fit". Beside that, the parent kills a probe whole
whenever the machine's MemAvailable falls under 1 GiB (someone else's job may be the cause: that
probe is reported as aborted, and counted as not fitting). No probe should ever meet the kernel's
OOM killer.

Reported per framework at its largest size: layers, parameters, peak RSS per rank (VmHWM at the
end), seconds per step (the last step, max over ranks, between barriers), and for the NVMe runs
the traffic of that step to the disk (bytes read from and written to storage by both ranks,
/proc/self/io read_bytes/write_bytes: page-cache hits are not disk traffic) as GB/s, next to
the disk's own sequential figures (a --disk-test-gib file written and read back by dd with
O_DIRECT in the nvme folder). "Disk busy" is the share of the step the disk would need for that
traffic at its sequential speed: read_bytes / seq_read + write_bytes / seq_write over the step.

Targets: zerotrain's largest >= 3B parameters and >= 1.5x DeepSpeed's largest; at
DeepSpeed's largest size zerotrain-nvme's step time <= 0.9x DeepSpeed's (one extra job at that
size when the search did not probe it); disk busy >= 70% in the NVMe step.

DeepSpeed's NVMe path needs libaio (Debian: `apt-get install -y libaio-dev`); its async_io and
cpu_adam ops are JIT-compiled once, with a check write/read through an aio handle, before any
job runs, so no compile time lands in a timing.

--quick: width 512, from 2 layers to at most 32, bisection to 2 layers, a 1.0 GiB budget per
rank unless given, a 0.5 GiB disk test: the script end to end (every path, the over-budget exit
included) in minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (paths, processes, memory)
from common import say  # noqa: E402

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
GIB = 1 << 30
OVER_BUDGET = 86  # a rank's exit code when its watchdog finds it over budget
LOW_MEMORY_FLOOR = 1 * GIB  # the parent kills a probe when MemAvailable falls under this
RESERVE = 3 * GIB  # left to the machine when the default budget is computed
FRAMEWORKS = ("ddp", "zerotrain", "zerotrain-nvme", "deepspeed-nvme")
NVME = ("zerotrain-nvme", "deepspeed-nvme")
# targets: zerotrain's largest size, its ratio to DeepSpeed's, step time at DeepSpeed's size, disk busy
MIN_PARAMS, OVER_DS, TIME_TARGET, DISK_TARGET = 3e9, 1.5, 0.9, 0.7


# ============================================================================================
# worker: one rank of a probe
# ============================================================================================

def start_watchdog(budget: int, marker: Path) -> None:
    """Leave the process (exit code OVER_BUDGET) once its resident memory passes `budget` bytes.
    Reads /proc/self/statm (pages) every 0.1 s; os._exit, so no cleanup can allocate more."""
    page = os.sysconf("SC_PAGE_SIZE")

    def watch() -> None:
        with open("/proc/self/statm") as f:
            while True:
                f.seek(0)
                rss = int(f.read().split()[1]) * page
                if rss > budget:
                    try:
                        marker.write_text(f"{rss}\n")
                        os.write(2, f"over budget: RSS {rss / GIB:.2f} > {budget / GIB:.2f} GiB\n".encode())
                    finally:
                        os._exit(OVER_BUDGET)
                time.sleep(0.1)

    threading.Thread(target=watch, name="rss-watchdog", daemon=True).start()


def _io_bytes() -> tuple[int, int]:
    """Bytes this process (all its threads) made storage read and write."""
    fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(fields["read_bytes"]), int(fields["write_bytes"])


def model_config(args) -> dict:
    return {"vocab_size": args.vocab, "n_positions": args.seq, "n_embd": args.embd, "n_layer": args.layers,
            "n_head": args.heads}


def engine_config(args, offload: bool, nvme: str | None) -> dict:
    """The one config zerotrain and DeepSpeed read (the ZeRO-Infinity job of infinity.py)."""
    zero = {"stage": 3, "stage3_param_persistence_threshold": 0, "sub_group_size": args.sub_group_size}
    if offload:
        zero["offload_optimizer"] = {"device": "nvme", "nvme_path": nvme}
        # DeepSpeed's swap buffers: each must hold the largest parameter (the embedding)
        zero["offload_param"] = {"device": "nvme", "nvme_path": nvme, "buffer_count": 5,
                                 "buffer_size": args.vocab * args.embd}
    return {"train_batch_size": args.nproc, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
            "gradient_clipping": 1.0, "bf16": {"enabled": True}, "zero_optimization": zero,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}},
            "steps_per_print": 10**9, "wall_clock_breakdown": False}


def build(args):
    """(step function, parameter count, finaliser) for this rank's framework."""
    import torch

    from common import import_gpt

    framework = args.worker
    GPT, GPTConfig = import_gpt("deepspeed" if framework == "deepspeed-nvme" else "zerotrain")
    cfg = GPTConfig(**model_config(args))
    torch.manual_seed(0)
    if framework == "ddp":
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        dist.init_process_group("gloo")
        torch.set_default_dtype(torch.bfloat16)  # built in bf16: never an fp32 copy
        model = GPT(cfg)
        torch.set_default_dtype(torch.float32)
        ddp = DistributedDataParallel(model, gradient_as_bucket_view=True)
        kw = dict(lr=1e-4, weight_decay=0.01)
        try:
            opt = torch.optim.AdamW(model.parameters(), fused=True, **kw)
        except (RuntimeError, ValueError):
            opt = torch.optim.AdamW(model.parameters(), foreach=True, **kw)

        def step(x):
            loss = ddp(x, labels=x)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
            opt.step()
            opt.zero_grad(set_to_none=False)  # keep the bucket views
            return loss
        return step, sum(p.numel() for p in model.parameters()), lambda: None

    offload = framework in NVME
    config = engine_config(args, offload, args.nvme_path)
    if framework == "deepspeed-nvme":
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")
        with deepspeed.zero.Init(config_dict_or_path=config):
            model = GPT(cfg)
        n_params = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
        close = lambda: None  # noqa: E731 (the parent removes the swap folder)
    else:
        import zerotrain
        from zerotrain.zero.stage3.init import full_shape

        with zerotrain.zero.Init():
            model = GPT(cfg)
        n_params = sum(full_shape(p).numel() for p in model.parameters())
        engine, *_ = zerotrain.initialize(model=model, config=config)
        close = engine.destroy

    def step(x):
        loss = engine(x, labels=x)
        engine.backward(loss)
        engine.step()
        return loss
    return step, n_params, close


def worker(args) -> None:
    start_watchdog(int(args.budget_gib * GIB), Path(args.out + f".over{os.environ.get('RANK', '')}"))
    import torch

    from common import status_kib

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    step, n_params, close = build(args)
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    init_s, init_hwm = time.perf_counter() - t0, status_kib("VmHWM")
    steps = []
    for i in range(args.steps):
        g = torch.Generator().manual_seed(1000 + i * world + rank)
        x = torch.randint(0, args.vocab, (1, args.seq), generator=g)
        dist.barrier()
        (r0, w0), t = _io_bytes(), time.perf_counter()
        loss = step(x)
        spent = time.perf_counter() - t
        r1, w1 = _io_bytes()
        stats = torch.tensor([spent, r1 - r0, w1 - w0, loss.detach().double().item()], dtype=torch.float64)
        got = [torch.zeros_like(stats) for _ in range(world)]
        dist.all_gather(got, stats)
        steps.append({"s": max(s[0].item() for s in got), "read": sum(s[1].item() for s in got),
                      "write": sum(s[2].item() for s in got), "loss": sum(s[3].item() for s in got) / world})
    mine = torch.tensor([status_kib("VmHWM"), init_hwm], dtype=torch.int64)
    everyone = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(everyone, mine)
    if rank == 0:
        Path(args.out).write_text(json.dumps({
            "framework": args.worker, "layers": args.layers, "params": n_params, "init_s": init_s, "steps": steps,
            "peak_kib": [int(t[0]) for t in everyone], "init_peak_kib": [int(t[1]) for t in everyone]}))
    close()
    dist.barrier()
    dist.destroy_process_group()


# ============================================================================================
# parent: the disk's figures, DeepSpeed's ops, the search, the table
# ============================================================================================

def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def disk_sequential(folder: Path, gib: float) -> tuple[float, float]:
    """(read, write) GB/s of one large file written and read back with O_DIRECT (dd)."""
    path, count = folder / "seq-test.bin", max(1, int(gib * 1024))

    def dd(*argv: str) -> float:
        t = time.perf_counter()
        subprocess.run(["dd", "bs=1M", f"count={count}", *argv], check=True, capture_output=True)
        return count * (1 << 20) / (time.perf_counter() - t) / 1e9

    try:
        write = dd("if=/dev/zero", f"of={path}", "oflag=direct", "conv=fsync")
        read = dd(f"if={path}", "of=/dev/null", "iflag=direct")
    finally:
        path.unlink(missing_ok=True)
    return read, write


WARM_DS = """
import sys, torch
from deepspeed.accelerator import get_accelerator
acc = get_accelerator()
aio = acc.create_op_builder("AsyncIOBuilder")
if not aio.is_compatible(verbose=True):
    sys.exit("async_io is not compatible here (libaio missing? apt-get install -y libaio-dev)")
lib = aio.load()
acc.create_op_builder("CPUAdamBuilder").load()
h = lib.aio_handle(1 << 20, 8, False, True, 1)
x = torch.arange(1 << 20, dtype=torch.float32)
path = sys.argv[1] + "/aio-check.bin"
assert h.sync_pwrite(x, path) != -1
y = torch.zeros_like(x)
assert h.sync_pread(y, path) != -1
assert torch.equal(x, y), "aio read back other bytes"
import os; os.unlink(path)
print("aio ok")
"""


def warm_deepspeed(py: Path, nvme: Path) -> bool:
    """Compile DeepSpeed's shm comm, async_io and cpu_adam ops now, and check an aio write and
    read in the nvme folder: no job waits for a compiler, and a broken NVMe path shows here."""
    import compare_zero

    if not compare_zero.warm_deepspeed(py):
        return False
    start = time.perf_counter()
    try:
        r = common.run_quiet([py, "-c", WARM_DS, nvme], env=common.venv_env(common.DS_VENV),
                                    timeout=3600)
    except subprocess.TimeoutExpired:
        say("DeepSpeed: building its async_io/cpu_adam ops took over an hour; an interrupted build leaves a "
            f"`lock` file that later builds wait on forever: remove {common.DS_VENV}/torch_extensions/*/lock")
        return False
    if r.returncode != 0 or "aio ok" not in r.stdout:
        say(f"DeepSpeed: building or checking its async_io op failed:\n{(r.stdout + r.stderr)[-3000:]}")
        return False
    say(f"DeepSpeed: async_io and cpu_adam ops built, an aio write/read checked in {nvme} "
        f"({time.perf_counter() - start:.0f} s)")
    return True


def probe(framework: str, layers: int, args, ctx: dict) -> dict:
    """One torchrun job; {"fits": bool, "why": str, ...the worker's results}."""
    from common import kill_job

    tag = f"{framework}-L{layers}-{time.monotonic_ns()}"
    out, log = ctx["work"] / f"{tag}.json", ctx["work"] / f"{tag}.log"
    nvme = ctx["nvme"] / tag
    deepspeed = framework == "deepspeed-nvme"
    py = ctx["ds_py"] if deepspeed else Path(sys.executable)
    if framework in NVME:
        nvme.mkdir()
    cmd = [py, "-m", "torch.distributed.run", "--nproc_per_node", args.nproc, "--master_port",
           common.free_port(), __file__, "--worker", framework, "--out", out, "--layers", layers,
           "--embd", args.embd, "--heads", args.heads, "--vocab", args.vocab, "--seq", args.seq,
           "--steps", args.steps, "--budget-gib", args.budget_gib, "--nvme-path", nvme,
           "--sub-group-size", args.sub_group_size]
    env = common.venv_env(common.DS_VENV if deepspeed else Path(sys.prefix))
    env["COMPARE_ZERO_SRC"] = str(ctx["src"])
    if not deepspeed:  # ahead of the editable install: every job runs the same snapshot
        env["PYTHONPATH"] = os.pathsep.join([str(ctx["src"]), env.get("PYTHONPATH", "")])
    start, why = time.perf_counter(), ""
    low = mem_available()
    with open(log, "w") as f:
        proc = subprocess.Popen([str(c) for c in cmd], env=env, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)  # its own group: kill_job takes it whole
        try:
            while proc.poll() is None:
                low = min(low, mem_available())
                if low < LOW_MEMORY_FLOOR or time.perf_counter() - start > args.probe_timeout:
                    why = (f"aborted: MemAvailable fell to {low / GIB:.2f} GiB" if low < LOW_MEMORY_FLOOR
                           else f"aborted: over {args.probe_timeout} s")
                    break
                time.sleep(0.1)
        finally:  # aborted, or this script interrupted (Ctrl-C, SIGTERM): no rank outlives it
            if proc.poll() is None:
                kill_job(proc.pid)
                proc.wait()
    shutil.rmtree(nvme, ignore_errors=True)
    res = {"layers": layers, "framework": framework, "wall_s": time.perf_counter() - start, "low_gib": low / GIB}
    over = sorted(out.parent.glob(out.name + ".over*"))
    if why:
        res.update(fits=False, why=why)
    elif over:
        rss = max(int(p.read_text()) for p in over)
        res.update(fits=False, why=f"over budget (a rank reached {rss / GIB:.2f} GiB)")
    elif proc.returncode != 0 or not out.exists():
        text = log.read_text(errors="replace")
        at = text.find("Traceback")  # the first rank's own traceback, not torchrun's summary
        tail = "\n".join(text[at:].splitlines()[:40] if at >= 0 else text.strip().splitlines()[-25:])
        if "the disk is full" in text or "are free; free space there" in text:  # zerotrain's two disk errors
            res.update(fits=False, why="does not fit on the disk: " + next(
                line.strip() for line in text.splitlines() if "disk is full" in line or "are free;" in line)[-160:])
        else:
            res.update(fits=False, why=f"FAILED (exit {proc.returncode}), not a memory limit", error=tail)
    else:
        res.update(fits=True, why="fits", **json.loads(out.read_text()))
    line = f"  {framework:15s} {layers:4d} layers: {res['why']}"
    if res["fits"]:
        last = res["steps"][-1]
        line += (f", {res['params'] / 1e9:.3f}B params, peak RSS {max(res['peak_kib']) / (1 << 20):.2f} GiB/rank, "
                 f"{last['s']:.2f} s/step, init {res['init_s']:.0f} s")
    say(line + f" ({res['wall_s']:.0f} s; MemAvailable low {res['low_gib']:.1f} GiB)")
    if res.get("error"):
        say(res["error"])
    ctx["probes"].setdefault(framework, {})[layers] = res
    return res


def search(framework: str, args, ctx: dict) -> dict | None:
    """The largest layer count that fits (doubling, then bisection); its probe's result, or None."""
    best, fail, n = None, None, args.start_layers[framework]
    while True:
        res = probe(framework, n, args, ctx)
        if not res["fits"]:
            fail = n
            break
        best = res
        if n >= args.max_layers:
            break
        n = min(2 * n, args.max_layers)
    if best is None:
        return None
    lo, hi = best["layers"], fail
    while hi is not None and hi - lo > args.resolution[framework]:
        mid = (lo + hi) // 2
        res = probe(framework, mid, args, ctx)
        if res["fits"]:
            lo, best = mid, res
        else:
            hi = mid
    best["capped"] = fail is None  # fits at --max-layers: the real limit lies above
    return best


def _gib(kib) -> str:
    return f"{max(kib) / (1 << 20):.2f}"


def report(largest: dict, args, ctx: dict) -> None:
    seq_read, seq_write = ctx["disk"]
    print()
    print(f"model: GPT width {args.embd}, {args.heads} heads, vocab {args.vocab}, {args.seq} positions; bf16, AdamW, "
          f"micro batch 1 x {args.seq} per rank, {args.nproc} ranks (gloo, 1 thread each), {args.steps} steps; "
          "layers bisected to within " + ", ".join(f"{fw} {args.resolution[fw]}" for fw in args.frameworks))
    print(f"budget {args.budget_gib:.2f} GiB per rank (watchdog on RSS); disk ({ctx['nvme']}): sequential read "
          f"{seq_read:.2f} GB/s, write {seq_write:.2f} GB/s (dd O_DIRECT, {args.disk_test_gib} GiB)")
    print()
    head = (f"{'framework':15s} {'layers':>7} {'params':>8} {'peak RSS/rank GiB':>18} {'s/step':>7} | "
            f"{'NVMe read GB/s':>14} {'write GB/s':>10} {'disk busy':>9}")
    print(head)
    print("-" * len(head))
    for fw in args.frameworks:
        r = largest.get(fw)
        if r is None:
            print(f"{fw:15s} {'none fit' if fw in ctx['probes'] else 'not run':>7}")
            continue
        last = r["steps"][-1]
        io = "" if fw not in NVME else (
            f"{last['read'] / last['s'] / 1e9:14.3f} {last['write'] / last['s'] / 1e9:10.3f} {busy(last, ctx):9.0%}")
        layers = f"{'>=' if r['capped'] else ''}{r['layers']}"
        print(f"{fw:15s} {layers:>7} {r['params'] / 1e9:7.3f}B {_gib(r['peak_kib']):>18} {last['s']:7.2f} | {io}")
    failed = [r for runs in ctx["probes"].values() for r in runs.values() if r["why"].startswith("FAILED")]
    for r in failed:
        print(f"NOTE: {r['framework']} at {r['layers']} layers FAILED for another reason than memory (see above)")
    ranks = [f"{fw} " + "/".join(f"{k / (1 << 20):.2f}" for k in r["peak_kib"]) for fw, r in largest.items() if r]
    print(f"(peak RSS of each rank, GiB: {', '.join(ranks)})")


def busy(step: dict, ctx: dict) -> float:
    """The share of the step the disk needs for its traffic at its sequential speed."""
    seq_read, seq_write = ctx["disk"]
    return (step["read"] / (seq_read * 1e9) + step["write"] / (seq_write * 1e9)) / step["s"]


def targets(largest: dict, args, ctx: dict) -> None:
    def verdict(ok: bool) -> str:
        return "met" if ok else "MISSED"

    zt = [largest[f] for f in ("zerotrain", "zerotrain-nvme") if largest.get(f)]
    ds = largest.get("deepspeed-nvme")
    print()
    print("targets:")
    zt_best = max(zt, key=lambda r: r["params"]) if zt else None
    if zt_best:
        print(f"  zerotrain's largest ({zt_best['framework']}, {zt_best['params'] / 1e9:.3f}B) >= "
              f"{MIN_PARAMS / 1e9:.0f}B parameters: {verdict(zt_best['params'] >= MIN_PARAMS)}")
    elif any(f in args.frameworks for f in ("zerotrain", "zerotrain-nvme")):
        print("  zerotrain: no size fits: MISSED")
    if zt_best and ds:
        ratio = zt_best["params"] / ds["params"]
        print(f"  zerotrain's largest / DeepSpeed's ({ds['params'] / 1e9:.3f}B) = {ratio:.2f} >= {OVER_DS}: "
              f"{verdict(ratio >= OVER_DS)}")
    if ds and "zerotrain-nvme" in args.frameworks:
        n = ds["layers"]
        z = ctx["probes"].get("zerotrain-nvme", {}).get(n)
        if z is None:
            say(f"  (one more zerotrain-nvme job at DeepSpeed's largest size, {n} layers)")
            z = probe("zerotrain-nvme", n, args, ctx)
        if z["fits"]:
            ratio = z["steps"][-1]["s"] / ds["steps"][-1]["s"]
            print(f"  at DeepSpeed's largest ({n} layers): step time zerotrain-nvme / DeepSpeed = "
                  f"{z['steps'][-1]['s']:.2f} / {ds['steps'][-1]['s']:.2f} s = {ratio:.2f} <= {TIME_TARGET}: "
                  f"{verdict(ratio <= TIME_TARGET)}")
        else:
            print(f"  at DeepSpeed's largest ({n} layers): zerotrain-nvme does not fit ({z['why']}): MISSED")
    for fw in NVME:
        if largest.get(fw):
            b = busy(largest[fw]["steps"][-1], ctx)
            print(f"  {fw}: disk busy {b:.0%} of its step at its largest size >= {DISK_TARGET:.0%}: "
                  f"{verdict(b >= DISK_TARGET)}")


def per_framework(text: str) -> dict:
    """`N` (every framework) or `FRAMEWORK=N,...` -> {framework or "*": N}."""
    if "=" not in text:
        return {"*": int(text)}
    pairs = [part.split("=", 1) for part in text.split(",") if part.strip()]
    try:
        return {fw.strip(): int(n) for fw, n in pairs}
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give N or FRAMEWORK=N,...") from None


def main() -> int:
    import compare_zero

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--frameworks", default=",".join(FRAMEWORKS), help=f"comma-separated among {','.join(FRAMEWORKS)}")
    p.add_argument("--max-layers", type=int, default=None, help="largest layer count tried (default 512, quick 32)")
    p.add_argument("--start-layers", type=per_framework, default={},
                   help="the first probe's layer count (default 1, quick 2): N for every framework, or "
                        "FRAMEWORK=N,... (e.g. zerotrain-nvme=48,deepspeed-nvme=16) with the default for the rest")
    p.add_argument("--resolution", type=per_framework, default={},
                   help="bisection stops when the fitting and failing layer counts are this close (default 1, "
                        "quick 2): N, or FRAMEWORK=N,... as --start-layers")
    p.add_argument("--budget-gib", type=float, default=None,
                   help="RSS budget per rank (default (MemAvailable - 3 GiB) / 2; quick: at most 1.0)")
    p.add_argument("--nvme-path", default=None, help="folder for the swap files and the disk test (default: a "
                                                     "temporary folder under $TMPDIR); a subfolder is made and removed")
    p.add_argument("--quick", action="store_true", help="width 512: the script end to end in minutes")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--disk-test-gib", type=float, default=None, help="size of the dd file (default 4, quick 0.5)")
    p.add_argument("--sub-group-size", type=int, default=100_000_000,
                   help="zero_optimization.sub_group_size for both engines (DeepSpeed's NVMe swap unit)")
    p.add_argument("--probe-timeout", type=float, default=3600.0, help="seconds before a probe is killed")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--ds-venv", default=str(common.DS_VENV),
                   help="DeepSpeed's venv (default benchmarks/.ds-venv)")
    p.add_argument("--src", default=str(SRC), help="zerotrain source tree (default: this repo's src/)")
    p.add_argument("--json", default=None, help="also write every probe's result here")
    # worker mode (set by the parent)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    p.add_argument("--layers", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--embd", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--heads", type=int, default=16, help=argparse.SUPPRESS)
    p.add_argument("--vocab", type=int, default=8192, help=argparse.SUPPRESS)
    p.add_argument("--seq", type=int, default=64, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return 0

    args.frameworks = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    if unknown := [f for f in args.frameworks if f not in FRAMEWORKS]:
        p.error(f"--frameworks: unknown {unknown}; choose among {','.join(FRAMEWORKS)}")
    args.embd = args.embd or (512 if args.quick else 2048)
    args.max_layers = args.max_layers or (32 if args.quick else 512)
    if unknown := [f for f in {**args.start_layers, **args.resolution} if f not in (*FRAMEWORKS, "*")]:
        p.error(f"--start-layers/--resolution: unknown framework {unknown}; choose among {','.join(FRAMEWORKS)}")
    for name, default in (("start_layers", 2 if args.quick else 1), ("resolution", 2 if args.quick else 1)):
        given = getattr(args, name)
        setattr(args, name, {fw: given.get(fw, given.get("*", default)) for fw in FRAMEWORKS})
    args.disk_test_gib = args.disk_test_gib or (0.5 if args.quick else 4.0)
    default_budget = (mem_available() - RESERVE) / args.nproc / GIB
    args.budget_gib = args.budget_gib or (min(1.0, default_budget) if args.quick else default_budget)
    if args.budget_gib <= 0:
        p.error(f"no memory to spare: MemAvailable is {mem_available() / GIB:.1f} GiB")
    if args.budget_gib * args.nproc > mem_available() / GIB - 1:
        p.error(f"--budget-gib {args.budget_gib} x {args.nproc} ranks is more than MemAvailable "
                f"({mem_available() / GIB:.1f} GiB) less 1 GiB: the kernel's OOM killer could strike first")
    t0 = time.perf_counter()
    # SIGTERM unwinds like Ctrl-C: the running probe is killed and the temporary folders removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="largest-") as tmp, \
            tempfile.TemporaryDirectory(prefix="largest-nvme-", dir=args.nvme_path) as nvme:
        ctx = {"work": Path(tmp), "nvme": Path(nvme), "probes": {}, "ds_py": None}
        ctx["src"] = ctx["work"] / "src"  # a snapshot: edits to src/ meanwhile cannot mix in
        shutil.copytree(Path(args.src).resolve(), ctx["src"],
                        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        say(f"zerotrain: {common.describe(Path(args.src).resolve())}")
        say(f"budget {args.budget_gib:.2f} GiB per rank; MemAvailable {mem_available() / GIB:.1f} GiB")
        ctx["disk"] = disk_sequential(ctx["nvme"], args.disk_test_gib)
        say(f"disk: sequential read {ctx['disk'][0]:.2f} GB/s, write {ctx['disk'][1]:.2f} GB/s")
        if "deepspeed-nvme" in args.frameworks:
            common.DS_VENV = Path(args.ds_venv).resolve()
            ctx["ds_py"] = compare_zero.ensure_deepspeed()
            if ctx["ds_py"] is None or not warm_deepspeed(ctx["ds_py"], ctx["nvme"]):
                say("DeepSpeed is unavailable: its column stays empty")
                args.frameworks.remove("deepspeed-nvme")
        largest = {}
        for fw in args.frameworks:
            say(f"{fw}: searching (from {args.start_layers[fw]} layers, at most {args.max_layers}, bisected to "
                f"within {args.resolution[fw]})")
            largest[fw] = search(fw, args, ctx)
        report(largest, args, ctx)
        targets(largest, args, ctx)
        if args.json:
            Path(args.json).write_text(json.dumps(ctx["probes"], indent=1))
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
