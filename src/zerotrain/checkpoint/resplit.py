"""Loading a checkpoint into another model split: another tensor-parallel size, another
pipeline (stage count or partition), or none of either.

A checkpoint of a split model holds one set of files per pipeline stage and tensor rank
(`pipe_01-tp_00-model_states.pt`, `pipe_01-tp_00-optim_rank0.pt`, ...), each a ZeRO
checkpoint of that rank's parameters over its data-parallel group (reshard.py reads one).
Parameters keep their names across splits: a pipeline layer is `<layer index>.<name>` on
whatever stage holds it, and a tensor-parallel weight has one name on every tensor rank.
So this rank's state for its new piece is found by name:

    pipeline   the first old stage that holds the name (a tied layer: every holder has the
               same values and state, its gradients are summed over them)
    tensor     old pieces of T ranks -> this rank's piece of T' along the recorded dimension
               (model_states' "tensor_split": dim, whole shape, fused parts):

                   whole dim d:  | t0 of T=2        | t1 of T=2        |
                   new piece:              | t1 of T'=4 |
                                 read from old rank 0 only, the overlap copied

               A fused q/k/v weight is cut per part ([q_r; k_r; v_r] on rank r), so each
               part's rows are cut the same way, part by part.

Every value (weights, fp32 masters, each optimizer state) of one parameter is made this
way, one parameter at a time: a rank holds at most its new piece of one parameter and one
old rank's piece of it besides what it keeps anyway.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import CheckpointError
from .consolidate import model_file_sets
from .reshard import SavedState
from .store import load_file


def _dims(shape: list[int], dim: int, size: int) -> list[int]:
    """The local shape of one of `size` pieces of a tensor of `shape` cut on `dim`."""
    out = list(shape)
    out[dim] = shape[dim] // size
    return out


def cut_piece(read, shape: list[int], dim: int, parts: int, old_size: int, new_size: int,
              new_rank: int) -> torch.Tensor:
    """Tensor rank `new_rank` of `new_size`'s piece (flat) of a tensor of whole `shape` cut on
    `dim` into `parts` x size blocks, from the pieces of `old_size` ranks: `read(t)` gives old
    rank t's piece flat, and is called only for the ranks whose piece overlaps the new one."""
    block = shape[dim] // parts  # one part's extent on dim
    n_old, n_new = block // old_size, block // new_size
    new_shape = _dims(shape, dim, new_size)
    old_shape = _dims(shape, dim, old_size)
    out = None
    first, last = new_rank * n_new, (new_rank + 1) * n_new
    for t in range(old_size):
        a, b = max(first, t * n_old), min(last, (t + 1) * n_old)
        if a >= b:
            continue
        src = read(t).reshape(old_shape).unflatten(dim, (parts, n_old))
        if out is None:
            out = torch.empty(new_shape, dtype=src.dtype).unflatten(dim, (parts, n_new))
        out.narrow(dim + 1, a - first, b - a).copy_(src.narrow(dim + 1, a - t * n_old, b - a))
    return out.reshape(-1)


def by_layer(names, layer) -> list[list[str]]:
    """`names` grouped by `layer(name)`, the groups in layer order."""
    groups: dict[int, list[str]] = {}
    for name in names:
        groups.setdefault(layer(name), []).append(name)
    return [groups[k] for k in sorted(groups)]


def check_divides(name: str, shape: list[int], dim: int, parts: int, size: int) -> None:
    if shape[dim] % (parts * size):
        per = f" ({parts} fused parts of {shape[dim] // parts})" if parts > 1 else ""
        raise CheckpointError(f"{name}: dimension {dim} has {shape[dim]} elements{per}, not divisible by the tensor "
                              f"size {size}; resume with a tensor_parallel.autotp_size that divides it")


