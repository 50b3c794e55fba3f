"""2 ranks against 1 process at every ZeRO stage, gradient clipping on and off.

    python benchmarks/parity.py [--steps 20] [--timing]

The workload: a 4-block MLP (32 -> 4 x [Linear 512, GELU] -> 10, 810k parameters), the mean
squared error against a fixed random teacher (eval loss 14.0 at the start, 8.8 after 20
steps; the gradient norm is 0.58 at the first step and 1.9 to 155 after it, so a clip of 1.0
acts on every later step), AdamW (lr 1e-2), fp32, a global batch of 32 (16 a rank at 2
ranks), 20 steps, `gradient_clipping` 1.0 or 0. One process runs every (stage, clip) pair as
the reference; one torchrun job of 2 gloo ranks (one thread each) runs them all again. Per
pair the table shows the relative difference of the eval loss after the last step,
|L2 - L1| / L1, the first step's gradient norm of each, and the largest relative difference
of any step's norm.

What a clipped run adds over an unclipped one is the clip factor, clip / (norm + 1e-6), in
every step: the norm must come out the same whichever stage and world size computed it,
or the difference is carried into every update. What is left with clipping off is the
gradients' own sum: each rank back-propagates the loss of its half of the batch, and the
halves' gradients are added, where one process adds all 32 samples' in one backward.

`--timing` adds the cost of the norm on a 20M-parameter GPT (micro batch 4 x 128 tokens) at 2
ranks, stages 0 (every rank reads all the gradients) and 2 (half each): zerotrain's float64
sum against one fp32 `torch.linalg.vector_norm` pass per buffer, on the gradients of a real
step, beside that step (forward, backward and engine.step: norm, clip, AdamW, all-gather).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"

STAGES = (0, 1, 2, 3)
CLIPS = (1.0, 0.0)
IN, WIDTH, BLOCKS, OUT = 32, 512, 4, 10
BATCH, EVAL = 32, 512


def mlp() -> torch.nn.Module:
    torch.manual_seed(2)
    layers, width = [], IN
    for _ in range(BLOCKS):
        layers += [torch.nn.Linear(width, WIDTH), torch.nn.GELU()]
        width = WIDTH
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, OUT))


def dataset(steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`steps` global batches then the eval set, labelled by a fixed random teacher."""
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(steps * BATCH + EVAL, IN, generator=g)
    teacher = torch.randn(IN, OUT, generator=g)
    y = 4 * torch.tanh(x @ teacher) + 0.5 * torch.randn(x.shape[0], OUT, generator=g)
    return x, y


def squared_error(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (out - target).square().mean()


def run_pair(stage: int, clip: float, steps: int, rank: int, world: int) -> dict:
    import zerotrain

    x, y = dataset(steps)
    micro = BATCH // world
    config = {"train_batch_size": BATCH, "train_micro_batch_size_per_gpu": micro, "steps_per_print": 1000,
              "gradient_clipping": clip, "zero_optimization": {"stage": stage},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}}
    engine, _, _, _ = zerotrain.initialize(model=mlp(), config=config)
    norms = []
    for step in range(steps):
        lo = step * BATCH + rank * micro
        loss = squared_error(engine(x[lo : lo + micro]), y[lo : lo + micro])
        engine.backward(loss)
        engine.step()
        norms.append(engine.get_global_grad_norm())
    final = engine.module_state_dict()
    engine.destroy()
    model = mlp()
    model.load_state_dict(final)
    with torch.no_grad():
        eval_loss = squared_error(model(x[-EVAL:]), y[-EVAL:]).item()
    return {"eval_loss": eval_loss, "norms": norms}


def worker(args) -> None:
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    results = {f"{stage},{clip}": run_pair(stage, clip, args.steps, rank, world) for stage in STAGES for clip in CLIPS}
    if rank == 0:
        Path(args.worker).write_text(json.dumps(results))


