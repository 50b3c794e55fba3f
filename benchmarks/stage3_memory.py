"""Bytes of peak resident memory per parameter per rank at ZeRO stage 3, phase by phase.

    python benchmarks/stage3_memory.py [--embd 1024] [--layers 2,6] [--steps 4] [--nvme-path DIR]

zerotrain's GPT (vocabulary 8192, 64 positions, 16 heads) built under zerotrain.zero.Init, bf16,
AdamW, clipping at 1.0, stage 3 (persistence threshold 0), micro batch 1 x 64 tokens, 2 ranks
on gloo; with --nvme-path, parameters and optimizer on nvme. One torchrun job per layer count.
Each rank resets its VmHWM (clear_refs) after every phase (build, initialize, each step's
forward, backward and step), so each figure is that phase's own peak. Printed: per job the
phase peaks of rank 0, the largest over ranks and the system time and minor page faults of the
steps; then the slope between the two sizes, (peak_b - peak_a) / (params_b - params_a): the
bytes a parameter costs a rank at the peak, to set against ZeRO's 16P/N (8 at 2 ranks).
Memory: about 1.1 GiB per rank at --layers 6 (no offload), run it alone.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def worker(args) -> None:
    sys.path.insert(0, str(HERE))
    import torch
    import torch.distributed as dist

    import zerotrain
    from common import reset_peak_rss, status_kib
    from zerotrain.models import GPT, GPTConfig
    from zerotrain.zero.stage3.init import full_shape

    torch.set_num_threads(1)
    zero = {"stage": 3, "stage3_param_persistence_threshold": 0}
    if args.nvme_path:
        zero["offload_optimizer"] = {"device": "nvme", "nvme_path": args.nvme_path}
        zero["offload_param"] = {"device": "nvme", "nvme_path": args.nvme_path}
    config = {"train_batch_size": 2, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
              "gradient_clipping": 1.0, "bf16": {"enabled": True}, "zero_optimization": zero,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}},
              "steps_per_print": 10**9}
    phases, steps = {}, []

    def mark(name: str) -> None:
        phases[name] = status_kib("VmHWM") * 1024
        reset_peak_rss()

    reset_peak_rss()
    torch.manual_seed(0)
    with zerotrain.zero.Init():
        model = GPT(GPTConfig(vocab_size=8192, n_positions=64, n_embd=args.embd, n_layer=args.worker, n_head=16))
    n = sum(full_shape(p).numel() for p in model.parameters())
    mark("build")
    engine, *_ = zerotrain.initialize(model=model, config=config)
    mark("initialize")
    rank = dist.get_rank()
    for i in range(args.steps):
        x = torch.randint(0, 8192, (1, 64), generator=torch.Generator().manual_seed(1000 + 2 * i + rank))
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        loss = engine(x, labels=x)
        mark(f"forward{i}")
        engine.backward(loss)
        mark(f"backward{i}")
        engine.step()
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        steps.append({"s": time.perf_counter() - t0, "sys": r1.ru_stime - r0.ru_stime,
                      "faults": r1.ru_minflt - r0.ru_minflt})
        mark(f"step{i}")
    mine = [None] * dist.get_world_size()
    dist.all_gather_object(mine, {"phases": phases, "steps": steps})
    if rank == 0:
        Path(args.out).write_text(json.dumps({"params": n, "ranks": mine}))
    engine.destroy()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--embd", type=int, default=1024)
    ap.add_argument("--layers", default="2,6", help="two layer counts, comma-separated")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--nvme-path", default=None)
    ap.add_argument("--mmap-threshold", default=None, help="MALLOC_MMAP_THRESHOLD_ for the ranks, e.g. 4194304 (what "
                    "zerotrain sets itself when offloading); default: glibc's dynamic threshold without offload")
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        return worker(args)
    results = []
    for layers in [int(x) for x in args.layers.split(",")]:
        out = Path(f"/tmp/stage3_memory_{os.getpid()}_{layers}.json")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", __file__, "--worker",
               str(layers), "--out", str(out), "--embd", str(args.embd), "--steps", str(args.steps)]
        cmd += ["--nvme-path", args.nvme_path] if args.nvme_path else []
        env = dict(os.environ, OMP_NUM_THREADS="1")
        if args.mmap_threshold:
            env["MALLOC_MMAP_THRESHOLD_"] = str(args.mmap_threshold)
        subprocess.run(cmd, check=True, env=env)
        job = json.loads(out.read_text())
        out.unlink()
        peak = max(max(r["phases"].values()) for r in job["ranks"])
        print(f"{layers} layers, {job['params'] / 1e6:.1f}M parameters: peak {peak / 2**20:.0f} MiB per rank")
        print("  rank 0 by phase (MiB): " + ", ".join(f"{k} {v / 2**20:.0f}" for k, v in job["ranks"][0]["phases"].items()))
        print("  steps: " + ", ".join(f"{s['s']:.1f} s ({s['sys']:.2f} s system, {s['faults']} faults)"
                                      for s in job["ranks"][0]["steps"]))
        results.append((job["params"], peak))
    (na, pa), (nb, pb) = results[0], results[-1]
    if nb != na:
        print(f"slope: {(pb - pa) / (nb - na):.2f} bytes of peak RSS per parameter per rank (ZeRO: 16P/N = 8 at 2 ranks)")


if __name__ == "__main__":
    main()
