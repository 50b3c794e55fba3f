"""Ulysses for Hugging Face models, under DeepSpeed's ALST names.

    mpu = UlyssesSPAttentionHF.register_with_transformers(model, "sdpa", sequence_parallel_size=S,
                                                          micro_batch_size=1, seq_length=None,
                                                          seq_length_is_variable=True)
    engine, *_ = zerotrain.initialize(model=model, config=..., mpu=mpu)
    loader = UlyssesSPDataLoaderAdapter(loader, sp_rank=mpu.get_sequence_parallel_rank(),
                                        sp_group=mpu.get_sequence_parallel_group(),
                                        sp_world_size=mpu.get_sequence_parallel_world_size(), device=...)
    for batch in loader:                      # input_ids, position_ids, shift_labels: this rank's piece
        loss = engine(**batch).loss           # the mean over the real labels of the whole sequences

The model's attention runs under a name of its own in transformers' attention registry
("ulysses"), which has no mask function, so the model builds no mask: the wrapper exchanges
q, k, v (ulysses.py's all-to-all), runs the chosen core ("sdpa" or "eager") causally over the
whole sequence on 1/S of the heads, and exchanges the output back. With fewer key/value heads
than S, each is repeated S / kv_heads times first, so every rank holds one. A layer with a
sliding window (Mistral, Qwen2's sliding layers) shorter than the sequence gets the window's
mask, built here as transformers' does: position q sees k when q - window < k <= q.
"""

from __future__ import annotations

import math
import types

import torch

from ...comm import Comm, init_parallel
from ...comm.mesh import ParallelMesh
from ...errors import ConfigError
from . import batch as B
from .ulysses import SeqAllToAll

NAME = "ulysses"
_CORES: dict = {}  # id(model config) -> (core name, sequence Comm)


