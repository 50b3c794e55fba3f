"""`zerotrain demo`: a short 2-process training run on data every machine has.

The corpus is the Python standard library of the running interpreter, read as bytes (a
256-symbol vocabulary, so no tokenizer and no download). A small GPT trains with the engine
for a fixed number of steps, rank 0 prints loss and throughput, and at the end the held-out
perplexity next to the unigram baseline it must beat.
"""

from __future__ import annotations

import math
import sysconfig
import time
from pathlib import Path

import torch

SEQ = 128


def stdlib_bytes() -> tuple[torch.Tensor, torch.Tensor]:
    """(train, validation) byte streams; every 10th file (sorted by name) is held out."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    train, val = [], []
    for i, f in enumerate(files):
        (val if i % 10 == 0 else train).append(f.read_bytes())
    as_tensor = lambda parts: torch.frombuffer(bytearray(b"\n".join(parts)), dtype=torch.uint8).long()
    return as_tensor(train), as_tensor(val)


class Blocks(torch.utils.data.Dataset):
    """Non-overlapping windows of SEQ bytes."""

    def __init__(self, stream: torch.Tensor):
        n = len(stream) // SEQ
        self.blocks = stream[: n * SEQ].view(n, SEQ)

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.blocks[i]


def unigram_perplexity(train: torch.Tensor, val: torch.Tensor) -> float:
    counts = torch.bincount(train, minlength=256).double() + 1.0
    logp = (counts / counts.sum()).log()
    return math.exp(-logp[val].mean().item())


def train_demo(steps: int = 300) -> None:
    import zerotrain
    from zerotrain.models import GPT, GPTConfig

    torch.set_num_threads(1)
    torch.manual_seed(0)
    train, val = stdlib_bytes()
    model = GPT(GPTConfig(vocab_size=256, n_positions=SEQ, n_embd=128, n_layer=4, n_head=4))
    config = {
        "train_batch_size": 32, "train_micro_batch_size_per_gpu": 16, "steps_per_print": 25,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "betas": [0.9, 0.95], "weight_decay": 0.1}},
        "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": steps, "warmup_num_steps": 15,
                                                         "warmup_type": "linear", "cos_min_ratio": 0.1}},
    }
    engine, _, loader, _ = zerotrain.initialize(model=model, config=config, training_data=Blocks(train))
    rank = engine.global_rank
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        print(f"demo: GPT {params / 1e6:.2f}M params on {engine.world_size} processes, "
              f"{len(train) / 1e6:.1f}M training bytes from the Python standard library", flush=True)
    start = time.perf_counter()
    data = iter(loader)
    while engine.global_steps < steps:
        try:
            batch = next(data)
        except StopIteration:
            data = iter(loader)
            batch = next(data)
        loss = engine(batch, labels=batch)
        engine.backward(loss)
        engine.step()
    elapsed = time.perf_counter() - start
    tokens = steps * engine.train_batch_size() * SEQ
    engine.eval()
    val_blocks = Blocks(val).blocks[rank :: engine.world_size][:64]
    with torch.no_grad():
        val_loss = torch.stack([engine(b[None], labels=b[None]) for b in val_blocks]).mean()
    stats = torch.tensor([val_loss.item(), 1.0], dtype=torch.float64)
    engine.comm.all_reduce(stats)
    if rank == 0:
        ppl = math.exp(stats[0].item() / stats[1].item())
        print(f"demo: {steps} steps in {elapsed:.1f}s, {tokens / elapsed:,.0f} tokens/s; "
              f"held-out perplexity {ppl:.2f} (unigram baseline {unigram_perplexity(train, val):.2f})",
              flush=True)


def launch(nproc: int = 2, steps: int = 300) -> int:
    from .dist.launch import launch_module

    return launch_module("zerotrain.demo", ["--steps", str(steps)], nproc)


def add_arguments(parser) -> None:
    parser.add_argument("--nproc_per_node", type=int, default=2, help="processes to launch (default 2)")
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps (default 300)")


def run(args) -> int:
    return launch(args.nproc_per_node, args.steps)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    train_demo(parser.parse_args().steps)
