"""Whole fp32 weights from the per-rank files of a checkpoint of any ZeRO stage.

Training checkpoints hold what each rank owns, laid out for the stage that wrote them; to
evaluate, fine-tune elsewhere or publish a model, one wants a plain state dict. The layout
saved in model_states.pt says where every parameter sits (zero/layout.py: "flat", one padded
buffer cut into N contiguous shards; "chunked", every parameter cut into N chunks), so the
weights can be put back together offline, one rank file at a time, without the model's code.

A pipeline checkpoint holds one such set of files per stage (`pipe_00-model_states.pt`,
`pipe_00-optim_rank0.pt`, ...): each is put together on its own and the stages' state dicts
are merged into one model (a tied layer, held by several stages, is taken from the first).

A tensor-parallel checkpoint holds one set per tensor rank (`tp_00-...`, `tp_01-...`; with a
pipeline `pipe_00-tp_01-...`): each rank's local pieces are put together as above, then each
split tensor is joined along the dimension its "tensor_split" record names (colwise layers on
dim 0, rowwise on dim 1, the vocabulary's embedding and head on their rows; a fused q/k/v put
back in the model's order), and what every tensor rank holds whole is taken from rank 0:

    tp_00-* files: W[:, :h/2]  (its data ranks' pieces glued) --+
                                                                +--> cat(dim=1) = W, the model's name
    tp_01-* files: W[:, h/2:]  (likewise) ----------------------+

Sources, best first: the fp32 masters (mixed precision: the module holds only their half
cast), then stage 3's parameter shards, then the module state (stages 0-2 in fp32 keep whole
weights there). Buffers and frozen parameters always come from the module state.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Protocol

import torch

from ..parallel.tensor.dtensor import model_order
from ..errors import CheckpointError
from ..zero.layout import GroupLayout
from .safetensors_out import save_safetensors
from .store import MANIFEST, load_file, resolve_checkpoint, verify_checkpoint


def _folder(ckpt_dir, tag) -> Path:
    """A save_dir (with `latest` or a tag) or one tag folder itself."""
    ckpt_dir = Path(ckpt_dir)
    if tag is None and (ckpt_dir / MANIFEST).is_file():
        return ckpt_dir
    return resolve_checkpoint(ckpt_dir, tag)


def _model_states(path: Path, prefix: str = "") -> tuple[dict, dict]:
    states = load_file(path, f"{prefix}model_states.pt")
    layout = states.get("layout") if isinstance(states, dict) else None
    if not isinstance(layout, dict) or layout.get("scheme") not in ("flat", "chunked") \
            or not isinstance(states.get("module"), dict):
        raise CheckpointError(f"{path}/model_states.pt has no parameter layout; it was not written by "
                              "zerotrain's engine.save_checkpoint")
    keys = ("names", "shapes", "offsets", "numels", "shard_numel") + (("full_numels",) if layout["scheme"] == "chunked" else ())
    groups = layout.get("groups")
    if not isinstance(groups, list) or not all(isinstance(g, dict) and all(k in g for k in keys) for g in groups) \
            or not isinstance(layout.get("world_size"), int) or not isinstance(layout.get("stage"), int):
        raise CheckpointError(f"{path}/model_states.pt: the parameter layout is malformed; the checkpoint is corrupted")
    if states.get("world_size", layout.get("world_size")) != layout.get("world_size"):
        raise CheckpointError(f"{path}/model_states.pt: world size {states.get('world_size')} != "
                              f"{layout.get('world_size')} in its layout; the checkpoint is corrupted")
    return states, layout


def group_layouts(path: Path, layout: dict) -> list[GroupLayout]:
    """The saved layout of every param group, checked against the layout arithmetic."""
    try:
        return [GroupLayout.from_saved(g, layout["scheme"], int(layout["world_size"]), int(layout["stage"]))
                for g in layout["groups"]]
    except (ValueError, TypeError, KeyError) as e:
        raise CheckpointError(f"{path}/model_states.pt: the parameter layout is malformed ({e}); "
                              "the checkpoint is corrupted") from None


def _aliases(module: dict, names: list[str], layout: dict) -> dict[str, list[str]]:
    """Other state-dict names of each (tied) parameter. The layout names a parameter once; the
    module state of stages 0-2 holds every name, and identical views mean one parameter."""
    found = {k: list(v) for k, v in (layout.get("aliases") or {}).items()}
    ident = lambda t: (t.data_ptr(), t.dtype, tuple(t.shape), t.stride())
    by_ident = {ident(module[n]): n for n in names if n in module and module[n].numel()}
    for key, t in module.items():
        first = by_ident.get(ident(t)) if torch.is_tensor(t) and t.numel() else None
        if first is not None and key != first and key not in found.get(first, []):
            found.setdefault(first, []).append(key)
    return found


def _rank_pieces(path: Path, layout: dict, rank: int, prefix: str = "") -> tuple[str | None, list]:
    """The per-group pieces rank `rank` saved (tensors, or RawTensors over swap-file copies),
    and which kind they are: masters first, else stage 3's shards."""
    state = load_file(path, f"{prefix}optim_rank{rank}.pt")
    strategy = state.get("strategy") if isinstance(state, dict) else None
    if not isinstance(strategy, dict):
        raise CheckpointError(f"{path.name}/{prefix}optim_rank{rank}.pt has no strategy state; the checkpoint is incomplete")
    kind = "masters" if "masters" in strategy else "shards" if "shards" in strategy else None
    if kind is None:
        return None, []
    pieces = strategy.get(kind)
    if not isinstance(pieces, (list, tuple)) or len(pieces) != len(layout["groups"]):
        raise CheckpointError(f"{path.name}/{prefix}optim_rank{rank}.pt: {kind} for {len(pieces or [])} param groups, "
                              f"layout has {len(layout['groups'])}; the checkpoint is incomplete or mismatched")
    shards = strategy.get("shards") or [None] * len(pieces)
    # a group without masters (stage 3's frozen parameters) comes from its shards
    return kind, [piece if piece is not None else shards[gi] for gi, piece in enumerate(pieces)]


