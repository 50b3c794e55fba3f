"""A zerotrain checkpoint written as a DeepSpeed universal checkpoint folder (universal.py has
the layout), so DeepSpeed resumes it with `"checkpoint": {"load_universal": true}` on any ZeRO
stage and data-parallel size, with the optimizer state and the step.

    zerotrain checkpoint                         universal folder DST
    model_states.pt  (counters, schedule,  --->  mp_rank_00_model_states.pt and
                      client_state)              zero_pp_rank_0_mp_rank_00_model_states.pt
    optim_rank*.pt   (each rank's piece of  -->  zero/<name>/fp32.pt, exp_avg.pt, exp_avg_sq.pt,
                      masters and Adam state)    step.pt, one folder per parameter, whole
                                                 zero/optimizer_state.pt (hyperparameters)
                                                 DST/../latest_universal -> DST's name

Each parameter is put together from the rank files' ranges (reshard.SavedState, memory-mapped),
written and dropped before the next, so a model far larger than memory converts. The folder
is written beside DST under a hidden name and renamed into place when complete.

DeepSpeed has no place for the RNG states, the trainer's data position or zerotrain's feature
counters; the last (and the loss scaler's state, which DeepSpeed would read as its own object)
go under a "zerotrain" key that DeepSpeed keeps as client state and zerotrain reads back.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from ..errors import CheckpointError
from .consolidate import _folder, _model_states, model_file_sets
from .deepspeed import MODEL_FILE
from .reshard import SavedState
from .store import verify_checkpoint
from .universal import LATEST_UNIVERSAL, MASTERS, OPTIMIZER_FILE, OURS, STEP, ZERO3_MODEL_FILE, ZERO_DIR

WRITE_VERSION = "0.19.8"  # the DeepSpeed whose format this is (its loaders check the version it names)
_DEEPSPEED_KEYS = {"module", "buffer_names", "param_shapes", "frozen_param_shapes", "shared_params", "lr_scheduler",
                   "global_steps", "global_samples", "skipped_steps", "dp_world_size", "mp_world_size", "ds_version",
                   "ds_config", "universal_checkpoint_info", "optimizer", "data_sampler", "random_ltd",
                   "sparse_tensor_module_names", OURS}


def _save(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(obj, path)


def _check_names(names: list[str], path: Path) -> None:
    for name in names:
        if not name or name.startswith(".") or "/" in name or "\\" in name or name in (".", ".."):
            raise CheckpointError(f"{path}: parameter name {name!r} cannot be a folder name of a universal checkpoint")


@torch.no_grad()  # the rank files hold parameters: their ranges must not come out as autograd results
def write_universal(src, dst, tag: str | None = None, overwrite: bool = False) -> dict:
    """Write the universal folder `dst` (and `latest_universal` beside it) from the zerotrain
    checkpoint `src` (a save_dir, with `latest` or `tag`, or one tag folder). Returns a summary
    {"folder", "parameters", "values", "states", "not_carried"}."""
    path = _folder(src, tag)
    verify_checkpoint(path)
    if model_file_sets(path) != [[(None, "")]]:
        raise CheckpointError(f"{path}: a checkpoint with tensor or pipeline parallelism; converting to a universal "
                              "checkpoint reads data-parallel (ZeRO 0-3) ones: resume it on one tensor and pipeline "
                              "rank (engine.load_checkpoint changes those sizes) and save again")
    states, layout = _model_states(path)
    saved = SavedState(path, states)
    dst = Path(dst)
    if dst.exists() and not overwrite:
        raise CheckpointError(f"{dst} exists; pass --overwrite to replace it")
    frozen = set(states.get("frozen") or ())
    groups = saved.optimizer_groups()
    staging = dst.parent / f".{dst.name}.staging"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    shapes, keys, values, step = [], set(), 0, None
    try:
        for gi, group in enumerate(layout["groups"]):
            names = [n for n in group["names"] if n not in frozen]
            if not names:
                continue
            _check_names(names, path)
            entry = saved.optimizer_entry(gi, group["names"]) if groups is not None else None
            element = {k for k, v in (entry or {}).items() if saved.per_element(gi, k, v)}
            shapes.append({})
            for name, shape in zip(group["names"], group["shapes"]):
                if name in frozen:
                    continue
                shape = torch.Size(shape)
                shapes[-1][name] = shape
                folder = staging / ZERO_DIR / name
                _save(folder / f"{MASTERS}.pt", {"param": saved.model_values(name, 0, shape.numel(),
                                                                            torch.float32).view(shape), "cat_dim": 0})
                for key in sorted(element):
                    _save(folder / f"{key}.pt", {"param": saved.optimizer_values(key, name, 0, shape.numel())
                                                 .view(shape), "cat_dim": 0})
                if entry is not None and STEP in entry:
                    _save(folder / f"{STEP}.pt", entry[STEP])
                    step = entry[STEP]
                values += shape.numel()
            keys |= element
        hyper = [{k: v for k, v in g.items() if k != "params"} for g in groups or []]
        _save(staging / ZERO_DIR / OPTIMIZER_FILE, {
            "param_groups": hyper, "zero_stage": int(layout["stage"]), "partition_count": int(layout["world_size"]),
            "ds_version": WRITE_VERSION,
            # DeepSpeed at ZeRO 3 reads the step and hyperparameters from here
            "optimizer_state_dict": {"state": {0: {STEP: step}} if step is not None else {}, "param_groups": hyper}})
        model = _model_file(saved, states, layout, shapes, frozen, path)
        for name in (MODEL_FILE, ZERO3_MODEL_FILE):
            _save(staging / name, model)
        if dst.exists():
            shutil.rmtree(dst)
        os.rename(staging, dst)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    (dst.parent / LATEST_UNIVERSAL).write_text(dst.name)
    not_carried = ["the RNG states", "the data position"]
    if not keys:
        not_carried.append("optimizer state (the checkpoint holds none)")
    if (states.get("loss_scaler") or {}).get("kind") == "dynamic":
        not_carried.append("the fp16 loss scale for DeepSpeed (it starts from its config's; zerotrain reads it back)")
    return {"folder": dst, "parameters": sum(len(s) for s in shapes), "values": values, "states": sorted(keys),
            "not_carried": not_carried}


def _model_file(saved: SavedState, states: dict, layout: dict, shapes: list[dict], frozen: set[str],
                path: Path) -> dict:
    """DeepSpeed's model states: counters, the LR schedule, client state at the top level,
    buffers and frozen weights in "module" (the trained ones are in zero/; stage 3's frozen
    ones come from their shards)."""
    trained = {n for group in shapes for n in group}
    aliases = layout.get("aliases") or {}
    alias_of = {a: first for first, names in aliases.items() for a in names}
    module = {k: v for k, v in states["module"].items()
              if torch.is_tensor(v) and k not in trained and alias_of.get(k) not in trained}
    for group in layout["groups"]:
        for name, shape in zip(group["names"], group["shapes"]):
            if name in frozen and name not in module:
                module[name] = saved.model_values(name, 0, torch.Size(shape).numel(), torch.float32).view(shape)
    client = states.get("client_state") or {}
    clash = sorted(k for k in client if k in _DEEPSPEED_KEYS)
    if clash:
        raise CheckpointError(f"{path}: its client_state has key {clash[0]!r}, which DeepSpeed keeps for itself "
                              "in the same file; rename it in the run's client_state and save again")
    return {
        **client,
        "module": module,
        "buffer_names": [k for k in module if k not in frozen],
        "param_shapes": shapes,
        "frozen_param_shapes": {n: tuple(states["module"][n].shape) for n in sorted(frozen) if n in states["module"]},
        "shared_params": alias_of,
        "lr_scheduler": states.get("lr_scheduler"),
        "global_steps": int(states["global_steps"]), "global_samples": int(states["global_samples"]),
        "skipped_steps": int(states["skipped_steps"]),
        "dp_world_size": int(layout["world_size"]), "mp_world_size": 1, "ds_version": WRITE_VERSION,
        "universal_checkpoint_info": {"universal_checkpoint_version": 0.4},
        OURS: {"features": states.get("features") or {}, "loss_scaler": states.get("loss_scaler")},
    }
