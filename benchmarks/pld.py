"""Progressive layer drop on a Pre-LN BERT-style MLM: samples/s and loss, with and without.

    python benchmarks/pld.py [--steps 120 --gamma 0.09 --out runs/pld.json]   (~5 min)
    python benchmarks/pld.py --quick                                          (smoke run)

One process, one thread. Two engines train the same model (6 layers, hidden 256, seq 128)
on the same MLM batches of Python-stdlib bytes: one without PLD, one with theta 0.5. Their
steps alternate, so load on the machine hits both alike, and only training steps are timed.

  samples/s   over the steps where PLD's theta has settled (within 0.01 of 0.5; gamma is
              raised from DeepSpeed's 0.001 so that happens within a short run)
  loss        held-out MLM loss (eval mode, all layers) at equal samples (both after
              --steps steps) and at equal wall-clock (PLD keeps training until its summed
              step time reaches the baseline's)

The PLD paper reports 24% more samples/s; with 6 blocks, theta 0.5 keeps 71% of block work.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import torch

SEQ, BATCH, MASK_ID = 128, 16, 256


def mlm_batch(stream: torch.Tensor, step: int, salt: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT masking of 15% of positions: 80% [MASK], 10% a random byte, 10% unchanged."""
    g = torch.Generator().manual_seed(step * 7919 + salt)
    starts = torch.randint(0, len(stream) - SEQ, (BATCH,), generator=g)
    ids = torch.stack([stream[s : s + SEQ] for s in starts.tolist()])
    picked = torch.rand(ids.shape, generator=g) < 0.15
    labels = torch.where(picked, ids, torch.full_like(ids, -100))
    roll = torch.rand(ids.shape, generator=g)
    inputs = torch.where(picked & (roll < 0.8), torch.full_like(ids, MASK_ID), ids)
    inputs = torch.where(picked & (roll >= 0.8) & (roll < 0.9), torch.randint(0, 256, ids.shape, generator=g), inputs)
    return inputs, labels


def build(seed: int, pld: dict | None, layers: int, hidden: int):
    import zerotrain
    from zerotrain.models import BertConfig, PreLNBertMLM

    torch.manual_seed(seed)
    model = PreLNBertMLM(BertConfig(vocab_size=257, n_positions=SEQ, n_embd=hidden, n_layer=layers,
                                       n_head=hidden // 64))
    cfg = {"train_micro_batch_size_per_gpu": BATCH, "gradient_clipping": 1.0,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.98], "weight_decay": 0.01}},
           "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 20, "warmup_max_lr": 1e-3,
                                                         "warmup_type": "linear"}}}
    if pld:
        cfg["progressive_layer_drop"] = {"enabled": True, **pld}
    engine, *_ = zerotrain.initialize(model=model, config=cfg)
    return engine


def timed_step(engine, batch) -> tuple[float, float]:
    start = time.perf_counter()
    loss = engine(batch[0], labels=batch[1])
    engine.backward(loss)
    engine.step()
    return time.perf_counter() - start, loss.item()


@torch.no_grad()
def val_loss(engine, val: torch.Tensor, batches: int) -> float:
    engine.eval()
    total = 0.0
    for i in range(batches):
        inputs, labels = mlm_batch(val, i, salt=1)
        total += engine(inputs, labels=labels).item()
    engine.train()
    return total / batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--gamma", type=float, default=0.09)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--eval-every", type=int, default=40)
    parser.add_argument("--eval-batches", type=int, default=8)
    parser.add_argument("--out", default="runs/pld.json")
    parser.add_argument("--quick", action="store_true", help="a few steps, to check that it runs")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.gamma, args.eval_every, args.eval_batches, args.layers = 12, 0.5, 6, 2, 3
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from corpus import stdlib_bytes

    train, val = stdlib_bytes()
    runs = {"baseline": build(0, None, args.layers, args.hidden),
            "pld": build(0, {"theta": 0.5, "gamma": args.gamma}, args.layers, args.hidden)}
    log = {name: {"time": [], "loss": [], "theta": [], "evals": []} for name in runs}

    def evaluate(name: str, step: int) -> None:
        log[name]["evals"].append({"step": step, "samples": step * BATCH, "seconds": sum(log[name]["time"]),
                                   "val_loss": val_loss(runs[name], val, args.eval_batches)})

    for step in range(args.steps):
        batch = mlm_batch(train, step)
        for name, engine in runs.items():  # alternate: drift on the machine hits both
            seconds, loss = timed_step(engine, batch)
            log[name]["time"].append(seconds)
            log[name]["loss"].append(loss)
            log[name]["theta"].append(engine.get_pld_theta())
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            for name in runs:
                evaluate(name, step + 1)
    base_seconds = sum(log["baseline"]["time"])
    step = args.steps
    while sum(log["pld"]["time"]) < base_seconds:  # equal wall-clock: PLD trains on
        seconds, loss = timed_step(runs["pld"], mlm_batch(train, step))
        log["pld"]["time"].append(seconds)
        log["pld"]["loss"].append(loss)
        step += 1
    evaluate("pld", step)

    # throughput once theta has settled; theta after step k is what step k + 1 used
    thetas = [1.0] + log["pld"]["theta"][: args.steps - 1]
    settled = next((k for k, t in enumerate(thetas) if t <= 0.51), args.steps // 2)
    window = range(settled, args.steps)
    sps = {name: BATCH * len(window) / sum(log[name]["time"][k] for k in window) for name in runs}
    equal_samples = {name: log[name]["evals"][len(log["baseline"]["evals"]) - 1]["val_loss"] for name in runs}
    result = {
        "model": f"PreLN BERT-style MLM, {args.layers} layers, hidden {args.hidden}, seq {SEQ}, batch {BATCH}",
        "theta": 0.5, "gamma": args.gamma, "settled_from_step": settled, "window_steps": len(window),
        "samples_per_s": sps, "speedup": sps["pld"] / sps["baseline"],
        "val_loss_equal_samples": {"samples": args.steps * BATCH, **equal_samples},
        "val_loss_equal_wallclock": {"seconds": base_seconds, "baseline": equal_samples["baseline"],
                                     "pld": log["pld"]["evals"][-1]["val_loss"],
                                     "pld_samples": step * BATCH},
        "evals": {name: log[name]["evals"] for name in runs},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"{result['model']}; PLD theta 0.5, gamma {args.gamma} (settled from step {settled})")
    print(f"samples/s over steps {settled}..{args.steps - 1}: baseline {sps['baseline']:.2f}, "
          f"PLD {sps['pld']:.2f}  -> {result['speedup']:.2f}x (target >= 1.25x)")
    print(f"val MLM loss at {args.steps * BATCH} samples: baseline {equal_samples['baseline']:.4f}, "
          f"PLD {equal_samples['pld']:.4f}")
    print(f"val MLM loss at {base_seconds:.0f}s of training: baseline {equal_samples['baseline']:.4f} "
          f"({args.steps * BATCH} samples), PLD {result['val_loss_equal_wallclock']['pld']:.4f} "
          f"({step * BATCH} samples)")
    print(f"(a uniform guess over bytes scores ln 256 = {math.log(256):.3f}); written {args.out}")


if __name__ == "__main__":
    main()