class SavedSplit:
    """An old checkpoint of any pipeline and tensor split, read for this rank's new split:
    the interface `reshard.relayout` reads (model_values, optimizer_values, ...), with a
    parameter's element ranges counted in this rank's piece of it."""

    def __init__(self, path: Path, new_split: dict | None):
        self.path = path
        self.stages: list[list[SavedState]] = []  # per old pipeline stage, per old tensor rank
        self.splits: list[dict] = []  # per old stage: {name: {"dim", "shape", "parts"}}
        self.holder: dict[str, int] = {}  # name -> first old stage holding it (layout or module)
        self.states: dict = {}
        for ranks in model_file_sets(path):
            states = [load_file(path, f"{prefix}model_states.pt", mmap=True) for _, prefix in ranks]
            record = states[0].get("tensor_split") or {}
            if ranks[0][0] is not None and record.get("size") != len(ranks):
                raise CheckpointError(f"{path}: {ranks[0][1]}model_states.pt records {record.get('size')} tensor "
                                      f"ranks, the folder holds files of {len(ranks)}; the checkpoint is incomplete")
            self.stages.append([SavedState(path, s, prefix) for s, (_, prefix) in zip(states, ranks)])
            self.splits.append(record.get("split") or {})
            si = len(self.stages) - 1
            for name in list(self.stages[-1][0].where) + list(states[0]["module"]):
                self.holder.setdefault(name, si)
            self.states = self.states if si else states[0]  # counters, schedule, features: the first's
        self.aliases = {k: v for stage in self.stages for k, v in stage[0].aliases.items()}
        self.for_split(new_split)

    def for_split(self, new_split: dict | None) -> None:
        """This rank's new tensor split (None: whole), which the pieces are cut for."""
        self.new = (new_split or {}).get("split") or {}
        self.new_size, self.new_rank = ((new_split or {}).get("size") or 1), ((new_split or {}).get("rank") or 0)
        self._entry_from: dict[int, tuple[SavedState, int]] = {}
        self._last: tuple = (None, None)  # ((what, name), this rank's piece of it)

    # ---- what the checkpoint holds ---------------------------------------------------------
    def shapes(self) -> dict[str, tuple]:
        """Whole shape of every trained parameter the old split holds (its layouts)."""
        out = {}
        for si, stage in enumerate(self.stages):
            for g in stage[0].layout["groups"]:
                for n, shape in zip(g["names"], g["shapes"]):
                    record = self.splits[si].get(n)
                    out.setdefault(n, tuple(record["shape"]) if record else tuple(shape))
        return out

    def frozen(self) -> set[str]:
        return {n for stage in self.stages for n in stage[0].frozen}

    def layers(self) -> list[list[str]]:
        """The trained parameters by pipeline layer, in layer order: "<layer>.<name>" in its
        layer, a tied key's in the first layer using it (the pipeline's "tied_layers")."""
        record = self.states.get("pipeline") or {}
        tied, parts = record.get("tied_layers") or {}, record.get("parts") or [0]

        def layer(name: str) -> int:
            head, _, rest = name.partition(".")
            if head.isdigit():
                return int(head)
            return int(tied.get(rest.partition(".")[0], parts[min(self.holder.get(name, 0), len(parts) - 1)]))

        return by_layer(self.shapes(), layer)

    def knows(self, name: str) -> bool:
        return name in self.holder or any(name in v for v in self.aliases.values())

    # ---- one parameter's piece ---------------------------------------------------------------
    def _cut(self, name: str, what: str, read, lo: int, hi: int) -> torch.Tensor:
        """Elements [lo, hi) of this rank's piece of `name`'s `what` (weights, a state key),
        where read(state, name, lo, hi) reads a range of an old tensor rank's piece from its
        SavedState. The last piece cut is kept while ranges of it are asked for (a block
        copy reads a large parameter in several ranges): one parameter's at a time."""
        if name not in self.holder:
            first = next((k for k, v in self.aliases.items() if name in v), None)
            if first is None or first not in self.holder:
                raise CheckpointError(f"{self.path}: holds no values of parameter {name}; the checkpoint is of "
                                      "another model or incomplete")
            name = first
        si = self.holder[name]
        ranks = self.stages[si]
        old, new = self.splits[si].get(name), self.new.get(name)
        if old is None and new is None:  # whole on every tensor rank, old and new
            return read(ranks[0], name, lo, hi)
        rec = new or old
        if old is not None and new is not None and (old["dim"], old["parts"], list(old["shape"])) != (
                new["dim"], new["parts"], list(new["shape"])):
            raise CheckpointError(f"{self.path}: {name} was split on dimension {old['dim']} of {old['shape']}, "
                                  f"this run splits it on {new['dim']} of {new['shape']}; the checkpoint is of "
                                  "another model")
        shape, dim, parts = list(rec["shape"]), rec["dim"], rec["parts"]
        old_size = len(ranks) if old is not None else 1
        new_size, new_rank = (self.new_size, self.new_rank) if new is not None else (1, 0)
        check_divides(name, shape, dim, parts, new_size)
        numel = 1
        for d in _dims(shape, dim, old_size):
            numel *= d
        if self._last[0] != (what, name):
            self._last = (None, None)  # the previous one goes before the next is made
            self._last = ((what, name), cut_piece(lambda t: read(ranks[t], name, 0, numel), shape, dim, parts,
                                                  old_size, new_size, new_rank))
        return self._last[1][lo:hi]

    def model_values(self, name: str, lo: int, hi: int, dtype: torch.dtype) -> torch.Tensor:
        return self._cut(name, ":weights", lambda s, n, a, b: s.model_values(n, a, b, torch.float32), lo, hi).to(dtype)

    def optimizer_values(self, key: str, name: str, lo: int, hi: int) -> torch.Tensor:
        return self._cut(name, key, lambda s, n, a, b: s.optimizer_values(key, n, a, b), lo, hi)

    def module_value(self, key: str, like: torch.Tensor) -> torch.Tensor:
        """A module-state entry (a buffer, a frozen weight) as this rank holds it."""
        def read(s, n, a, b):
            return s.module[n].reshape(-1)[a:b]

        return self._cut(key, ":module", read, 0, like.numel()).reshape(like.shape)

    # ---- optimizer scalars and hyperparameters -----------------------------------------------
    def optimizer_groups(self) -> list[dict] | None:
        return self.stages[0][0].optimizer_groups()

    def optimizer_entry(self, gi: int, names: list[str]) -> dict | None:
        """Group gi's scalars (step) from the old stage holding its first parameter."""
        held = next((n for n in names if n in self.holder and n in self.stages[self.holder[n]][0].where), None)
        if held is None:
            return None
        state = self.stages[self.holder[held]][0]
        old_gi = state.where[held][0]
        self._entry_from[gi] = (state, old_gi)
        return state.optimizer_entry(old_gi, names)

    def per_element(self, gi: int, key: str, value) -> bool:
        state, old_gi = self._entry_from[gi]
        return state.per_element(old_gi, key, value)
