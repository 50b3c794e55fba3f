"""Resuming a checkpoint on another model split: another tensor-parallel size, another
pipeline, or a split model resumed whole (checkpoint/resplit.py reads the old files).

Every rank finds the old split's files by name (`pipe_01-tp_00-...`); when the files of this
rank's own prefix are absent, or were written with another tensor size or pipeline
partition, this path loads instead of the same-split one in checkpointing.py. The ZeRO stage,
data-parallel size and optimizer offload may change at the same time (reshard.relayout).
"""

from __future__ import annotations

import logging
from pathlib import Path

from ..checkpoint.consolidate import model_file_sets
from ..checkpoint.pipe_names import Renamed, plain_names
from ..checkpoint.resplit import SavedSplit
from ..checkpoint.store import load_file
from ..errors import CheckpointError
from ..parallel.tensor.dtensor import local, rank_state_dict, split_record
from .checkpointing import (_applying, _layout_names, _load_module, _load_relayout, _param_names,
                            _restore_run_state)

log = logging.getLogger("zerotrain")


def _pipeline(states: dict) -> dict | None:
    record = states.get("pipeline")
    return None if record is None else {k: v for k, v in record.items() if k not in ("stage_ids", "tied_layers")}


def split_changed(engine, path: Path) -> bool:
    """Whether the checkpoint at `path` was written with another model split than this run's
    (the answer is the same on every rank: it depends on the folder and the job's shape)."""
    prefixes = [prefix for ranks in model_file_sets(path) for _, prefix in ranks]
    prefix = engine.checkpoint_prefix
    if prefix not in prefixes:
        return True
    if prefix == "":
        return False
    states = load_file(path, f"{prefix}model_states.pt", mmap=True)
    size = (split_record(engine.module) or {}).get("size", 1)
    return (states.get("tensor_split") or {}).get("size", 1) != size or \
        _pipeline(states) != _pipeline(engine.checkpoint_extras())


def _whole_shapes(engine, layout: dict) -> dict[str, tuple]:
    record = (split_record(engine.module) or {}).get("split") or {}
    return {n: tuple(record[n]["shape"]) if n in record else tuple(s)
            for g in layout["groups"] for n, s in zip(g["names"], g["shapes"])}


def plain_shapes(engine, layout: dict) -> list[tuple[str, tuple]]:
    """This model's trained parameters (whole shapes) in named_parameters order."""
    whole = _whole_shapes(engine, layout)
    return [(n, whole[n]) for n, _ in engine.module.named_parameters() if n in whole]


def check_gathered_model(engine, path: Path, saved: SavedSplit, layout: dict) -> None:
    """Every rank's parameters, gathered, against the old split's: one line naming what differs."""
    now: dict[str, tuple] = {}
    for part in engine.comm.all_gather_object(_whole_shapes(engine, layout)):
        now.update(part)
    was, frozen = saved.shapes(), saved.frozen()
    differ = [f"{n} {list(was[n])} there, {list(now[n])} here" for n in sorted(set(was) & set(now)) if was[n] != now[n]]
    differ += [f"{n} only in the checkpoint" for n in sorted(set(was) - set(now) - frozen)]
    differ += [f"{n} only in this model" for n in sorted(set(now) - set(was) - frozen)]
    if differ:
        raise CheckpointError(f"{path} is a checkpoint of another model: {'; '.join(differ[:6])}; load it into the "
                              "model that wrote it")


def load_resplit(engine, path: Path, strict: bool, load_optimizer_states: bool, load_lr_scheduler_states: bool,
                 load_module_only: bool):
    if engine.config.checkpoint.use_node_local_storage:
        raise CheckpointError(f"{path} was written with another pipeline or tensor split; with node-local storage "
                              "each node holds only its own ranks' files: copy them to shared storage to resume")
    saved = SavedSplit(path, split_record(engine.module))
    model_states = saved.states
    layout = engine.strategy.layout(_param_names(engine.module))
    if "pipeline" in model_states and "pipeline" not in engine.checkpoint_extras():  # a plain model: by layer order
        saved = Renamed(saved, plain_names(path, saved.layers(), saved.shapes(), plain_shapes(engine, layout)))
    with _applying(path, "*model_states.pt"):
        check_gathered_model(engine, path, saved, layout)
        held = _layout_names(engine, layout)
        excluded = set(model_states.get("frozen", ())) if model_states.get("frozen_excluded") else set()
        mine = {k: v for k, v in rank_state_dict(engine.module).items() if k not in held and saved.knows(k)}
        _load_module(engine, {k: saved.module_value(k, local(v)) for k, v in mine.items()}, strict, held | excluded)
    with _applying(path, "*optim_rank*.pt"):
        _load_relayout(engine, saved, layout, load_optimizer_states, load_module_only)
    if load_module_only:
        return str(path), model_states["client_state"]
    with _applying(path, "*model_states.pt"):
        client_state = _restore_run_state(engine, model_states, True, load_optimizer_states, load_lr_scheduler_states)
    if engine.comm.rank == 0:
        log.warning("%s", _notice(path, saved, engine))
    return str(path), client_state


def _notice(path: Path, saved: SavedSplit, engine) -> str:
    old_stages, old_tensor = len(saved.stages), len(saved.stages[0])
    new = engine.checkpoint_extras().get("pipeline") or {}
    new_tensor = (split_record(engine.module) or {}).get("size", 1)
    old_world = saved.stages[0][0].layout["world_size"]
    return (f"{path}: written by {old_stages} pipeline stage(s) x {old_tensor} tensor rank(s) x {old_world} "
            f"data-parallel rank(s) at ZeRO stage {saved.stages[0][0].layout['stage']}, loaded by "
            f"{new.get('num_stages', 1)} x {new_tensor} x {engine.strategy.comm.world_size} at stage "
            f"{engine.strategy.stage}: weights, fp32 masters, optimizer state, step counters, LR schedule, loss scale "
            "and feature counters carried over; not carried over: the RNG states (the ranks hold other parts of "
            "the model: each keeps its seeded state) and, when the data-parallel size changes, the data position "
            "within the epoch (the step and sample counts are kept)")
