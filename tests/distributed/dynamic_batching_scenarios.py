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


def _pairs(samples: list):
    """(inputs, labels) for the pipeline: the same padded tokens twice."""
    from zerotrain.data.dynamic_batching import pad_collate

    x = pad_collate(samples)
    return x, x


def pipeline_run(steps: int) -> dict:
    """A 2-stage PipelineModule GPT: each step's micro-batches from the token-budget loader
    (equal shapes within a step), recorded for the one-process reference."""
    from pipe_scenarios import BASE_SEED, gpt_loss, layer_specs
    from zerotrain.pipe import PipelineModule

    net = PipelineModule(layer_specs(), num_stages=2, loss_fn=gpt_loss, seed_layers=True, base_seed=BASE_SEED,
                         partition_method="type:PreLNBlock")
    cfg = config(ga=2, order="seqlen", zero_optimization={"stage": 0})
    cfg.pop("scheduler")
    engine, _, loader, _ = zerotrain.initialize(model=net, config=cfg, training_data=dataset(), collate_fn=_pairs)
    it, out = iter(loader), {"losses": [], "batches": [], "lrs": []}
    for _ in range(steps):
        pairs = [next(it) for _ in range(engine.gradient_accumulation_steps())]
        out["lrs"].append(engine.get_lr()[0])
        out["losses"].append(engine.train_batch(iter(pairs)).item())
        out["batches"].append([x for x, _ in pairs])
    return out


def pipeline_reference(batches: list) -> dict:
    """The same layers as one model on one process, fed the pipeline's micro-batches, its LR
    scaled by the same rule from their sample counts."""
    from pipe_scenarios import Reference
    from zerotrain.schedules.variable_batch import lr_scheduler_for_variable_batch_size

    cfg = config(ga=2, zero_optimization={"stage": 0})
    for key in ("scheduler", "data_efficiency"):
        cfg.pop(key)
    sizes = [sum(len(x) for x in step) for step in batches]
    engine, *_ = zerotrain.initialize(
        model=Reference(), config=cfg, lr_scheduler=lambda opt: lr_scheduler_for_variable_batch_size(2, sizes, None, opt))
    out = {"losses": [], "lrs": []}
    for step in batches:
        out["lrs"].append(engine.get_lr()[0])
        total = 0.0
        for x in step:
            loss = engine(x, labels=x)
            engine.backward(loss)
            engine.step()
            total += loss.item() / len(step)
        out["losses"].append(total)
    return out