def _eager(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None, **_):
    """Causal attention (`attention_mask`: a boolean (1, 1, T, T) mask that replaces the causal one)."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scores = query @ key.transpose(2, 3) * (scaling if scaling is not None else 1 / math.sqrt(query.shape[-1]))
    t = query.shape[2]
    allowed = attention_mask if attention_mask is not None else \
        torch.ones(t, t, dtype=torch.bool, device=query.device).tril()
    probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1, dtype=torch.float32).to(query.dtype)
    probs = torch.nn.functional.dropout(probs, p=dropout, training=module.training)
    return (probs @ value).transpose(1, 2).contiguous(), probs


def _core(name: str):
    if name == "eager":
        return _eager
    if name == "sdpa":
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward
    raise ConfigError(f"core_attn_implementation {name!r}: should be 'sdpa' or 'eager'")


def _window_mask(length: int, window: int | None, device) -> torch.Tensor | None:
    """The boolean (1, 1, T, T) sliding-window causal mask (True: attend), or None where the
    window covers the sequence (plain causal attention, which the cores run without a mask)."""
    if window is None or window >= length:
        return None
    q = torch.arange(length, device=device)
    offset = q[:, None] - q[None, :]  # q - k
    return ((offset >= 0) & (offset < window))[None, None]


def _ulysses_attention(module, query, key, value, attention_mask, *args, **kwargs):
    """transformers' attention interface: (batch, heads, T/S, d) in, (batch, T/S, heads, d) out."""
    core, comm = _CORES[id(module.config)]
    window = kwargs.pop("sliding_window", None)
    size, kv = comm.world_size, key.shape[1]
    if kv % size:  # fewer key/value heads than ranks: one per rank after repeating
        key, value = key.repeat_interleave(size // kv, dim=1), value.repeat_interleave(size // kv, dim=1)
    q = SeqAllToAll.apply(query, comm, 1, 2)
    kv_whole = SeqAllToAll.apply(torch.stack((key, value)), comm, 2, 3)
    local = types.SimpleNamespace(num_key_value_groups=q.shape[1] // kv_whole.shape[2], is_causal=True,
                                  training=module.training, config=module.config)
    mask = _window_mask(q.shape[2], window, q.device)
    out, _ = _core(core)(local, q, kv_whole[0], kv_whole[1], mask, *args, **kwargs)  # (b, T, h/S, d)
    return SeqAllToAll.apply(out, comm, 1, 2), None


def check_heads(config, size: int) -> None:
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    if heads % size:
        raise ConfigError(f"sequence_parallel_size {size}: the model has {heads} attention heads per layer, not a "
                          f"multiple of {size}; use a size that divides {heads}")
    if kv % size and size % kv:
        raise ConfigError(f"sequence_parallel_size {size}: the model's {kv} key/value heads neither divide by {size} "
                          f"nor divide it; use a size that {kv} divides or that divides {kv}")


def attach_hf(model: torch.nn.Module, comm, core: str | None = None) -> bool:
    """Route an HF model's attention through the Ulysses wrapper; False if it is not one."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "_attn_implementation") or not hasattr(config, "num_attention_heads"):
        return False
    attentions = [m for m in model.modules() if isinstance(getattr(m, "is_causal", None), bool)]
    if not attentions or not all(m.is_causal for m in attentions):  # the loss is next-token (labels shifted)
        raise ConfigError(f"sequence_parallel_size {comm.world_size}: {type(model).__name__} is not a causal "
                          "decoder; sequence parallelism splits zerotrain's GPT and HF decoders")
    check_heads(config, comm.world_size)
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, _ulysses_attention)
    current = config._attn_implementation
    core = core or (current if current in ("sdpa", "eager") else "sdpa")
    _core(core)
    for sub in model.modules():  # the config every attention layer reads (text configs of composite models too)
        c = getattr(sub, "config", None)
        if c is not None and hasattr(c, "_attn_implementation"):
            _CORES[id(c)] = (core, comm)
            c._attn_implementation = NAME
    return True


class SequenceParallelUnit:
    """The mpu register_with_transformers returns: DeepSpeed's sequence-parallel queries."""

    def __init__(self, sequence: Comm, data: Comm, world: Comm):
        self.sequence, self.data, self.world = sequence, data, world

    def get_sequence_parallel_group(self):
        return self.sequence.group

    def get_sequence_parallel_world_size(self) -> int:
        return self.sequence.world_size

    def get_sequence_parallel_rank(self) -> int:
        return self.sequence.rank

    def get_sequence_data_parallel_group(self):
        return self.world.group

    def get_sequence_data_parallel_world_size(self) -> int:
        return self.world.world_size

    def get_sequence_data_parallel_rank(self) -> int:
        return self.world.rank

    def get_data_parallel_group(self):
        return self.data.group

    def get_data_parallel_world_size(self) -> int:
        return self.data.world_size

    def get_data_parallel_rank(self) -> int:
        return self.data.rank


def sequence_comms(size: int) -> SequenceParallelUnit:
    """The groups of data x sequence (rank = data x S + sequence): the "sequence" and "data"
    dimensions of the job's mesh (comm/mesh.py), made by every rank at once."""
    state = init_parallel()
    world = state.world_size
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ConfigError(f"sequence_parallel_size {size!r}: should be a positive integer")
    if world % size:
        raise ConfigError(f"sequence_parallel_size {size}: the job has {world} process{'es' * (world > 1)}, not a "
                          f"multiple of {size}; launch a multiple of {size} (torchrun --nproc_per_node) or change it")
    mesh = ParallelMesh(state, sequence=size)
    return SequenceParallelUnit(mesh.comm("sequence"), mesh.comm("data"), Comm(state))


class UlyssesSPAttentionHF:
    @staticmethod
    def register_with_transformers(model_name_or_path, core_attn_implementation: str, sequence_parallel_size: int,
                                   micro_batch_size: int = 1, seq_length: int | None = None,
                                   seq_length_is_variable: bool = True) -> SequenceParallelUnit:
        """Route the model's attention through Ulysses; the mpu for initialize. `model_name_or_path`:
        the model itself. `micro_batch_size`, `seq_length` and `seq_length_is_variable` are
        accepted for DeepSpeed's signature: shapes are read from each batch."""
        if isinstance(model_name_or_path, (str, bytes)) or not isinstance(model_name_or_path, torch.nn.Module):
            raise ConfigError("register_with_transformers: pass the model object (model_name_or_path=model); a name "
                              "would change every model of the process")
        unit = sequence_comms(sequence_parallel_size)
        if not attach_hf(model_name_or_path, unit.sequence, core_attn_implementation):
            raise ConfigError(f"register_with_transformers: {type(model_name_or_path).__name__} is not a transformers "
                              "model (it has no config with attention heads)")
        return unit


class UlyssesSPDataLoaderAdapter:
    """Wraps a loader of dicts with input_ids and labels (the same batch on every rank of a
    sequence group): yields this rank's piece of input_ids, its global position_ids and its
    piece of shift_labels (the labels shifted over the whole sequence, -100 padded)."""

    def __init__(self, dl, sp_rank: int, sp_group, sp_world_size: int, device=None):
        self.dl, self.rank, self.size, self.device = dl, sp_rank, sp_world_size, device

    def __len__(self) -> int:
        return len(self.dl)

    def __iter__(self):
        for batch in self.dl:
            yield self.shard(batch)

    def shard(self, batch: dict) -> dict:
        batch = dict(batch)
        ids = batch.pop("input_ids")
        labels = batch.pop("labels", None)
        mask = batch.pop("attention_mask", None)
        if mask is not None and not bool(mask.all()):
            raise ConfigError("UlyssesSPDataLoaderAdapter: an attention mask with padding is not split by sequence; "
                              "pad with -100 labels instead (the attention is causal)")
        batch.pop("position_ids", None)
        length = ids.shape[1]
        out = {"input_ids": B.shard(ids, self.rank, self.size, 0),
               "position_ids": B.positions(length, self.rank, self.size).expand(ids.shape[0], -1)}
        if labels is not None:
            out["shift_labels"] = B.shard(B.shift_labels(labels), self.rank, self.size, B.IGNORE)
        out.update(batch)
        if self.device is not None:
            out = {k: v.to(self.device) if torch.is_tensor(v) else v for k, v in out.items()}
        return out
