"""DeepSpeed's AutoTP checkpoints (`tensor_parallel.autotp_size` T), read without DeepSpeed.

    <dir>/global_stepN/mp_rank_TT_model_states.pt    tensor rank TT's pieces of the weights,
                                                     counters, schedule, "param_shapes" (its
                                                     pieces' shapes), "universal_checkpoint_info"
    <dir>/global_stepN/[bf16_]zero_pp_rank_R_mp_rank_TT_optim_states.pt   tensor rank TT's ZeRO
                                                     0-1 masters and optimizer state, data rank R

AutoTP cuts a linear layer's weight on its output rows (q, k, v, gate, up; the head's
vocabulary) or, for the layers after them ("row parallel": o_proj, down_proj), on its input
columns, and keeps norms and embeddings whole on every rank. DeepSpeed records which is which
by name pattern in "universal_checkpoint_info" (row-parallel and replicated patterns, and each
parameter's whole shape in its "affine_map"). So the folder is a `SavedSplit`
(checkpoint/resplit.py) of one stage and T tensor ranks, each a data-parallel ZeRO checkpoint
of its pieces (checkpoint/deepspeed.py with mp = TT): a plain model, or a zerotrain
tensor-parallel one of any size, takes its pieces by name.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import CheckpointError
from .deepspeed import DeepSpeedState, LAYER, check_version, load_ds_file, model_file
from .deepspeed_pipe import DeepSpeedSplit


def is_autotp_folder(path: Path) -> bool:
    """A DeepSpeed folder of several tensor ranks (with DeepSpeed's record of their cuts) and no
    pipeline layer files."""
    if any(LAYER.fullmatch(f.name) for f in path.iterdir()) or not (path / model_file(0)).is_file():
        return False
    states = load_ds_file(path / model_file(0))
    return int(states.get("mp_world_size") or 1) > 1 and bool(states.get("universal_checkpoint_info"))


def cut_dims(info: dict, pieces: dict[str, tuple], tensor: int) -> dict[str, dict]:
    """{name: {"dim", "shape", "parts"}} for every parameter cut over the tensor ranks, from
    DeepSpeed's record: row-parallel ones on dim 1, replicated ones not at all, the rest on dim 0."""
    def matches(key: str, name: str) -> bool:
        return any(re.fullmatch(p, name) for p in info.get(key) or [])

    whole = {}
    for pattern, record in ((info.get("affine_map") or {}).get("params") or {}).items():
        for name in pieces:
            if re.fullmatch(pattern, name):
                whole[name] = tuple(record["logical_shape"])
    out = {}
    for name, piece in pieces.items():
        if matches("tp_replicated_parameter_patterns", name):
            continue
        dim = 1 if matches("parameter_with_row_parallelism_patterns", name) else 0
        shape = list(piece)
        shape[dim] *= tensor
        if name in whole and tuple(shape) != whole[name]:
            raise CheckpointError(f"{name}: DeepSpeed's AutoTP piece {list(piece)} x {tensor} tensor ranks is not its "
                                  f"recorded whole shape {list(whole[name])} (a padded vocabulary or a fused "
                                  "weight); zerotrain reads AutoTP checkpoints of plainly cut weights")
        out[name] = {"dim": dim, "shape": shape, "parts": 1}
    return out


class DeepSpeedAutoTP(DeepSpeedSplit):
    """A DeepSpeed AutoTP folder as the old split of a resume: one stage of T tensor ranks."""

    def __init__(self, path: Path, new_split: dict | None = None):
        self.path = path
        first = load_ds_file(path / model_file(0))
        check_version(path, first, tensor_ranks_read=True)
        tensor = int(first.get("mp_world_size") or 1)
        missing = [t for t in range(tensor) if not (path / model_file(t)).is_file()]
        if missing:
            raise CheckpointError(f"{path}: {model_file(missing[0])} is missing ({tensor} tensor ranks wrote this "
                                  f"DeepSpeed AutoTP checkpoint, {len(missing)} file(s) absent); copy the whole folder")
        pieces = {n: tuple(v) for group in first.get("param_shapes") or [] for n, v in group.items()}
        if not pieces:
            raise CheckpointError(f"{path}: a DeepSpeed AutoTP checkpoint without the names of its parameters "
                                  "(param_shapes); zerotrain reads AutoTP folders of ZeRO stage 1: resume the run in "
                                  "DeepSpeed at ZeRO stage 1 and save again")
        names = list(pieces)
        self.stages = [[DeepSpeedState(path, names, mp=t, tensor_rank=True) for t in range(tensor)]]
        self.splits = [cut_dims(first["universal_checkpoint_info"], pieces, tensor)]
        self.whole = {n: tuple(self.splits[0][n]["shape"]) if n in self.splits[0] else s for n, s in pieces.items()}
        self.holder = {n: 0 for n in [*names, *self.stages[0][0].module]}
        self.states, self.aliases = first, {}
        self.for_split(new_split)

    def shapes(self) -> dict[str, tuple]:
        return dict(self.whole)

    def describe(self) -> str:
        state = self.stages[0][0]
        return (f"DeepSpeed {self.states.get('ds_version')} AutoTP checkpoint ({len(self.stages[0])} tensor ranks, "
                f"ZeRO stage {state.stage}, {state.ranks} data-parallel rank(s))")
