"""Loading a checkpoint into another layout: another ZeRO stage, another data-parallel size.

A checkpoint records its layout (zero/layout.py): for every param group, which part of which
parameter sits where in each rank's piece. Loading into a new layout is slice copying between
two such maps, one parameter range at a time:

    old pieces (rank files, memory-mapped)        this rank's new piece
    rank 0: | p0 | p1[:5] |       ---- p1[2:5] ---->  | p1[2:9] | p2[:4] |
    rank 1: | p1[5:] | p2 |       ---- p1[5:9] --/

For each span of this rank's new piece, the ranges of that parameter are read from every old
rank's piece that holds them. Files are opened with mmap, so only the bytes read are paged
in: no rank holds the model's state whole, nor even a whole parameter (stages 0-2 keep whole
weights in the module anyway; they are written one parameter at a time).

What the new run needs, and where each comes from in the old checkpoint, best first:

    model values (stage 3 shards,    old fp32 masters > old stage-3 shards > old module weights
      stage 0-2 module weights)
    fp32 masters (when separate)     the same
    optimizer state per element      old optimizer pieces, same key
    step, hyperparameters            old rank 0's optimizer file

Parameters are matched by name, so a stage-3 checkpoint's extra group of frozen parameters and
a stage 0-2 checkpoint's frozen weights in the module state both find their place.

A new piece is a `NewPiece`, made as it is read: an offloaded optimizer (CPU or NVMe) and
stage 3's shard stores copy it a block at a time, so loading holds no rank's piece whole
(torch's optimizer, which keeps its state in memory anyway, takes it whole). An NVMe run's
swap-file copies (RawTensors) are read by ranges like any piece, so offload may change too.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import CheckpointError
from ..zero.layout import GroupLayout
from .consolidate import group_layouts
from .raw_files import RawTensor, in_memory
from .store import load_file


def _old_ranks(layout: dict) -> list[int]:
    return list(range(int(layout["world_size"]) if int(layout["stage"]) > 0 else 1))


def _piece_numel(layout: GroupLayout, rank: int) -> int:
    lo, hi = layout.piece_range(rank)
    return hi - lo


def check_same_model(path: Path, states: dict, new: dict) -> None:
    """The parameters both layouts hold must have the same names and shapes: one line listing
    what differs. Frozen parameters are laid out only at stage 3 (stages 0-2 keep them in the
    module state), so a name in one layout only is fine when the other side has it frozen."""
    def shapes(layout):
        return {n: tuple(s) for g in layout["groups"] for n, s in zip(g["names"], g["shapes"])}

    old = states["layout"]
    was, now = shapes(old), shapes(new)
    module = states.get("module") or {}
    frozen = set(states.get("frozen") or ())
    only_old = sorted(n for n in set(was) - set(now) if n not in frozen)
    only_new = sorted(n for n in set(now) - set(was) if n not in module and n not in frozen)
    differ = sorted(n for n in set(was) & set(now) if was[n] != now[n])
    differ += sorted(n for n in set(now) - set(was) if n in module and tuple(module[n].shape) != now[n])
    if differ or only_old or only_new:
        both = {**{n: tuple(module[n].shape) for n in module if torch.is_tensor(module[n])}, **was}
        parts = [f"{n} {list(both[n])} there, {list(now[n])} here" for n in differ[:4]]
        parts += [f"{n} only in the checkpoint" for n in only_old[:4]]
        parts += [f"{n} only in this model" for n in only_new[:4]]
        raise CheckpointError(f"{path} is a checkpoint of another model: {'; '.join(parts)}; "
                              "load it into the model that wrote it")


def check_group_count(path, saved: int, run: int) -> None:
    """The optimizer's param groups are paired with the checkpoint's in order: another count
    is another grouping of the parameters (weight-decay or LR groups), said in one line."""
    if saved != run:
        raise CheckpointError(f"{path}: its optimizer has {saved} parameter group(s), this run's has {run}; give the "
                              "optimizer the same param groups (the same weight-decay and LR split) as the run that "
                              "saved it, or pass load_optimizer_states=False")


class SavedState:
    """The per-element state of an old checkpoint, read by (parameter name, element range)."""

    def __init__(self, path: Path, states: dict, prefix: str = ""):
        old = states["layout"]
        ws = old["world_size"]
        if not isinstance(ws, int) or ws < 1:
            raise CheckpointError(f"{path}/{prefix}model_states.pt: world size {ws!r} is not a rank count; "
                                  "the checkpoint is corrupted")
        self.path, self.prefix, self.layout = path, prefix, old
        self.ranks = _old_ranks(old)
        missing = [r for r in self.ranks if not (path / f"{prefix}optim_rank{r}.pt").is_file()]
        if missing:
            raise CheckpointError(f"{path}: {prefix}optim_rank{missing[0]}.pt is missing ({len(self.ranks)} ranks "
                                  f"wrote this checkpoint, {len(missing)} rank file(s) absent); copy the whole "
                                  "checkpoint folder")
        self.files = [load_file(path, f"{prefix}optim_rank{r}.pt", mmap=True) for r in self.ranks]
        self.layouts = group_layouts(path, old)
        self.module = states["module"]
        self.frozen = set(states.get("frozen") or ())
        self.aliases = old.get("aliases") or {}
        # name -> (group, index in group, [(rank position, span)])
        self.where: dict[str, tuple[int, int, list]] = {}
        for gi, (g, gl) in enumerate(zip(old["groups"], self.layouts)):
            for i, name in enumerate(g["names"]):
                self.where[name] = (gi, i, [])
            for pos, r in enumerate(self.ranks):
                for s in gl.spans(r):
                    self.where[g["names"][s.index]][2].append((pos, s))
        for pos, f in enumerate(self.files):
            for gi, gl in enumerate(self.layouts):
                for kind in ("masters", "shards"):
                    piece = self._strategy(pos, kind, gi)
                    if piece is not None and piece.numel() != _piece_numel(gl, self.ranks[pos]):
                        raise CheckpointError(f"{path.name}/{prefix}optim_rank{self.ranks[pos]}.pt: its {kind} of "
                                              f"group {gi} do not have the {_piece_numel(gl, self.ranks[pos])} elements "
                                              "its layout says; the checkpoint is corrupted")

    def _strategy(self, pos: int, kind: str, gi: int):
        pieces = (self.files[pos].get("strategy") or {}).get(kind)
        return pieces[gi] if pieces is not None and gi < len(pieces) else None

    def _optimizer_piece(self, pos: int, gi: int, key: str):
        optimizer = self.files[pos].get("optimizer")
        entry = optimizer["state"].get(gi, optimizer["state"].get(str(gi))) if optimizer else None
        return entry.get(key) if entry is not None else None

    def read(self, source, name: str, lo: int, hi: int, out: torch.Tensor) -> torch.Tensor:
        """Elements [lo, hi) of parameter `name` (flat) into `out`, from `source(pos, gi)`,
        each old rank's piece of the parameter's group."""
        gi, _, spans = self.where[name]
        for pos, s in spans:
            a, b = max(lo, s.param_lo), min(hi, s.param_lo + s.numel)
            if a < b:
                piece = source(pos, gi)
                start = s.piece_lo + a - s.param_lo
                out[a - lo : b - lo] = piece[start : start + b - a]
        return out

    def knows(self, name: str) -> bool:
        return name in self.where or name in self.module or any(name in v for v in self.aliases.values())

    def has(self, kind: str, name: str) -> bool:
        return name in self.where and self._strategy(0, kind, self.where[name][0]) is not None

    def model_values(self, name: str, lo: int, hi: int, dtype: torch.dtype) -> torch.Tensor:
        """A range of a parameter's values: from the fp32 masters where saved, else stage 3's
        shards, else the module state (whole weights of stages 0-2, and their frozen ones)."""
        out = torch.empty(hi - lo, dtype=dtype)
        for kind in ("masters", "shards"):
            if self.has(kind, name):
                return self.read(lambda pos, gi, kind=kind: self._strategy(pos, kind, gi), name, lo, hi, out)
        whole = self.module.get(name)
        if whole is None:
            first = next((k for k, v in self.aliases.items() if name in v), None)
            whole = self.module.get(first) if first is not None else None
        if whole is None:
            raise CheckpointError(f"{self.path}: holds no values of parameter {name}; the checkpoint is of "
                                  "another model or incomplete")
        return out.copy_(whole.reshape(-1)[lo:hi])

    def optimizer_values(self, key: str, name: str, lo: int, hi: int) -> torch.Tensor:
        out = torch.zeros(hi - lo, dtype=torch.float32)
        return self.read(lambda pos, gi: self._optimizer_piece(pos, gi, key), name, lo, hi, out)

    def optimizer_groups(self) -> list[dict] | None:
        """The optimizer's param groups (hyperparameters), or None when none was saved."""
        optimizer = self.files[0].get("optimizer")
        return optimizer["param_groups"] if optimizer else None

    def optimizer_entry(self, gi: int, names: list[str]) -> dict | None:
        """Rank 0's optimizer state of the group holding `names` (this run's group gi): the
        scalars (step) are used as they are, per-element tensors only for their keys."""
        optimizer = self.files[0].get("optimizer")
        if not optimizer:
            return None
        return optimizer["state"].get(gi, optimizer["state"].get(str(gi)))

    def per_element(self, gi: int, key: str, value) -> bool:
        """A state with one value per element of the piece (a tensor, or a swap file's copy)."""
        array = isinstance(value, RawTensor) or (torch.is_tensor(value) and value.dim() > 0)
        return array and value.numel() == _piece_numel(self.layouts[gi], 0)


