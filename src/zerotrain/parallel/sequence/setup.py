"""How initialize builds a sequence-parallel job: the ModelSplit (parallel/split.py) and the
engine that cuts each batch by sequence.

    world = data x sequence          rank = data x S + sequence (sequence fastest, as DeepSpeed)

The S ranks of a sequence group read the same batch; each runs the model on its 1/S of every
sequence (batch.py) and the attention on 1/S of the heads (ulysses.py). ZeRO 0-3 runs over all
data x sequence ranks and averages gradients over both, as DeepSpeed's sequence-data group does:
the parameters and their gradients are the same kind of replica along either dimension.
"""

from __future__ import annotations

import torch

from ...config import read_config
from ...errors import ConfigError, DataError
from ...features.engine_methods import TrainingEngine
from ..split import ModelSplit
from . import batch as B
from .hf import SequenceParallelUnit, attach_hf, sequence_comms
from .ulysses import attach


def sequence_parallel_size(config) -> int | None:
    """`sequence_parallel_size` as the config gives it (None: not given), read before the rest
    (the ranks are laid out first); load_config validates the value."""
    raw = read_config(config)
    return raw.get("sequence_parallel_size") if isinstance(raw, dict) else None


def _inputs(args: tuple, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor | None, dict]:
    kwargs = dict(kwargs)
    ids = kwargs.pop("input_ids") if "input_ids" in kwargs else args[0] if args else None
    labels = kwargs.pop("labels", args[1] if len(args) > 1 else None)
    if ids is None or not torch.is_tensor(ids) or ids.dim() != 2 or len(args) > 2:
        raise DataError("sequence_parallel_size: call the model with input_ids (batch, sequence) and "
                        "optionally labels; other inputs go by keyword")
    mask = kwargs.pop("attention_mask", None)
    if mask is not None and not bool(mask.all()):
        raise DataError("sequence_parallel_size: an attention mask with padding is not split by sequence; "
                        "pad with -100 labels instead (the attention is causal)")
    if kwargs.get("position_ids") is not None:  # packed rows: positions restart, attention stays within each
        raise DataError("sequence_parallel_size: position_ids (packed sequences) are not split by sequence; each "
                        "rank's positions are its piece's; turn packing off or set sequence_parallel_size to 1")
    return ids, labels, kwargs


class SequenceParallelEngine(TrainingEngine):
    """Runs the model on this rank's piece of each sequence. With labels, the loss is the mean
    over the real labels of the whole sequences (the model is called without labels and its
    logits scored here); without, the logits of the whole sequences come back."""

    sequence_comm = None

    def call_module(self, *args, **kwargs):
        seq = self.sequence_comm
        if "shift_labels" in kwargs:  # already cut (UlyssesSPDataLoaderAdapter): score the piece
            kwargs = dict(kwargs)
            targets = kwargs.pop("shift_labels")
            kwargs.pop("labels", None)
            return self._scored(targets, *args, **kwargs)
        ids, labels, rest = _inputs(args, kwargs)
        rank, size, length = seq.rank, seq.world_size, ids.shape[1]
        positions = B.positions(length, rank, size, ids.device).unsqueeze(0)
        piece = dict(input_ids=B.shard(ids, rank, size, 0), position_ids=positions, **rest)
        if labels is not None:
            return self._scored(B.shard(B.shift_labels(labels), rank, size, B.IGNORE), **piece)
        out = self.module(**piece)
        logits = out.logits if hasattr(out, "logits") else out
        whole = _gather_sequence(logits, seq)[:, :length]
        if hasattr(out, "logits"):
            out["logits"] = whole
            return out
        return whole

    def _scored(self, targets: torch.Tensor, *args, **kwargs):
        """The model's output on this rank's piece with the group's mean loss over the real
        labels (`targets`: the piece of the shifted labels). A model that scores shift_labels
        itself (`scores_shift_labels`: its loss over tiles, logits never whole) returns its
        mean over the piece's real labels, which times their count is the piece's sum."""
        seq, size = self.sequence_comm, self.sequence_comm.world_size
        if getattr(self.module, "scores_shift_labels", False):
            out = self.module(*args, shift_labels=targets, **kwargs)
            mean = out.loss if hasattr(out, "loss") else out
            count = (targets != B.IGNORE).sum()
            local = mean * count.to(mean.dtype)
        else:
            out = self.module(*args, **kwargs)
            local, count = B.local_loss_sum(out.logits if hasattr(out, "logits") else out, targets)
        stats = torch.stack((local.detach().double(), count.double()))
        seq.all_reduce(stats)
        loss = B.group_mean(local, stats[0].to(local.dtype), stats[1], size)
        if hasattr(out, "logits"):
            out["loss"] = loss
            return out
        return loss


def _gather_sequence(piece: torch.Tensor, seq) -> torch.Tensor:
    """(batch, T/S, ...) on every rank -> (batch, T, ...) in rank order (not differentiable)."""
    piece = piece.detach().contiguous()
    out = piece.new_empty((seq.world_size, *piece.shape))
    seq.all_gather(out.view(-1), piece.view(-1))
    return torch.cat(out.unbind(0), dim=1)


def sequence_parallel_split(model: torch.nn.Module, comm, size: int | None, mpu=None, tensor: int = 1) -> ModelSplit:
    """`size` None: the mpu's (register_with_transformers)."""
    if tensor > 1:
        raise ConfigError("sequence_parallel_size with tensor_parallel: the two are not combined here; use one")
    if type(model).__name__ == "PipelineModule":
        raise ConfigError("sequence_parallel_size with a PipelineModule: the two are not combined here; use one")
    if mpu is not None:  # register_with_transformers made the groups and routed the attention
        if not isinstance(mpu, SequenceParallelUnit):
            raise ConfigError("sequence_parallel_size builds its own groups; pass no mpu= with it, or the one "
                              "UlyssesSPAttentionHF.register_with_transformers returns")
        if size not in (None, mpu.sequence.world_size):
            raise ConfigError(f"sequence_parallel_size {size} in the config, {mpu.sequence.world_size} in the mpu "
                              "register_with_transformers returned; make them equal or drop the key")
        seq_comm, batch_comm = mpu.sequence, mpu.data
    else:
        unit = sequence_comms(size)
        seq_comm, batch_comm = unit.sequence, unit.data
        if attach(model, seq_comm) == 0 and not attach_hf(model, seq_comm):
            raise ConfigError(f"sequence_parallel_size {size}: {type(model).__name__} has no attention zerotrain can "
                              "split by heads (zerotrain's GPT, a transformers model); set sequence_parallel_size "
                              "to 1")

    def check(cfg) -> None:
        if cfg.pipeline is not None:
            raise ConfigError("sequence_parallel_size with a pipeline block: the two are not combined here; use one")

    def make_engine(*args, **kwargs):
        engine = SequenceParallelEngine(*args, **kwargs)
        engine.sequence_comm = seq_comm
        engine.sequence_multiple = seq_comm.world_size
        # the engine's cut: the sequence ranks of a data index read the same batch (count it once);
        # the adapter's pieces are each rank's own
        engine.input_replica = mpu is None and seq_comm.rank > 0
        return engine

    return ModelSplit(comm, check=check, make_engine=make_engine, batch_comm=batch_comm)
