"""Training runs that the distributed tests execute on every rank and, with world size 1, in
the test process itself as the reference. Module-level so spawned ranks can unpickle them."""

from __future__ import annotations

import torch

import zerotrain
from zerotrain.models import GPT, GPTConfig

SEQ = 16
VOCAB = 64


def tiny_gpt(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2,
                         # no biases: the key bias gets a gradient that is exactly zero in exact
                         # arithmetic, and Adam turns its rounding noise into lr-sized steps
                         bias=False))


def global_batch(step: int, size: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randint(0, VOCAB, (size, SEQ), generator=g)


def base_config(global_batch_size: int, micro: int, **extra) -> dict:
    cfg = {"train_batch_size": global_batch_size, "train_micro_batch_size_per_gpu": micro,
           "gradient_clipping": 0.0,
           "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}}}
    cfg.update(extra)
    return cfg


def rank_and_world():
    import os

    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def train(config: dict, steps: int, global_batch_size: int, poison: dict | None = None,
          save: tuple | None = None, load: tuple | None = None, batches=global_batch) -> dict:
    """Run `steps` optimizer steps; each rank takes its slice of the same global batch.

    poison = {"step": k, "rank": r, "value": inf}: multiply rank r's loss by value at step k
    (and the following ones up to "until", if given).
    save = (dir, at_step): save a checkpoint after that many steps.
    load = (dir, tag): load before training and continue from the loaded step.
    batches(step, size): the global batch of a step (default: uniform random tokens).
    """
    rank, world = rank_and_world()
    model = tiny_gpt()
    engine, _, _, _ = zerotrain.initialize(model=model, config=config)
    if load is not None:
        engine.load_checkpoint(load[0], tag=load[1])
    micro = engine.train_micro_batch_size_per_gpu()
    ga = engine.gradient_accumulation_steps()
    losses, norms, lrs = [], [], []
    while engine.global_steps < steps:
        step = engine.global_steps
        batch = batches(step, global_batch_size)
        mine = batch[rank * micro * ga : (rank + 1) * micro * ga]
        step_loss = 0.0
        for m in range(ga):
            x = mine[m * micro : (m + 1) * micro]
            loss = engine(x, labels=x)
            if poison and poison["step"] <= step <= poison.get("until", poison["step"]) and poison["rank"] == rank:
                loss = loss * poison["value"]
            engine.backward(loss)
            try:
                engine.step()
            except zerotrain.NonFiniteStepsError as e:
                return {"halted": str(e), "last_good": e.last_good_step, "global_steps": engine.global_steps,
                        "params": {k: v.detach().float().clone() for k, v in engine.module_state_dict().items()}}
            step_loss += loss.item() / ga
        losses.append(step_loss)
        norms.append(engine.get_global_grad_norm())
        lrs.append(engine.get_lr()[0])
        if save is not None and engine.global_steps == save[1]:
            engine.save_checkpoint(save[0])
    params = {k: v.detach().float().clone() for k, v in engine.module_state_dict().items()}
    memory = engine.memory_breakdown()
    engine.destroy()
    return {"params": params, "losses": losses, "norms": norms, "lrs": lrs, "memory": memory,
            "skipped": engine.skipped_steps, "loss_scale": engine.loss_scale}
