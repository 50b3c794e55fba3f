"""A tiny GPT trained on variable-length samples batched by tokens through
`initialize(training_data=...)`, killed (engine dropped) after a checkpoint and resumed: run on
every rank of a world and, with world size 1, in the test process as the reference."""

from __future__ import annotations

import torch

import zerotrain
from scenarios import VOCAB, tiny_gpt

SAMPLES = 40


def dataset() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    lengths = torch.randint(2, 13, (SAMPLES,), generator=g).tolist()
    return [torch.randint(0, VOCAB, (n,), generator=g) for n in lengths]


def config(ga: int, method: str = "linear", order: str = "random", **extra) -> dict:
    return {"train_batch_size": 2, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": ga,
            "gradient_clipping": 0.0, "zero_optimization": {"stage": 1},
            "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}},
            "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 3e-3,
                                                          "warmup_num_steps": 3, "warmup_type": "linear"}},
            "data_efficiency": {"enabled": True, "seed": 11, "data_sampling": {"enabled": True, "dynamic_batching": {
                "enabled": True, "max_tokens": 24, "lr_scaling_method": method, "sequence_picking_order": order}}},
            **extra}


def _steps(engine, it, until: int, out: dict, save_to: str | None = None, save_at: int | None = None) -> None:
    ga = engine.gradient_accumulation_steps()
    while engine.global_steps < until:
        lr = engine.get_lr()[0]
        for _ in range(ga):
            x = next(it)
            loss = engine(x, labels=x)
            engine.backward(loss)
            engine.step()
            out["micro_losses"].append(loss.item())
            out["lengths"].append(list(x.shape))
        out["lrs"].append(lr)
        if save_to is not None and engine.global_steps == save_at:
            engine.save_checkpoint(save_to)


def train_and_resume(config: dict, folder: str, steps: int, save_at: int) -> dict:
    """`steps` optimizer steps with a checkpoint after `save_at`; then a new engine loads it and
    runs the same steps again: both runs' records and parameters."""
    data = dataset()

    def start():
        engine, _, loader, scheduler = zerotrain.initialize(model=tiny_gpt(), config=config, training_data=data)
        return engine, loader

    def endless(loader):
        while True:
            yield from loader

    engine, loader = start()
    first = {"micro_losses": [], "lengths": [], "lrs": []}
    _steps(engine, endless(loader), steps, first, folder, save_at)
    first["params"] = {k: v.detach().float().clone() for k, v in engine.module_state_dict().items()}
    engine.destroy()
    engine, loader = start()
    engine.load_checkpoint(folder)
    resumed = {"micro_losses": [], "lengths": [], "lrs": []}
    _steps(engine, endless(loader), steps, resumed)
    resumed["params"] = {k: v.detach().float().clone() for k, v in engine.module_state_dict().items()}
    engine.destroy()
    return {"first": first, "resumed": resumed}
