"""Engine checkpoints: what each rank writes and reads, on top of checkpoint.store.

    <save_dir>/<tag>/model_states.pt   rank 0: module weights, counters, schedule, scaler,
                                        feature states, client_state
    <save_dir>/<tag>/optim_rank<r>.pt  the optimizer and strategy state of rank r (stage 0:
                                        rank 0 only, since every rank holds the same)
    <save_dir>/<tag>/rng_rank<r>.pt    python / numpy / torch RNG states of rank r
    <save_dir>/<tag>/manifest.json     sizes and checksums, verified on load
    <save_dir>/latest                   the newest complete tag

With checkpoint.use_node_local_storage each node's save_dir holds its own ranks' files, and
local rank 0 of every node writes model_states.pt (and stage 0's optimizer file), so each
node's folder loads alone. Loading checks that every rank found the same checkpoint.

Ranks that hold different parameters (pipeline stages, model-parallel slices) write one such
set each, named with the engine's `checkpoint_prefix` (`pipe_01-model_states.pt`, ...);
"rank" then means the rank in the data-parallel group of the strategy, and the RNG files keep
the global rank.

A checkpoint of another ZeRO stage or data-parallel size is cut again for this layout
(checkpoint/reshard.py), one of another tensor size or pipeline by parameter name
(checkpoint_split.py); another optimizer offload (NVMe, CPU, none) loads either way.

Everything is plain tensors and Python containers, so loading uses weights_only=True (a
tensor-parallel DTensor is saved as the piece its rank holds, and model_states.pt's
"tensor_split" says which dimension it is cut on: parallel/tensor/dtensor.py).
"""

from __future__ import annotations

import contextlib
import logging
import os

import torch

from ..parallel.tensor.dtensor import load_rank_state_dict, local, rank_state_dict, split_record
from ..errors import CheckpointError, ConfigError
from ..checkpoint.deepspeed import DeepSpeedState, deepspeed_folder
from ..checkpoint.raw_files import in_memory
from ..checkpoint.reshard import check_group_count, relayout, reshard_rank_state
from ..checkpoint.universal import UniversalState, universal_folder
from ..checkpoint.store import (CheckpointWriter, list_complete_tags, load_file, resolve_checkpoint, validate_tag,
                                verify_checkpoint)
from .export import check_save_dir, frozen_names
from .rng_state import rng_state, set_rng_state

log = logging.getLogger("zerotrain")


def _optim_file(rank: int, prefix: str = "") -> str:
    return f"{prefix}optim_rank{rank}.pt"


def _sharded_names(engine) -> set[str]:
    """State-dict keys of parameters that live only as per-rank shards (ZeRO-3); those are
    saved with the strategy state instead of the module state."""
    ids = engine.strategy.sharded_param_ids()
    return {name for name, p in engine.module.named_parameters(remove_duplicate=False) if id(p) in ids}


def _param_names(module) -> dict[int, str]:
    names = {}
    for name, p in module.named_parameters():
        names.setdefault(id(p), name)
    return names


def _aliases(module) -> dict[str, list[str]]:
    """First name of each tied parameter -> its other names (e.g. wte.weight -> lm_head.weight),
    so consolidation can write every name the module has."""
    first, aliases = {}, {}
    for name, p in module.named_parameters(remove_duplicate=False):
        if id(p) in first:
            aliases.setdefault(first[id(p)], []).append(name)
        else:
            first[id(p)] = name
    return aliases


def _load_module(engine, state: dict, strict: bool, excluded: set[str] = frozenset()) -> None:
    """`excluded`: frozen parameters the checkpoint left out on purpose; they keep their values."""
    sharded = _sharded_names(engine)
    missing, unexpected = load_rank_state_dict(engine.module, state)
    missing = [k for k in missing if k not in sharded and k not in excluded]
    if strict and (missing or unexpected):
        raise CheckpointError(f"checkpoint does not match the model: missing keys {missing[:5]}, "
                              f"unexpected keys {unexpected[:5]}; pass load_module_strict=False to ignore")


