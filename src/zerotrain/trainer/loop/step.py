"""One micro-batch through the engine, and what the loop counts around it.

    collated batch ─► (mlm: mask with the global RNG, which checkpoints restore)
                   ─► keep the keys the model's forward takes ─► engine(**inputs)
                   ─► loss (a tensor, or HF's output.loss) ─► backward, step

Tokens are counted where the model receives them (a forward pre-hook), so what the engine's
features did to the batch (a curriculum's cut) is already applied, with the one definition
every number called "tokens" uses: `zerotrain.features.batch.count_tokens`.
"""

from __future__ import annotations

import contextlib
import time

import torch
from torch import nn

from ...errors import ConfigError
from ...features.batch import count_tokens
from ...features.model_api import forward_accepts, is_hf_model
from ..data.collate import mask_tokens

BATCH_KEYS = ("input_ids", "attention_mask", "labels", "token_type_ids", "position_ids")


def forward_keys(model: nn.Module) -> set[str] | frozenset:
    """Batch keys the model's forward accepts (HF models take all of ours), and use_cache when
    it names that."""
    accepts = forward_accepts(model)
    named = set(accepts.named((*BATCH_KEYS, "use_cache")))
    if accepts.any_keyword and is_hf_model(model):
        return frozenset(named | set(BATCH_KEYS))
    return named


def forward_inputs(batch: dict, keys, device) -> dict:
    """The batch tensors the model takes, on its device. Packed sequences (position_ids, no
    mask) also get use_cache=False: an HF model that builds a KV cache ignores the packing and
    lets each example attend to the ones before it."""
    inputs = {k: v.to(device) for k, v in batch.items() if k in keys}
    if "position_ids" in inputs and "attention_mask" not in inputs and "use_cache" in keys:
        inputs["use_cache"] = False
    return inputs


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


class MicroBatches:
    """Runs micro-batches and sums, per optimizer step, what this rank saw: [loss, micro-batches,
    tokens]. The loop all-reduces that vector once per step."""

    def __init__(self, engine, model: nn.Module, task: str, tokenizer, mlm_probability: float):
        self.engine, self.task, self.tokenizer, self.mlm_probability = engine, task, tokenizer, mlm_probability
        self.keys = forward_keys(model)
        self.name = type(model).__name__
        self.sums = torch.zeros(3, dtype=torch.float64)
        engine.input_observers.append(self._count)

    def _count(self, args, kwargs):
        # training forwards only, the whole sequences (a sequence-parallel rank's model sees 1/S);
        # a tensor- or sequence-parallel copy of a batch counts once
        if not self.engine.input_replica:
            self.sums[2] += count_tokens(args, kwargs)

    def at_boundary(self) -> bool:
        """Will the next micro-batch complete an optimizer step?"""
        return self.engine.is_gradient_accumulation_boundary()

    def run(self, batch: dict) -> None:
        engine = self.engine
        if self.task == "mlm":
            batch = mask_tokens(batch, self.tokenizer, self.mlm_probability)
        inputs = forward_inputs(batch, self.keys, engine.device)
        if "labels" not in inputs:
            raise ConfigError(f"{self.name}.forward takes no labels argument; the trainer needs a "
                              "model that returns its loss from labels")
        out = engine(**inputs)
        loss = out if torch.is_tensor(out) else out.loss
        engine.backward(loss)
        engine.step()
        self.sums[0] += loss.item()
        self.sums[1] += 1

    def take(self) -> torch.Tensor:
        """This step's sums (then zero for the next step)."""
        out = self.sums.clone()
        self.sums.zero_()
        return out


class TrainClock:
    """Seconds spent training: wall time minus the intervals in `paused()` (evaluation and
    checkpoint saves, which are not training and report their own time). `total` is the
    run's training time; `lap()` the time since the previous lap, for a window's rate."""

    def __init__(self, total: float = 0.0):
        self.total = total
        self._lap = 0.0
        self._since: float | None = time.perf_counter()

    def _stop(self) -> None:
        if self._since is not None:
            spent = time.perf_counter() - self._since
            self.total += spent
            self._lap += spent
            self._since = None

    @contextlib.contextmanager
    def paused(self):
        self._stop()
        try:
            yield
        finally:
            self._since = time.perf_counter()

    def lap(self) -> float:
        self._stop()
        self._since, lap, self._lap = time.perf_counter(), self._lap, 0.0
        return lap

    def stop(self) -> float:
        self._stop()
        return self.total