class NewPiece:
    """This rank's piece of one param group in the new layout, made as it is read: `piece[lo:hi]`
    fills that range span by span from the old files, so what copies it a block at a time
    (the offloaded optimizer's masters and state, stage 3's shards: zero/offload/nvme_swap.py
    copy_into) never holds the piece whole; `load()` makes it whole (torch's optimizer state)."""

    def __init__(self, layout: GroupLayout, rank: int, names: list[str], fill):
        self.spans, self.names, self.fill = layout.spans(rank), names, fill
        self._numel = _piece_numel(layout, rank)

    def numel(self) -> int:
        return self._numel

    def __getitem__(self, index: slice) -> torch.Tensor:
        lo, hi, _ = index.indices(self._numel)
        out = torch.zeros(max(0, hi - lo), dtype=torch.float32)  # padding stays zero
        for s in self.spans:
            a, b = max(lo, s.piece_lo), min(hi, s.piece_lo + s.numel)
            if a < b:
                start = s.param_lo + a - s.piece_lo
                out[a - lo : b - lo] = self.fill(self.names[s.index], start, start + b - a)
        return out

    def load(self) -> torch.Tensor:
        return self[0 : self._numel]


def _names(layout: dict) -> list[list[str]]:
    return [list(g["names"]) for g in layout["groups"]]