def writes_shared_files(engine) -> bool:
    """This rank writes a checkpoint's one-per-folder files (the manifest, `latest`): rank 0, or
    with node-local storage local rank 0 of each node (each node's folder then holds them)."""
    if engine.config.checkpoint.use_node_local_storage:
        return engine.comm.state.local_rank == 0
    return engine.comm.rank == 0


def _writes_model_states(engine) -> bool:
    """Data-parallel rank 0 of each set of parameters (a pipeline: of each stage)."""
    if engine.config.checkpoint.use_node_local_storage:
        if engine.checkpoint_prefix:
            raise CheckpointError("checkpoint.use_node_local_storage with pipeline or model parallelism is not "
                                  "built: give the nodes a shared output_dir, or drop use_node_local_storage")
        return engine.comm.state.local_rank == 0
    return engine.strategy.comm.rank == 0


def _same_tag(comm, tag, folder: str | None = None):
    """The tag and the folder every rank saves into. One checkpoint is one folder: ranks given
    different tags (a rank-dependent name) would each write part of one into a tag of its own
    and `latest` could point at one part only, so different tags are refused, compared before
    validating so that a tag bad on one rank only fails every rank together.

    `folder` (the save_dir, None when each node keeps its own) may differ: scripts that name
    the run folder from each rank's clock or a random id (DeepSpeedExamples' HelloDeepSpeed)
    give every rank its own. DeepSpeed then writes each rank's files into that rank's folder,
    a checkpoint no folder holds whole. Here every rank saves into rank 0's folder, the one
    such scripts create and load from, and each rank says so in one warning naming both."""
    if comm.world_size == 1:
        return tag, folder
    said = comm.all_gather_object((tag, folder))
    tags = [t for t, _ in said]
    odd = next((r for r, t in enumerate(tags) if t != tags[0]), None)
    if odd is not None:
        raise ConfigError(f"save_checkpoint: the ranks were given different tags (rank 0: {tags[0]!r}, rank "
                          f"{odd}: {tags[odd]!r}); pass the same tag on every rank")
    folders = [f for _, f in said]
    others = [r for r, f in enumerate(folders) if f != folders[0]]
    if others:
        who = comm.rank if comm.rank in others else others[0]
        log.warning("save_checkpoint: rank %d was given the folder %r, rank 0 the folder %r%s; every rank saves into "
                    "rank 0's, so the checkpoint is whole in one folder (pass the same save_dir on every rank to "
                    "silence this)", who, folders[who], folders[0],
                    f" ({len(others)} ranks differ from rank 0)" if len(others) > 1 else "")
    return tag, folders[0]


def save_checkpoint(engine, save_dir, tag, client_state: dict, save_latest: bool = True, extra_files=None,
                    exclude_frozen: bool = False) -> bool:
    check_save_dir(save_dir, "save_checkpoint")
    comm, shard, prefix = engine.comm, engine.strategy.comm, engine.checkpoint_prefix
    folder = None if engine.config.checkpoint.use_node_local_storage else os.path.abspath(save_dir)
    tag, folder = _same_tag(comm, tag if tag is not None else f"global_step{engine.global_steps}", folder)
    tag, save_dir = validate_tag(tag), folder or save_dir
    shards_optimizer = engine.strategy.shards_optimizer
    sharded = _sharded_names(engine)
    frozen = sorted(frozen_names(engine.module))
    excluded = set(frozen) if exclude_frozen else set()
    states = _writes_model_states(engine)
    with CheckpointWriter(save_dir, tag, is_main=writes_shared_files(engine), barrier=comm.barrier,
                          save_latest=save_latest) as writer:
        if states:
            writer.save(f"{prefix}model_states.pt", {
                "module": {k: v for k, v in rank_state_dict(engine.module).items()
                           if k not in sharded and k not in excluded},
                "tensor_split": split_record(engine.module),  # None, or how its DTensors' pieces join
                "frozen": frozen,  # names of the parameters that do not train
                "frozen_excluded": exclude_frozen,  # ... and left out of "module"
                "global_steps": engine.global_steps,
                "global_samples": engine.global_samples,
                "skipped_steps": engine.skipped_steps,
                "micro_steps": engine.micro_steps,
                "lr_scheduler": engine.lr_scheduler.state_dict() if engine.lr_scheduler is not None else None,
                "loss_scaler": engine.loss_scaler.state_dict() if engine.loss_scaler is not None else None,
                "features": {f.name: f.state_dict() for f in engine.features},
                "zero_stage": engine.strategy.stage,
                "layout": dict(engine.strategy.layout(_param_names(engine.module)), aliases=_aliases(engine.module)),
                "world_size": shard.world_size,
                "client_state": client_state,
                **engine.checkpoint_extras(),
            })
        if states or shards_optimizer:  # stage 0: every data-parallel rank holds rank 0's state
            writer.save(_optim_file(shard.rank if shards_optimizer else 0, prefix), {
                "optimizer": engine.optimizer.state_dict() if engine.optimizer is not None else None,
                "strategy": engine.strategy.state_dict(),
            })
        writer.save(f"rng_rank{comm.rank}.pt", rng_state())
        if extra_files is not None:  # e.g. the trainer's model folder files: inside the manifest
            extra_files(writer.staging)
    return True