_FILE = re.compile(r"(pipe_\d+-)?(?:tp_(\d+)-)?model_states\.pt")


def model_file_sets(path: Path) -> list[list[tuple[int | None, str]]]:
    """The prefixes of a checkpoint's model files by pipeline stage, each stage's tensor ranks
    in order as (tensor rank or None, prefix): [[(None, "")]] for a whole model, [[(None,
    "pipe_00-")], ...] for a pipeline, [[(0, "tp_00-"), (1, "tp_01-")]] for tensor parallelism."""
    stages: dict[str, list] = {}
    for f in sorted(Path(path).glob("*model_states.pt")):
        m = _FILE.fullmatch(f.name)
        if m is not None and (m[1] or m[2] is not None):
            rank = None if m[2] is None else int(m[2])
            stages.setdefault(m[1] or "", []).append((rank, f.name[: -len("model_states.pt")]))
    return [sorted(ranks, key=lambda r: r[0] or 0) for _, ranks in sorted(stages.items())] or [[(None, "")]]


class ModelFiles(Protocol):
    """What consolidation reads from one part of a model (the whole, or a pipeline stage)."""

    def keys(self) -> list[str]:
        """The state-dict names, in order (every alias of a tied parameter)."""

    def param_of(self, key: str) -> str | None:
        """The name the layout holds a (tied) parameter under; None for what only the module
        state holds (buffers)."""

    def spec(self, key: str) -> tuple[tuple, torch.dtype]:
        """(whole shape, dtype written) of `key`, without reading its values."""

    def tensor(self, key: str) -> torch.Tensor:
        """`key` put together whole (fp32 for parameters)."""


