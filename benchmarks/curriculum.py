"""Sequence-length curriculum (fixed_linear) against none, at the same token budget.

    python benchmarks/curriculum.py [runs/curriculum.png] [--tokens 409600 --lr 2e-3 --big-lr 5e-2]  (~7 min)
    python benchmarks/curriculum.py --quick /tmp/c.png                                                (smoke run)

One process, one thread. A small GPT (4 layers, width 128, context 256) learns Python-stdlib
bytes. Both runs see the same random windows, the same token budget (token_budget.train_tokens:
the engine stops them) and the same LR decay by tokens (cosine over the budget, warmup in
steps), as Megatron-DeepSpeed's --train-tokens / --lr-decay-tokens recipe does. The curriculum
run starts at 32 tokens per sequence and reaches 256 at --ramp steps, so it takes more (but
cheaper) steps for the same tokens. The runs alternate by tokens consumed, so machine load
hits both alike; only training steps are timed.

Reported: wall-clock, held-out loss at full length, and a stability pair at a larger LR
(no clipping, 2 warmup steps): training spikes are steps whose loss is 20% above the lowest
so far, held-out spikes evaluations 5% above the best so far. The PNG plots held-out loss
(and, faint, training loss) against tokens for all four runs.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

SEQ, BATCH = 256, 16


def windows(stream: torch.Tensor, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(step)
    starts = torch.randint(0, len(stream) - SEQ, (BATCH,), generator=g)
    return torch.stack([stream[s : s + SEQ] for s in starts.tolist()])


class Run:
    def __init__(self, name: str, curriculum: bool, lr: float, args, clip: float, warmup: int):
        import zerotrain
        from zerotrain.models import GPT, GPTConfig

        torch.manual_seed(0)
        model = GPT(GPTConfig(vocab_size=256, n_positions=SEQ, n_embd=128, n_layer=4, n_head=4))
        cfg = {"train_micro_batch_size_per_gpu": BATCH, "gradient_clipping": clip,
               "optimizer": {"type": "AdamW", "params": {"lr": lr, "betas": [0.9, 0.95], "weight_decay": 0.1}},
               "token_budget": {"train_tokens": args.tokens, "lr_decay_tokens": args.tokens,
                                "lr_decay_style": "cosine", "warmup_steps": warmup, "min_lr": lr / 10}}
        if curriculum:
            cfg["curriculum_learning"] = {
                "enabled": True, "curriculum_type": "seqlen", "min_difficulty": 32, "max_difficulty": SEQ,
                "schedule_type": "fixed_linear",
                "schedule_config": {"total_curriculum_step": args.ramp, "difficulty_step": 16}}
        self.name, self.seconds, self.evals, self.train_losses = name, 0.0, [], []
        self.engine, *_ = zerotrain.initialize(model=model, config=cfg)

    @property
    def tokens(self) -> int:
        from zerotrain.features.engine_methods import tokens_consumed

        return tokens_consumed(self.engine)

    def step(self, stream: torch.Tensor) -> None:
        x = windows(stream, self.engine.global_steps)
        start = time.perf_counter()
        loss = self.engine(x, labels=x)
        self.engine.backward(loss)
        self.engine.step()
        self.seconds += time.perf_counter() - start
        self.train_losses.append((self.tokens, loss.item()))

    @torch.no_grad()
    def evaluate(self, val: torch.Tensor) -> None:
        self.engine.eval()
        loss = sum(self.engine(b, labels=b).item() for b in val) / len(val)
        self.engine.train()
        self.evals.append({"tokens": self.tokens, "seconds": self.seconds, "val_loss": loss})

    def summary(self) -> dict:
        best, spikes = math.inf, 0
        for e in self.evals:
            if e["val_loss"] > 1.05 * best or not math.isfinite(e["val_loss"]):
                spikes += 1
            best = min(best, e["val_loss"])
        # training-loss spikes: a step whose loss jumps 20% above the lowest loss so far
        # (a longer curriculum length only lowers the loss, so this is fair to both runs)
        losses = [v for _, v in self.train_losses]
        low, train_spikes = losses[0], 0
        for v in losses[1:]:
            train_spikes += v > 1.2 * low or not math.isfinite(v)
            low = min(low, v)
        return {"steps": self.engine.global_steps, "tokens": self.tokens, "seconds": self.seconds,
                "final_val_loss": self.evals[-1]["val_loss"], "best_val_loss": best, "val_spikes": spikes,
                "train_spikes": train_spikes, "peak_train_loss_after_step_1": max(losses[1:], default=math.nan)}


def race(pair: list[Run], stream, val, eval_every: int) -> None:
    """Step whichever run has trained fewer tokens until the budget stops both."""
    for run in pair:
        run.evaluate(val)
    while True:
        live = [r for r in pair if not r.engine.should_stop()]
        if not live:
            break
        run = min(live, key=lambda r: r.tokens)
        before = run.tokens // eval_every
        run.step(stream)
        if run.tokens // eval_every > before or run.engine.should_stop():
            run.evaluate(val)


def plot(pairs: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(pairs), figsize=(6 * len(pairs), 4.2), squeeze=False)
    for ax, (title, runs) in zip(axes[0], pairs.items()):
        for run, color in zip(runs, ("tab:blue", "tab:orange")):
            ax.plot([t for t, _ in run.train_losses], [v for _, v in run.train_losses], color=color, alpha=0.25, lw=0.8)
            ax.plot([e["tokens"] for e in run.evals], [e["val_loss"] for e in run.evals], color=color, marker="o",
                    ms=3, label=f"{run.name}: held-out {run.evals[-1]['val_loss']:.3f} in {run.seconds:.0f}s")
        ax.set_title(title)
        ax.set_xlabel("tokens trained")
        ax.set_ylabel("loss (nats/byte); faint: training loss")
        ax.set_ylim(top=min(6.0, ax.get_ylim()[1]))
        ax.legend()
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("png", nargs="?", default="runs/curriculum.png")
    parser.add_argument("--tokens", type=int, default=100 * BATCH * SEQ)
    parser.add_argument("--ramp", type=int, default=60, help="steps until the curriculum reaches full length")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--big-lr", type=float, default=5e-2)
    parser.add_argument("--eval-every", type=int, default=0, help="tokens between evaluations (default: budget / 16)")
    parser.add_argument("--quick", action="store_true", help="a tiny budget, to check that it runs")
    args = parser.parse_args()
    if args.quick:
        args.tokens, args.ramp = 6 * BATCH * SEQ, 4
    args.eval_every = args.eval_every or args.tokens // (3 if args.quick else 16)
    torch.set_num_threads(1)
    from corpus import stdlib_bytes

    train, held_out = stdlib_bytes()
    val = [windows(held_out, 10**6 + i) for i in range(2 if args.quick else 4)]
    pairs = {}
    for title, lr, clip, warmup in ((f"AdamW lr {args.lr:g}, clip 1.0", args.lr, 1.0, 10),
                                    (f"stability: lr {args.big_lr:g}, no clipping", args.big_lr, 0.0, 2)):
        runs = [Run("no curriculum", False, lr, args, clip, warmup), Run("seqlen curriculum", True, lr, args, clip, warmup)]
        race(runs, train, val, args.eval_every)
        pairs[title] = runs
    plot(pairs, args.png)
    report = {title: {r.name: r.summary() for r in runs} for title, runs in pairs.items()}
    Path(args.png).with_suffix(".json").write_text(json.dumps(report, indent=1))
    for title, runs in report.items():
        print(title)
        for name, s in runs.items():
            print(f"  {name:18s} {s['steps']:4d} steps, {s['tokens']:,} tokens, {s['seconds']:6.1f}s, "
                  f"held-out loss {s['final_val_loss']:.4f} (best {s['best_val_loss']:.4f}); spikes: "
                  f"{s['train_spikes']} training, {s['val_spikes']} held-out; peak training loss after "
                  f"step 1 {s['peak_train_loss_after_step_1']:.2f}")
    print(f"plot: {args.png}")


if __name__ == "__main__":
    main()