def launch(nproc: int, steps: int, out: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(SRC), OMP_NUM_THREADS="1")
    here = [str(HERE / "parity.py"), "--steps", str(steps), "--worker", str(out)]
    if nproc == 1:
        cmd = [sys.executable, *here]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *here]
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def table(one: dict, two: dict) -> None:
    print("2 ranks (torchrun, gloo) against 1 process; relative differences")
    print("| stage | clip | eval loss | first norm, 1 process | first norm, 2 ranks | max step-norm |")
    print("| --- | --- | --- | --- | --- | --- |")
    for stage in STAGES:
        for clip in CLIPS:
            a, b = one[f"{stage},{clip}"], two[f"{stage},{clip}"]
            rel = abs(b["eval_loss"] - a["eval_loss"]) / abs(a["eval_loss"])
            norm = max(abs(q - p) / p for p, q in zip(a["norms"], b["norms"]))
            print(f"| {stage} | {'on' if clip else 'off'} | {rel:.1e} | {a['norms'][0]:.9f} | {b['norms'][0]:.9f} "
                  f"| {norm:.1e} |")


def _median_ms(fn, repeats: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def fp32_squares(strategy) -> torch.Tensor:
    """The sum of squares as one fp32 norm pass per gradient buffer gives it (the alternative
    timed against zerotrain's float64 sum)."""
    norms = torch.stack([torch.linalg.vector_norm(g, dtype=torch.float32) for g in strategy.reduced_grads()])
    squares = (norms.double() ** 2).sum().reshape(1)
    if strategy.shards_optimizer:
        strategy.comm.all_reduce(squares)
    return squares


def timing_worker(args) -> None:
    """A 20M-parameter GPT at 2 ranks: the norm alone both ways on the gradients a step reads,
    then the whole step (engine.step: norm, clip, AdamW, all-gather), per stage."""
    import zerotrain
    from zerotrain.models import GPT, GPTConfig

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    g = torch.Generator().manual_seed(0)
    rows = {}
    for stage in (0, 2):
        torch.manual_seed(0)
        model = GPT(GPTConfig(vocab_size=8192, n_positions=128, n_embd=384, n_layer=10, n_head=6))
        config = {"train_batch_size": 4 * world, "train_micro_batch_size_per_gpu": 4, "steps_per_print": 1000,
                  "gradient_clipping": 1.0, "zero_optimization": {"stage": stage},
                  "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}
        engine, _, _, _ = zerotrain.initialize(model=model, config=config)
        fp32, ours, step, whole = [], [], [], []
        for _ in range(4):
            tokens = torch.randint(0, 8192, (4, 128), generator=g)
            start = time.perf_counter()
            engine.backward(engine(tokens, labels=tokens))
            backward = time.perf_counter()
            fp32.append(_median_ms(lambda: fp32_squares(engine.strategy)))
            ours.append(_median_ms(lambda: engine.strategy.grad_squares()))
            t = time.perf_counter()
            engine.step()
            step.append(1e3 * (time.perf_counter() - t))
            whole.append(1e3 * (backward - start) + step[-1])
        numel = sum(p.numel() for p in model.parameters())
        read = sum(t.numel() for t in engine.strategy.reduced_grads())
        rows[stage] = {"params": numel, "read": read, "fp32": statistics.median(fp32[1:]),
                       "ours": statistics.median(ours[1:]), "step": statistics.median(step[1:]),
                       "whole": statistics.median(whole[1:])}
        engine.destroy()
    if rank == 0:
        Path(args.timing_worker).write_text(json.dumps(rows))


def timing(out: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(SRC), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(HERE / "parity.py"), "--timing-worker", str(out)]
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    rows = json.loads(out.read_text())
    print("\nthe gradient norm of a 20M-parameter GPT at 2 ranks, one thread a rank (ms, median of 3 steps)")
    print("| stage | gradients a rank reads | fp32 norm pass | zerotrain (float64) | engine.step | training step |")
    print("| --- | --- | --- | --- | --- | --- |")
    for stage, r in rows.items():
        print(f"| {stage} | {r['read'] / 1e6:.1f}M of {r['params'] / 1e6:.1f}M | {r['fp32']:.1f} | {r['ours']:.1f} "
              f"| {r['step']:.0f} | {r['whole']:.0f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--timing", action="store_true", help="also time the gradient norm on a 20M-parameter GPT at 2 ranks")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--timing-worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0
    if args.timing_worker:
        timing_worker(args)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        one = launch(1, args.steps, Path(tmp) / "one.json")
        two = launch(2, args.steps, Path(tmp) / "two.json")
        table(one, two)
        if args.timing:
            timing(Path(tmp) / "timing.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