class _Plan:
    """One set of model files (a whole model, a pipeline stage, or one tensor rank's pieces of
    either): which names the full state dict has, and each tensor assembled on demand from
    every data-parallel rank's piece, one parameter at a time (a piece in a swap-file copy is
    read only where that parameter sits)."""

    def __init__(self, path: Path, prefix: str):
        states, layout = _model_states(path, prefix)
        self.module, self.prefix = states["module"], prefix
        self.split = states.get("tensor_split")  # None: not tensor-parallel (or saved before it was recorded)
        self.frozen = set(states.get("frozen", ())) if states.get("frozen_excluded") else set()  # left out on purpose
        self.all_frozen = set(states.get("frozen", ()))
        ws, stage, groups = int(layout["world_size"]), int(layout["stage"]), layout["groups"]
        layouts = group_layouts(path, layout)
        ranks = range(ws if stage > 0 else 1)  # stage 0: rank 0 saves for all
        absent = [f"{prefix}optim_rank{r}.pt" for r in ranks if not (path / f"{prefix}optim_rank{r}.pt").is_file()]
        if absent:
            raise CheckpointError(f"{path.name}/{absent[0]}: missing ({len(absent)} of {len(ranks)} rank files); "
                                  "the checkpoint is incomplete")
        self.where = {n: (gi, i) for gi, g in enumerate(groups) for i, n in enumerate(g["names"])}
        self.shapes = {n: tuple(sh) for g in groups for n, sh in zip(g["names"], g["shapes"])}
        self.numels = {n: int(k) for g in groups for n, k in zip(g["names"], g.get("full_numels", g["numels"]))}
        self.parts: dict[tuple[int, int], list] = {}  # (group, index) -> [(piece, Span)]
        source = None
        for rank in ranks:
            source, pieces = _rank_pieces(path, layout, rank, prefix)
            if source is None:
                break
            for gi, piece in enumerate(pieces):
                lo, hi = layouts[gi].piece_range(rank)
                if not hasattr(piece, "numel") or piece.numel() != hi - lo:
                    raise CheckpointError(f"{path.name}/{prefix}optim_rank{rank}.pt: {source}[{gi}] has "
                                          f"{piece.numel() if hasattr(piece, 'numel') else type(piece).__name__} "
                                          f"elements, the layout says {hi - lo}; the checkpoint is corrupted")
                for span in layouts[gi].spans(rank):
                    self.parts.setdefault((gi, span.index), []).append((piece, span))
        if source is None:  # stages 0-2 in fp32: the module state holds the weights whole
            if layout["scheme"] == "chunked":
                raise CheckpointError(f"{path.name}: no parameter shards saved for stage 3; the checkpoint is incomplete")
            missing = [n for n in self.where if n not in self.module]
            if missing:
                raise CheckpointError(f"{path.name}/model_states.pt lacks parameters {missing[:3]}; "
                                      "the checkpoint is incomplete")
        self.from_pieces = source is not None
        self.alias_of = {a: n for n, names_ in _aliases(self.module, list(self.where), layout).items() for a in names_}

    def keys(self) -> list[str]:
        """Module order (buffers and frozen parameters as saved), then what only the pieces hold."""
        out = list(self.module)
        for n in self.where:
            out += [k for k in (n, *[a for a, m in self.alias_of.items() if m == n]) if k not in out]
        return out

    def param_of(self, key: str) -> str | None:
        name = self.alias_of.get(key, key)
        return name if name in self.where else None

    def spec(self, key: str) -> tuple[tuple, torch.dtype]:
        name = self.param_of(key)
        if name is not None:
            return self.shapes[name], torch.float32
        value = self.module[key]
        return tuple(value.shape), torch.float32 if value.is_floating_point() else value.dtype

    def tensor(self, key: str) -> torch.Tensor:
        name = self.param_of(key)
        if name is None:
            value = self.module[key]
            return value.float() if value.is_floating_point() else value
        if not self.from_pieces:
            return self.module[name].detach().reshape(self.shapes[name]).to(torch.float32, copy=True)
        out = torch.empty(self.numels[name], dtype=torch.float32)
        for piece, span in self.parts.get(self.where[name], []):
            out[span.param_lo : span.param_lo + span.numel] = piece[span.piece_lo : span.piece_lo + span.numel]
        return out.reshape(self.shapes[name])


class _TensorJoin:
    """One set of model files per tensor rank (a whole model, or one pipeline stage), read as
    one _Plan: each split tensor joined from the ranks' whole local pieces along its recorded
    dimension, one tensor at a time; the rest (held whole by every rank) taken from rank 0."""

    def __init__(self, path: Path, ranks: list[tuple[int | None, str]]):
        stage = ranks[0][1].partition("tp_")[0]
        self.plans = [_Plan(path, prefix) for _, prefix in ranks]
        first = self.plans[0]
        if not isinstance(first.split, dict) or not isinstance(first.split.get("split"), dict):
            raise CheckpointError(f"{path.name}/{first.prefix}model_states.pt does not record how its tensors are "
                                  "split over the tensor ranks (saved before zerotrain recorded it); load it into the "
                                  "same tensor-parallel job and save the whole model (engine.save_16bit_model)")
        self.size, self.split = first.split.get("size"), first.split["split"]
        if not isinstance(self.size, int) or not all(
                isinstance(r, dict) and isinstance(r.get("dim"), int) and isinstance(r.get("shape"), list)
                and isinstance(r.get("parts"), int) and r["parts"] >= 1 for r in self.split.values()):
            raise CheckpointError(f"{path.name}/{first.prefix}model_states.pt: the tensor_split record is malformed; "
                                  "the checkpoint is corrupted")
        found = [r for r, _ in ranks]
        if found != list(range(self.size)):
            missing = [r for r in range(self.size) if r not in found]
            raise CheckpointError(f"{path.name}: " + (
                f"{stage}tp_{missing[0]:02d}-model_states.pt is missing (tensor rank {missing[0]} of {self.size}); "
                "the checkpoint is incomplete" if missing else
                f"model files of tensor ranks {found}, but it records {self.size}; the checkpoint is corrupted"))
        for rank, plan in enumerate(self.plans):
            record = plan.split if isinstance(plan.split, dict) else {}
            if record.get("size") != self.size or record.get("rank") != rank or record.get("split") != self.split \
                    or plan.keys() != first.keys():
                raise CheckpointError(f"{path.name}/{plan.prefix}model_states.pt does not match tensor rank 0's "
                                      "(other tensors, splits or tensor size); the checkpoint is corrupted")
        self.frozen, self.all_frozen = first.frozen, first.all_frozen

    def keys(self) -> list[str]:
        return self.plans[0].keys()

    def param_of(self, key: str) -> str | None:
        return self.plans[0].param_of(key)

    def spec(self, key: str) -> tuple[tuple, torch.dtype]:
        shape, dtype = self.plans[0].spec(key)
        return (tuple(self.split[key]["shape"]) if key in self.split else shape), dtype

    def tensor(self, key: str) -> torch.Tensor:
        if key not in self.split:
            return self.plans[0].tensor(key)
        record = self.split[key]
        whole = torch.cat([plan.tensor(key) for plan in self.plans], dim=record["dim"])
        if list(whole.shape) != list(record["shape"]):
            raise CheckpointError(f"{key}: the tensor ranks' pieces join to shape {tuple(whole.shape)}, the checkpoint "
                                  f"records {tuple(record['shape'])}; the checkpoint is corrupted")
        return model_order(whole, self.size, record["parts"]) if record["parts"] > 1 else whole