def _verified(load_dir, tag, fallback: bool):
    """The folder to load, checked against its manifest. With `fallback` (and no explicit
    tag), a damaged, missing or unreadable newest checkpoint gives way to the newest one that
    verifies (say, a save killed after its folder appeared but before `latest` moved)."""
    fallback = fallback and tag is None
    try:
        path = resolve_checkpoint(load_dir, tag, missing_ok=tag is None)
        if path is not None:
            verify_checkpoint(path)
        elif fallback and list_complete_tags(load_dir):
            raise CheckpointError(f"{load_dir}: no 'latest' file")
        return path
    except CheckpointError as damaged:
        complete = list_complete_tags(load_dir) if fallback else []
        if not complete:
            raise
        log.warning("%s; falling back to %s, the newest complete checkpoint", damaged, complete[0])
        return resolve_checkpoint(load_dir, complete[0])


def _agreed(engine, load_dir, tag, fallback: bool):
    """_verified on every rank, and the same answer everywhere: a node whose save_dir lacks the
    checkpoint the others load (node-local storage) stops the job with one line naming it."""
    comm = engine.comm
    try:
        path, problem = _verified(load_dir, tag, fallback), None
    except CheckpointError as err:
        path, problem = None, str(err)
    found = comm.all_gather_object((path.name if path is not None else None, problem, comm.state.node))
    if len({(name, bool(text)) for name, text, _ in found}) == 1:
        if problem:
            raise CheckpointError(problem)
        return path
    first = found[0]
    rank, (name, text, node) = next((r, f) for r, f in enumerate(found)
                                    if (f[0], bool(f[1])) != (first[0], bool(first[1])))

    def seen(name, text):
        return f"finds {name}" if name else f"finds none ({text})" if text else "finds none"

    raise CheckpointError(f"the nodes disagree about the checkpoint to resume: node {node} (rank {rank}) "
                          f"{seen(name, text)} in its save_dir, node {first[2]} (rank 0) {seen(first[0], first[1])}; "
                          "give every node the same checkpoint (with node-local storage: its folder and latest), "
                          "or resume from a tag every node has")


