"""Stage-0 step time of zerotrain against torch DistributedDataParallel, side by side.

    python benchmarks/stage0_vs_ddp.py [--steps 8 --rounds 3 --layers 10]

Launches itself on 2 ranks (gloo, one thread each). Both trainers get the same ~20M-param
GPT-2-style model, the same batches and AdamW with the same kernel; rounds alternate
between them so machine drift hits both alike. Prints the median step time of each and
the ratio zerotrain / DDP (target: at most 1.05).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time

import torch


def bench(args) -> None:
    import torch.distributed as dist

    import zerotrain
    from zerotrain.models import GPT, GPTConfig

    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=8192, n_positions=args.seq, n_embd=384, n_layer=args.layers, n_head=6)
    base = GPT(cfg)
    lr = 1e-4
    engine, _, _, _ = zerotrain.initialize(model=copy.deepcopy(base), config={
        "train_micro_batch_size_per_gpu": args.micro, "gradient_clipping": 0.0,
        "optimizer": {"type": "AdamW", "params": {"lr": lr}}})
    rank, world = dist.get_rank(), dist.get_world_size()
    ddp_model = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(base), gradient_as_bucket_view=True)
    fused = engine.optimizer.defaults.get("fused", False)
    ddp_opt = torch.optim.AdamW(ddp_model.parameters(), lr=lr, weight_decay=0.01, fused=fused or None,
                                foreach=None if fused else True)

    def batch(step: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(step * world + rank)
        return torch.randint(0, cfg.vocab_size, (args.micro, args.seq), generator=g)

    def ddp_step(x):
        loss = ddp_model(x, labels=x)
        loss.backward()
        ddp_opt.step()
        ddp_opt.zero_grad(set_to_none=False)
        return loss

    def zt_step(x):
        loss = engine(x, labels=x)
        engine.backward(loss)
        engine.step()
        return loss

    times = {"ddp": [], "zerotrain": []}
    losses = {"ddp": [], "zerotrain": []}
    step_of = {"ddp": 0, "zerotrain": 0}
    for rnd in range(args.rounds + 1):  # round 0 warms up both and is not timed
        for name, fn in (("ddp", ddp_step), ("zerotrain", zt_step)):
            for _ in range(args.steps):
                x = batch(step_of[name])
                step_of[name] += 1
                dist.barrier()
                start = time.perf_counter()
                loss = fn(x)
                elapsed = torch.tensor([time.perf_counter() - start])
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # a step is as slow as its slowest rank
                if rnd:
                    times[name].append(elapsed.item())
                losses[name].append(loss.item())
    if rank == 0:
        params = sum(p.numel() for p in base.parameters())
        ddp_ms = 1000 * statistics.median(times["ddp"])
        zt_ms = 1000 * statistics.median(times["zerotrain"])
        tokens = args.micro * args.seq * world
        print(f"model: GPT {params / 1e6:.1f}M params, micro batch {args.micro} x {args.seq} tokens, "
              f"{world} ranks (gloo, 1 thread each), {len(times['ddp'])} timed steps each")
        print(f"DDP        median step {ddp_ms:8.1f} ms  ({tokens / ddp_ms * 1000:,.0f} tokens/s)")
        print(f"zerotrain  median step {zt_ms:8.1f} ms  ({tokens / zt_ms * 1000:,.0f} tokens/s)")
        print(f"ratio zerotrain / DDP: {zt_ms / ddp_ms:.3f}  (target <= 1.05)")
        same = max(abs(a - b) for a, b in zip(losses["ddp"], losses["zerotrain"]))
        print(f"largest loss difference between the two at equal steps: {same:.2e}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8, help="timed steps per round and trainer")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--layers", type=int, default=10)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--micro", type=int, default=4)
    args = parser.parse_args()
    if "RANK" in os.environ:
        bench(args)
    else:
        from zerotrain.comm.launch import launch_module

        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        os.environ["PYTHONPATH"] = os.path.dirname(os.path.abspath(__file__)) + os.pathsep + os.environ.get("PYTHONPATH", "")
        sys.exit(launch_module("stage0_vs_ddp", sys.argv[1:], 2))