def _plans(ckpt_dir, tag) -> tuple[Path, list[ModelFiles]]:
    """A _Plan (or _TensorJoin of one per tensor rank) per pipeline stage."""
    path = _folder(ckpt_dir, tag)
    verify_checkpoint(path)
    return path, [_Plan(path, ranks[0][1]) if ranks[0][0] is None else _TensorJoin(path, ranks)
                  for ranks in model_file_sets(path)]


def consolidated_entries(ckpt_dir, tag: str | None = None):
    """[(name, shape, dtype, fetch())] of the full fp32 state dict, in order, each tensor made
    only when fetched: what a streaming writer needs (a tied layer of several pipeline
    stages is taken from the first)."""
    _, plans = _plans(ckpt_dir, tag)
    entries, seen = [], set()
    for plan in plans:
        for key in plan.keys():
            if key not in seen:
                seen.add(key)
                shape, dtype = plan.spec(key)
                entries.append((key, shape, dtype, lambda plan=plan, key=key: plan.tensor(key)))
    return entries


def consolidate_checkpoint(ckpt_dir, tag: str | None = None) -> dict[str, torch.Tensor]:
    """Full fp32 state dict of the model in a checkpoint, in memory. Tied parameters appear
    under each of their names as one shared tensor (names the checkpoint does not record are
    absent). `zerotrain consolidate` streams instead (consolidated_entries)."""
    return _consolidated(*_plans(ckpt_dir, tag))


def _consolidated(path: Path, plans: list[ModelFiles]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for plan in plans:
        made: dict[str, torch.Tensor] = {}
        for key in plan.keys():
            name = plan.param_of(key)
            if key in out:
                continue
            if name is not None:
                if name not in made:
                    made[name] = plan.tensor(name)
                out[key] = made[name]
            else:
                out[key] = plan.tensor(key)
    return out


def load_state_dict_from_zero_checkpoint(model: torch.nn.Module, ckpt_dir, tag: str | None = None) -> torch.nn.Module:
    """DeepSpeed's zero_to_fp32 helper: put the checkpoint's fp32 weights into `model` (cast to
    its dtype; missing and unexpected keys are errors) and return it. For a model that is not
    (or no longer) sharded: at stage 3, gather its parameters first."""
    path, plans = _plans(ckpt_dir, tag)
    missing, unexpected = model.load_state_dict(_consolidated(path, plans), strict=False)
    excluded = set().union(*(plan.frozen for plan in plans))  # frozen weights left out on purpose keep the model's
    missing = [k for k in missing if k not in excluded]
    if missing or unexpected:
        raise CheckpointError(f"{path} does not match the model: missing keys {missing[:5]}, "
                              f"unexpected keys {unexpected[:5]}")
    return model


def convert_zero_checkpoint_to_fp32_state_dict(ckpt_dir, output_dir, tag: str | None = None,
                                               exclude_frozen_parameters: bool = False,
                                               safe_serialization: bool = False) -> Path:
    """DeepSpeed's zero_to_fp32 entry point: the full fp32 weights into OUTPUT_DIR as
    pytorch_model.bin (tied weights saved once) or, with safe_serialization, model.safetensors."""
    path, plans = _plans(ckpt_dir, tag)
    tensors = _consolidated(path, plans)
    if exclude_frozen_parameters:
        frozen = set().union(*(plan.all_frozen for plan in plans))  # every alias of each
        tensors = {k: v for k, v in tensors.items() if k not in frozen}
    out = Path(output_dir)
    if safe_serialization:
        return save_safetensors(tensors, out / "model.safetensors", overwrite=True)
    out.mkdir(parents=True, exist_ok=True)
    target, tmp = out / "pytorch_model.bin", out / f".pytorch_model.bin.{os.getpid()}.tmp"
    try:
        torch.save(tensors, tmp)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target