def load_checkpoint(engine, load_dir, tag, strict: bool, load_optimizer_states: bool,
                    load_lr_scheduler_states: bool, load_module_only: bool, fallback: bool = False):
    universal = universal_folder(load_dir, tag, engine.config.checkpoint.load_universal)
    ds_folder = universal or deepspeed_folder(load_dir, tag)
    if ds_folder is not None:  # a folder DeepSpeed wrote (or its universal format): read as it is
        from .deepspeed_folders import load_deepspeed  # it uses this module's helpers

        return load_deepspeed(engine, ds_folder, strict, load_optimizer_states, load_lr_scheduler_states,
                              load_module_only, UniversalState if universal is not None else DeepSpeedState)
    path = _agreed(engine, load_dir, tag, fallback)
    if path is None:
        log.warning("no checkpoint to load in %s (no 'latest' file); starting from scratch", load_dir)
        return None, None
    from .checkpoint_split import load_resplit, split_changed  # it builds on this module's helpers

    if split_changed(engine, path):  # another tensor size or pipeline: read by parameter name
        return load_resplit(engine, path, strict, load_optimizer_states, load_lr_scheduler_states, load_module_only)
    comm, shard, prefix = engine.comm, engine.strategy.comm, engine.checkpoint_prefix
    stage = engine.strategy.stage
    states_file = f"{prefix}model_states.pt"
    model_states = load_file(path, states_file)
    layout = engine.strategy.layout(_param_names(engine.module))
    with _applying(path, states_file):
        saved_stage, saved_world = model_states["zero_stage"], model_states["world_size"]
        changed = saved_stage != stage or saved_world != shard.world_size
        excluded = set(model_states.get("frozen", ())) if model_states.get("frozen_excluded") else set()
        module_state = model_states["module"]
        if changed:  # what either layout shards comes from the rank files (reshard.py)
            excluded |= _layout_names(engine, model_states["layout"]) | _layout_names(engine, layout)
            sharded = _sharded_names(engine)
            module_state = {k: v for k, v in module_state.items() if k not in sharded}
        _load_module(engine, module_state, strict, excluded)
    name = _optim_file(shard.rank if engine.strategy.shards_optimizer else 0, prefix)
    if changed:  # every old rank's file, cut again for this layout
        with _applying(path, states_file):
            if engine.config.checkpoint.use_node_local_storage:
                raise CheckpointError(f"{path} was written by {saved_world} ranks with node-local storage (each "
                                      f"node holds its own ranks' files); it loads only into {saved_world} ranks")
            rank_state = reshard_rank_state(path, model_states, layout, shard.rank, prefix, _groups(engine),
                                            masters=engine.strategy.stepper is not None)
            _write_whole_weights(engine, rank_state.pop("whole"))
        name = f"{prefix}optim_rank*.pt"
        if comm.rank == 0:
            log.warning("%s", _relayout_notice(path, saved_stage, saved_world, stage, shard.world_size))
    else:
        rank_state = load_file(path, name)
        if engine.strategy.stepper is None:  # torch's optimizer: an NVMe run's swap-file copies read into memory
            rank_state = in_memory(rank_state)
        if rank_state.get("optimizer") is not None and engine.optimizer is not None:  # offload may differ
            rank_state["optimizer"] = _own_groups(engine, rank_state["optimizer"], path / name)
    with _applying(path, name):
        if not load_module_only and load_optimizer_states and engine.optimizer is not None \
                and rank_state["optimizer"] is not None:
            engine.optimizer.load_state_dict(rank_state["optimizer"])
        # stage 3 keeps its weights here, so this is loaded even for load_module_only
        engine.strategy.load_state_dict(rank_state.get("strategy", {}))
    with _applying(path, states_file):
        if load_module_only:
            return str(path), model_states["client_state"]
        client_state = _restore_run_state(engine, model_states, changed, load_optimizer_states,
                                          load_lr_scheduler_states)
    rng_file = path / f"rng_rank{comm.rank}.pt"
    if rng_file.exists():
        rng = load_file(path, rng_file.name)
        with _applying(path, rng_file.name):
            set_rng_state(rng)
    return str(path), client_state


def _load_relayout(engine, saved, layout: dict, load_optimizer_states: bool, load_module_only: bool) -> None:
    """This rank's piece of a checkpoint written on another layout (`saved`: any reader that
    `relayout` takes), cut for this one: whole weights written, then the optimizer state and the
    strategy's (stage-3 shards, fp32 masters)."""
    rank_state = relayout(saved, layout, engine.strategy.comm.rank, _groups(engine),
                          masters=engine.strategy.stepper is not None)
    _write_whole_weights(engine, rank_state.pop("whole"))
    if not load_module_only and load_optimizer_states and engine.optimizer is not None \
            and rank_state["optimizer"] is not None:
        engine.optimizer.load_state_dict(rank_state["optimizer"])
    engine.strategy.load_state_dict(rank_state["strategy"])


