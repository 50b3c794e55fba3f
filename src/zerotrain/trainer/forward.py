"""One micro-batch through the engine, and the small pieces the trainer needs around it.

    collated batch ─► (mlm: mask with the global RNG, which checkpoints restore)
                   ─► keep the keys the model's forward takes ─► engine(**inputs)
                   ─► loss (a tensor, or HF's output.loss) ─► backward, step
    tokens trained = non-padding positions within the curriculum's sequence length
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from ..errors import ConfigError
from .data import mask_tokens


def forward_keys(model: nn.Module) -> set[str] | frozenset:
    """Batch keys the model's forward accepts (HF models take all of ours)."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        params = {}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()) and hasattr(model, "config"):
        return frozenset({"input_ids", "attention_mask", "labels", "token_type_ids"})
    return {name for name in params if name in ("input_ids", "attention_mask", "labels", "token_type_ids")}


def decay_groups(model: nn.Module, weight_decay: float) -> list[dict] | None:
    """HF's split: no weight decay on biases and normalisation weights."""
    if weight_decay == 0:
        return None
    no_decay = set()
    for module in model.modules():
        if "Norm" in type(module).__name__:
            no_decay.update(id(p) for p in module.parameters(recurse=False))
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            no_decay.add(id(p))
    seen, decay, rest = set(), [], []
    for p in model.parameters():
        if id(p) in seen or not p.requires_grad:
            continue
        seen.add(id(p))
        (rest if id(p) in no_decay else decay).append(p)
    groups = [{"params": decay}] + ([{"params": rest, "weight_decay": 0.0}] if rest else [])
    return [g for g in groups if g["params"]]


class UnusedParameterCheck:
    """ddp_find_unused_parameters false: a trainable parameter that got no gradient in an
    optimizer step is an error naming it (DDP would fail too, less clearly)."""

    def __init__(self, model: nn.Module):
        self.names = {}
        self.seen: set[int] = set()
        for name, p in model.named_parameters():
            if p.requires_grad and id(p) not in self.names:
                self.names[id(p)] = name
                p.register_post_accumulate_grad_hook(lambda t: self.seen.add(id(t)))

    def check(self, step: int) -> None:
        missing = [n for i, n in self.names.items() if i not in self.seen]
        self.seen.clear()
        if missing:
            raise ConfigError(f"parameter {missing[0]} got no gradient in step {step} "
                              f"({len(missing)} such); set --ddp_find_unused_parameters true to allow it")


class Batches:
    def __init__(self, trainer):
        self.t = trainer
        self.pending = torch.zeros(3, dtype=torch.float64)  # stats of the step's earlier micro-batches
        self.piped: list = []  # a pipeline's micro-batches of this step (pipeline_split.py)

    def at_boundary(self) -> bool:
        """Will the next micro-batch complete an optimizer step?"""
        if self.t.pipe_names is not None:
            return len(self.piped) + 1 == self.t.engine.gradient_accumulation_steps()
        return self.t.engine.is_gradient_accumulation_boundary()

    def train_step(self, batch: dict) -> tuple[float, int]:
        t = self.t
        engine = t.engine
        if t.task == "mlm":
            batch = mask_tokens(batch, t.tokenizer, t.mlm_probability)
        inputs = {k: v.to(engine.device) for k, v in batch.items() if k in t.keys}
        if t.pipe_names is not None:
            from .pipeline_split import pipeline_step

            return pipeline_step(self, batch, inputs)
        if "labels" not in inputs:
            raise ConfigError(f"{type(t.model).__name__}.forward takes no labels argument; the trainer needs a "
                              "model that returns its loss from labels")
        out = engine(**inputs)
        loss = out if torch.is_tensor(out) else out.loss
        engine.backward(loss)
        engine.step()
        cut = engine.feature_value("curriculum_seqlen")
        mask = batch["attention_mask"] if "attention_mask" in batch else torch.ones_like(batch["input_ids"])
        tokens = int(mask[:, :cut].sum()) if cut else int(mask.sum())
        return loss.item(), tokens

    def live_fields(self) -> dict:
        engine = self.t.engine
        fields = {}
        seqlen = engine.feature_value("curriculum_seqlen")
        if seqlen is not None:
            fields["seqlen"] = seqlen
        theta = engine.get_pld_theta()
        if theta is not None:
            fields["theta"] = theta
        if engine.loss_scaler is not None:
            fields["loss_scale"] = engine.loss_scale
        return fields
