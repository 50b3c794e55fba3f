"""Random layerwise token dropping (random-LTD, arXiv 2211.11586): the schedule, which tokens a
layer keeps, and moving them out of and back into the sequence.

    reserved length r(step)   how many tokens each routed layer sees; DeepSpeed's fixed_linear
                              schedule from min_value to max_value over require_steps, rounded
                              down to a multiple of seq_per_step, then frozen at max_value
    kept tokens               per (layer, sample): r of the s positions, uniformly at random,
                              in increasing order, so a causal layer stays causal
    one routed layer          x_kept = gather(x, kept);  y = layer(x_kept);  out = x with the
                              kept positions replaced by y; the dropped positions skip the
                              layer (their output is their input) and its gradient

    hidden [b, s, h] --gather--> [b, r, h] --layer--> [b, r, h] --scatter--> [b, s, h]

Which positions are kept comes from a counter-based hash of (seed, step, layer, global sample
index, position) computed with integer tensor ops on the hidden states' device: no generator
state, no host round trip, the same numbers on every device, and a sample keeps the same
tokens however many ranks share the batch and however it is split into micro-batches
(DeepSpeed draws from the global RNG, so its runs differ with the world size). The r positions
with the smallest hash are kept: a uniformly random subset, as DeepSpeed's multinomial draw
without replacement over equal weights is.

`RandomLTDScheduler` keeps DeepSpeed's API and numbers (`update_seq`, `get_current_seq`,
`consumed_layer_tokens`, `state_dict`); `layer_averaged_length` is Megatron-DeepSpeed's
effective sequence length, which the engine counts as `layer_tokens`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping

import torch

from ..errors import ConfigError

_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_C1, _C2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


# ---- the schedule ----------------------------------------------------------------------------
def random_ltd_value(step: int, min_value: int, max_value: int, require_steps: int, seq_per_step: int) -> int:
    """fixed_linear: step / require_steps of the way from min_value to max_value, rounded down
    to a multiple of seq_per_step, capped at max_value. DeepSpeed's operation order, so the
    roundings agree; like DeepSpeed it does not round min_value up (a min_value that is not a
    multiple of seq_per_step starts below itself)."""
    value = math.floor(float(step) / require_steps * (max_value - min_value) + min_value)
    value -= value % seq_per_step
    return min(value, max_value)


def layer_averaged_length(seq_len: int, reserved: int, routed_layers: int, total_layers: int) -> int:
    """Megatron-DeepSpeed's effective sequence length under random-LTD: the tokens each layer
    sees, averaged over the layers (floor); the full length while r >= seq_len."""
    if reserved >= seq_len:
        return seq_len
    return (seq_len * (total_layers - routed_layers) + reserved * routed_layers) // total_layers


def _plain(config) -> dict:
    if hasattr(config, "model_dump"):  # the validated pydantic block
        config = config.model_dump()
    if not isinstance(config, Mapping):
        raise ConfigError(f"RandomLTDScheduler: the random_ltd block should be a JSON object, got "
                          f"{type(config).__name__}")
    return dict(config)


def _need(block: Mapping, key: str, where: str):
    value = block.get(key)
    if value is None:
        raise ConfigError(f"{where}.{key}: is missing: needed when random-LTD is enabled")
    return value


class RandomLTDScheduler:
    """`RandomLTDScheduler(block)`: the `random_ltd` block plus `global_batch_size` (the engine
    adds the train batch size, as DeepSpeed's does). State keys are DeepSpeed's."""

    def __init__(self, config):
        block = _plain(config)
        where = "data_efficiency.data_routing.random_ltd"
        self.model_layer_num = _need(block, "total_layer_num", where)
        self.random_ltd_layer_num = _need(block, "random_ltd_layer_num", where)
        self.global_batch_size = _need(block, "global_batch_size", "RandomLTDScheduler")
        schedule = _plain(_need(block, "random_ltd_schedule", where))
        s_where = f"{where}.random_ltd_schedule"
        for key in ("min_value", "max_value"):
            _need(schedule, key, s_where)
        kind = schedule.get("schedule_type", "fixed_linear")
        if kind != "fixed_linear":
            raise ConfigError(f"{s_where}.schedule_type: {kind!r} is not a random-LTD schedule; use fixed_linear")
        steps = _plain(_need(schedule, "schedule_config", s_where))
        for key in ("require_steps", "seq_per_step"):
            if not isinstance(steps.get(key), int) or steps[key] <= 0:
                raise ConfigError(f"{s_where}.schedule_config.{key}: should be a positive integer, got "
                                  f"{steps.get(key)!r}")
        lr = block.get("layer_token_lr_schedule") or {}
        if (lr.get("enabled") if isinstance(lr, Mapping) else getattr(lr, "enabled", False)):
            raise ConfigError(f"{where}.layer_token_lr_schedule.enabled: the layer-token LR schedule is not "
                              "implemented (DeepSpeed raises too); set it false")
        self.config_schedule = {**schedule, "schedule_type": kind, "schedule_config": steps}
        self.state: dict = {}
        self.reset_to_init()

    # ---- DeepSpeed's API ---------------------------------------------------------------------
    def reset_to_init(self) -> None:
        s = self.config_schedule
        self.state.update(min_value=s["min_value"], max_value=s["max_value"], current_value=s["min_value"],
                          schedule_config=dict(s["schedule_config"]), schedule_type=s["schedule_type"],
                          consumed_layer_tokens=0, current_steps=-1)

    def get_value(self, global_steps: int) -> int:
        c = self.state["schedule_config"]
        return random_ltd_value(global_steps, self.state["min_value"], self.state["max_value"],
                                c["require_steps"], c["seq_per_step"])

    def get_current_seq(self) -> int:
        return self.state["current_value"]

    def set_current_seq(self, seq_length: int) -> None:
        self.state["current_value"] = seq_length

    def get_random_ltd_layer_num(self) -> int:
        return self.random_ltd_layer_num

    def get_state(self) -> dict:
        return self.state

    def set_state(self, state: dict) -> None:
        self.state = state

    def update_seq(self, global_steps: int) -> None:
        """Follow the schedule until it reaches max_value; count the step's layer tokens once
        per step (the first forward of each step), every layer at max_value but the routed ones."""
        s = self.state
        if s["current_value"] < s["max_value"]:
            s["current_value"] = self.get_value(global_steps)
        if global_steps != s["current_steps"]:
            routed = self.random_ltd_layer_num
            s["consumed_layer_tokens"] += self.global_batch_size * (
                s["current_value"] * routed + s["max_value"] * (self.model_layer_num - routed))
            s["current_steps"] = global_steps

    def get_total_layer_tokens(self, train_iters: int) -> int:
        """consumed_layer_tokens after steps 0 .. train_iters-1 from the start. Computed on a copy:
        DeepSpeed's runs the schedule on the scheduler itself and so moves its state."""
        fresh = copy.deepcopy(self)
        fresh.reset_to_init()
        for step in range(train_iters):
            fresh.update_seq(step)
        return fresh.state["consumed_layer_tokens"]

    def state_dict(self) -> dict:
        return {k: self.state[k] for k in ("consumed_layer_tokens", "current_steps", "current_value",
                                           "min_value", "max_value")}

    def load_state_dict(self, state_dict: dict) -> None:
        for key in ("consumed_layer_tokens", "current_steps", "current_value", "min_value", "max_value"):
            self.state[key] = state_dict[key]


# ---- which tokens a layer keeps --------------------------------------------------------------
def _signed(value: int) -> int:
    value &= _M64
    return value - (1 << 64) if value >= 1 << 63 else value


def _shr(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic: clear the copied sign bits)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser on int64 tensors (multiplication wraps modulo 2^64)."""
    x = (x ^ _shr(x, 30)) * _signed(_C1)
    x = (x ^ _shr(x, 27)) * _signed(_C2)
    return x ^ _shr(x, 31)


def _key(seed: int, step: int, layer: int) -> int:
    """One 64-bit key per (seed, step, layer), mixed on the host."""
    z = 0
    for part in (seed, step, layer):
        z = (z * _GOLDEN + (part & _M64) + _GOLDEN) & _M64
        z = ((z ^ (z >> 30)) * _C1) & _M64
        z = ((z ^ (z >> 27)) * _C2) & _M64
        z ^= z >> 31
    return _signed(z)


def kept_token_indices(seed: int, step: int, layer: int, samples: torch.Tensor, seq_len: int,
                       keep: int) -> torch.Tensor:
    """[len(samples), keep] sorted positions in [0, seq_len) for each global sample index in
    `samples` (int64, on the device the indices should live on); pure in its arguments."""
    positions = torch.arange(seq_len, dtype=torch.int64, device=samples.device)
    per_sample = _mix(samples.to(torch.int64) * _signed(_GOLDEN) + _key(seed, step, layer))
    scores = _mix(per_sample[:, None] ^ (positions[None, :] * _signed(_C1)))
    kept = torch.topk(scores, keep, dim=1, largest=False, sorted=False).indices
    return kept.sort(dim=1).values


def sample_indices(first: int, count: int, rank: int, world: int, dealing: str, micro_in_step: int,
                   device) -> torch.Tensor:
    """Global indices (within the step's batch) of this rank's `count` samples of its
    `micro_in_step`-th micro-batch. `dealing` says how the loader gave the global batch out:

        interleaved  rank r's k-th sample of the step is sample k * world + r (torch's and
                     zerotrain.initialize's DistributedSampler)
        blocked      each global micro-batch of count * world samples is cut into rank blocks
                     (zerotrain train's sampler)

    so a 1-process run, which sees the global batch in order, gives each sample the same index."""
    k = torch.arange(count, dtype=torch.int64, device=device)
    if dealing == "blocked":
        return first + micro_in_step * count * world + rank * count + k
    return first + (micro_in_step * count + k) * world + rank


# ---- gather and scatter ----------------------------------------------------------------------
def gather_tokens(hidden: torch.Tensor, kept: torch.Tensor, batch_first: bool = True) -> torch.Tensor:
    """hidden [b, s, ...] (or [s, b, ...]) -> the kept positions, [b, r, ...] (or [r, b, ...])."""
    if not batch_first:
        return gather_tokens(hidden.transpose(0, 1), kept).transpose(0, 1)
    index = kept.view(*kept.shape, *([1] * (hidden.dim() - 2))).expand(*kept.shape, *hidden.shape[2:])
    return hidden.gather(1, index)


def scatter_tokens(hidden: torch.Tensor, part: torch.Tensor, kept: torch.Tensor,
                   batch_first: bool = True) -> torch.Tensor:
    """A copy of hidden with the kept positions replaced by `part` (out of place: autograd
    sends the gradient of the kept positions to `part` and of the others to `hidden`)."""
    if not batch_first:
        return scatter_tokens(hidden.transpose(0, 1), part.transpose(0, 1), kept).transpose(0, 1)
    index = kept.view(*kept.shape, *([1] * (hidden.dim() - 2))).expand(*kept.shape, *hidden.shape[2:])
    return hidden.scatter(1, index, part.to(hidden.dtype))