def _restore_run_state(engine, model_states: dict, changed: bool, load_optimizer_states: bool,
                       load_lr_scheduler_states: bool):
    """Counters, LR schedule, loss scaler and feature states from model_states; the client state."""
    for name in ("global_steps", "global_samples", "skipped_steps", "micro_steps"):
        setattr(engine, name, int(model_states[name]))
    if changed:  # the same global batch, accumulated differently
        engine.micro_steps = engine.global_steps * engine.gradient_accumulation_steps()
    if load_lr_scheduler_states and engine.lr_scheduler is not None and model_states["lr_scheduler"] is not None:
        engine.lr_scheduler.load_state_dict(model_states["lr_scheduler"])
    if load_optimizer_states and engine.loss_scaler is not None and model_states["loss_scaler"] is not None:
        engine.loss_scaler.load_state_dict(model_states["loss_scaler"])
    for feature in engine.features:
        state = model_states["features"].get(feature.name)
        if state is not None:
            feature.load_state_dict(state)
    return model_states["client_state"]


def _groups(engine) -> list[dict] | None:
    """The optimizer's param groups as its state dict names them, without copying its state as
    state_dict() would: torch's name parameters by index, the blockwise stepper's none."""
    if engine.optimizer is None:
        return None
    out, index = [], 0
    for group in engine.optimizer.param_groups:
        entry = {k: v for k, v in group.items() if k != "params"}
        if engine.strategy.stepper is None:
            entry["params"] = list(range(index, index + len(group["params"])))
            index += len(group["params"])
        out.append(entry)
    return out


def _own_groups(engine, saved: dict, path) -> dict:
    """The saved optimizer state with this optimizer's own "params" entries (torch's name their
    parameters by index, the blockwise stepper of separate masters none), so that a run with
    another optimizer offload resumes it: the hyperparameters are the checkpoint's."""
    current = _groups(engine)
    check_group_count(path, len(saved["param_groups"]), len(current))
    groups = [dict(cur, **{k: v for k, v in was.items() if k != "params"})
              for cur, was in zip(current, saved["param_groups"])]
    return dict(saved, param_groups=groups)


def _layout_names(engine, layout: dict) -> set[str]:
    """Every state-dict name (tied aliases too) of the parameters a layout holds."""
    names = {n for g in layout["groups"] for n in g["names"]}
    names |= {a for n, al in (layout.get("aliases") or {}).items() if n in names for a in al}
    ids = {id(p) for n, p in engine.module.named_parameters(remove_duplicate=False) if n in names}
    return {n for n, p in engine.module.named_parameters(remove_duplicate=False) if id(p) in ids}


@torch.no_grad()
def _write_whole_weights(engine, whole) -> None:
    """Stages 0-2 hold every weight whole: each is written from the checkpoint's best source
    (fp32 masters, else shards, else module weights), one parameter at a time."""
    if engine.strategy.sharded_param_ids():
        return
    for name, p in engine.module.named_parameters():
        mine = local(p)  # a tensor-parallel weight: this rank's piece
        values = whole(name, mine.numel())
        if values is not None:  # None: a frozen weight the checkpoint left out keeps its own
            mine.copy_(values.view(mine.shape))


def _relayout_notice(path, saved_stage, saved_world, stage, world) -> str:
    """What a resume on another layout carries over, and what it cannot."""
    text = (f"{path}: written at ZeRO stage {saved_stage} by {saved_world} data-parallel rank(s), loaded at stage "
            f"{stage} by {world}: weights, fp32 masters, optimizer state, step counters, LR schedule, loss scale "
            "and feature counters carried over")
    if saved_world != world:
        text += (f"; not carried over: the RNG states of ranks {saved_world}-{world - 1} (fresh)" if world > saved_world
                 else "; not carried over: the RNG states of the ranks beyond the new world size")
        text += (" and the data position within the epoch (the order of samples is planned per data-parallel "
                 "size; the step and sample counts are kept)")
    return text


@contextlib.contextmanager
def _applying(path, name: str):
    """A file that passed its checksum (or whose manifest was rewritten to match) but does not
    hold what we wrote: one CheckpointError naming it, not a KeyError from deep inside."""
    try:
        yield
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError, OverflowError, RuntimeError, AttributeError, IndexError) as e:
        detail = " ".join(str(e).split())[:120]
        raise CheckpointError(f"{path / name}: not the content zerotrain wrote there ({type(e).__name__}: {detail}); "
                              "the file was damaged or replaced: load another checkpoint") from None