def reshard_rank_state(path: Path, states: dict, new: dict, rank: int, prefix: str = "",
                       param_groups: list[dict] | None = None, masters: bool = True) -> dict:
    """This rank's state for layout `new` from a zerotrain checkpoint whose model_states are
    `states` (its own layout under "layout"): see `relayout`."""
    old = states["layout"]
    check_same_model(path, states, new)
    saved = SavedState(path, states, prefix)
    trained = len(param_groups) if param_groups is not None else len(new["groups"])
    old_names, new_names = _names(old), _names(new)
    for gi in range(trained):
        if gi >= len(old_names) or set(old_names[gi]) != set(new_names[gi]):
            raise CheckpointError(f"{path}: its parameter group {gi} holds other parameters than this run's; "
                                  "a checkpoint can change stage and world size, not the model's param groups")
    return relayout(saved, new, rank, param_groups, masters)


def relayout(saved: SavedState, new: dict, rank: int, param_groups: list[dict] | None = None,
             masters: bool = True) -> dict:
    """This rank's {"optimizer", "strategy", "whole"} for layout `new` from `saved`: the
    optimizer state dict, the strategy state ("shards" for stage 3, "masters" for separate
    fp32 masters), and "whole", a function (name, numel) -> the parameter's whole fp32 values
    for stages 0-2, called one parameter at a time. `param_groups` are the current optimizer's
    (their "params" entries are kept, the hyperparameters are the checkpoint's); `masters`
    False leaves out the masters of a run that has none apart from its weights."""
    new_layouts = group_layouts(saved.path, new)
    new_names = _names(new)
    trained = len(param_groups) if param_groups is not None else len(new_names)

    def piece(gi: int, fill) -> NewPiece:
        return NewPiece(new_layouts[gi], rank, new_names[gi], fill)

    def model_piece(gi):
        return piece(gi, lambda n, lo, hi: saved.model_values(n, lo, hi, torch.float32))

    strategy = {}
    if new["scheme"] == "chunked":
        strategy["shards"] = [model_piece(gi) for gi in range(len(new_names))]
    if masters:  # separate fp32 masters: the same values as the model's, kept in fp32
        strategy["masters"] = [strategy["shards"][gi] if "shards" in strategy else model_piece(gi)
                               for gi in range(trained)] + [None] * (len(new_names) - trained)

    optimizer = None
    groups = saved.optimizer_groups()
    if groups is not None:
        state = {}
        for gi in range(trained):
            entry = saved.optimizer_entry(gi, new_names[gi])
            if entry is None:
                continue
            state[gi] = {k: piece(gi, lambda n, lo, hi, k=k: saved.optimizer_values(k, n, lo, hi))
                         if saved.per_element(gi, k, v) else v for k, v in entry.items()}
        check_group_count(saved.path, len(groups), trained)
        groups = [dict(was) for was in groups]
        if param_groups is not None:  # torch's optimizer wants its own "params" ids; the stepper has none
            groups = [dict(cur, **{k: v for k, v in was.items() if k != "params"})
                      for cur, was in zip(param_groups, groups)]
        optimizer = {"state": state, "param_groups": groups}
        if param_groups is None or all("params" in g for g in param_groups):  # torch's: its state in memory
            optimizer = in_memory(optimizer)

    def whole(name: str, numel: int) -> torch.Tensor | None:
        return saved.model_values(name, 0, numel, torch.float32) if saved.knows(name) else None

    return {"optimizer": optimizer, "strategy": strategy, "whole": whole}
