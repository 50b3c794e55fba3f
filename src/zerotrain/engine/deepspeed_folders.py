"""Folders DeepSpeed wrote, loaded into this engine: its `global_stepN/` checkpoints
(checkpoint/deepspeed.py; its pipeline engine's, checkpoint/deepspeed_pipe.py; its AutoTP
engine's, checkpoint/deepspeed_autotp.py) and its universal
checkpoints (checkpoint/universal.py), on this run's own ZeRO stage, data-parallel size and
pipeline (or none), through the same relayout as zerotrain's own checkpoints
(checkpoint/reshard.py). checkpointing.load_checkpoint decides which kind a folder is."""

from __future__ import annotations

import logging
import warnings

from ..checkpoint.deepspeed import DeepSpeedState
from ..checkpoint.deepspeed_autotp import DeepSpeedAutoTP, is_autotp_folder
from ..checkpoint.deepspeed_pipe import DeepSpeedPipeline, is_pipeline_folder
from ..checkpoint.pipe_names import Renamed, plain_names
from ..errors import CheckpointError
from ..parallel.tensor.dtensor import split_record
from .checkpoint_split import check_gathered_model, plain_shapes
from .checkpointing import (_applying, _layout_names, _load_module, _load_relayout, _param_names,
                            _sharded_names)

log = logging.getLogger("zerotrain")


def load_deepspeed(engine, path, strict: bool, load_optimizer_states: bool, load_lr_scheduler_states: bool,
                   load_module_only: bool, reader=DeepSpeedState):
    """A DeepSpeed tag folder (checkpoint/deepspeed.py; a pipeline one: _pipeline_folder) or
    universal folder (checkpoint/universal.py, `reader` UniversalState) into this engine, on its
    own stage and data-parallel size: weights, fp32 masters, optimizer state, counters, LR
    schedule, loss scale."""
    shard = engine.strategy.comm
    layout = engine.strategy.layout(_param_names(engine.module))
    states_file = next(iter(sorted(p.name for p in path.iterdir() if p.name.endswith("model_states.pt"))))
    if reader is DeepSpeedState and is_pipeline_folder(path):
        saved = _pipeline_folder(engine, path, layout, strict)
    elif reader is DeepSpeedState and is_autotp_folder(path):
        saved = _autotp_folder(engine, path, layout, strict)
    elif engine.checkpoint_prefix:
        raise CheckpointError(f"{path}: a DeepSpeed checkpoint of a data-parallel run loads into data-parallel runs; "
                              "this run has pipeline or tensor parallelism")
    else:
        saved = reader(path, [n for n, p in engine.module.named_parameters() if p.requires_grad])
        with _applying(path, states_file):
            saved.check_model(layout)
            sharded = _sharded_names(engine)
            _load_module(engine, {k: v for k, v in saved.module.items() if k not in sharded}, strict,
                         _layout_names(engine, layout))
    with _applying(path, "*optim_states.pt"):
        _load_relayout(engine, saved, layout, load_optimizer_states, load_module_only)
    client_state = saved.client_state()
    if load_module_only:
        return str(path), client_state
    with _applying(path, states_file):
        for name, value in saved.counters().items():
            setattr(engine, name, value)
        engine.micro_steps = engine.global_steps * engine.gradient_accumulation_steps()
        if load_lr_scheduler_states and engine.lr_scheduler is not None and saved.lr_scheduler() is not None:
            _load_schedule(engine, saved.lr_scheduler(), path)
        scaler = saved.loss_scaler()
        if load_optimizer_states and engine.loss_scaler is not None and scaler is not None:
            engine.loss_scaler.load_state_dict(scaler)
        for feature in engine.features:  # zerotrain's own, kept in its universal conversions
            state = saved.feature_states().get(feature.name)
            if state is not None:
                feature.load_state_dict(state)
    if engine.comm.rank == 0:
        log.warning("%s: %s loaded at stage %d by %d rank(s): weights, fp32 masters, optimizer state, step counters, "
                    "LR schedule and loss scale carried over; not carried over: the RNG states and the data position "
                    "(DeepSpeed saves neither per rank)", path, saved.describe(), engine.strategy.stage,
                    shard.world_size)
    return str(path), client_state


def _pipeline_folder(engine, path, layout: dict, strict: bool):
    """A DeepSpeed pipeline folder (checkpoint/deepspeed_pipe.py) read for this run: a pipeline
    of the same layers with any stage count finds its parameters by name, a plain model by
    layer order (checkpoint/pipe_names.py); the weights it holds outside the optimizer (buffers)
    from the layer files."""
    if split_record(engine.module):
        raise CheckpointError(f"{path}: DeepSpeed pipeline checkpoints load into runs without tensor parallelism; "
                              "resume with tensor_parallel.autotp_size 1")
    pipeline = engine.checkpoint_extras().get("pipeline")
    with _applying(path, "layer_*-model_states.pt"):
        saved = DeepSpeedPipeline(path, tied={idx: key for key, idx in (pipeline or {}).get("tied_layers", {}).items()})
        if pipeline is None:
            saved = Renamed(saved, plain_names(path, saved.layers(), saved.shapes(), plain_shapes(engine, layout)))
        check_gathered_model(engine, path, saved, layout)
        _load_split_module(engine, saved, layout, strict)
    return saved


def _autotp_folder(engine, path, layout: dict, strict: bool):
    """A DeepSpeed AutoTP folder (checkpoint/deepspeed_autotp.py) into a plain model or a
    tensor-parallel one of any size, each parameter's pieces cut for this rank."""
    if "pipeline" in engine.checkpoint_extras():
        raise CheckpointError(f"{path}: a DeepSpeed AutoTP checkpoint loads into runs without a pipeline; resume it "
                              "with a plain model (tensor_parallel.autotp_size any)")
    with _applying(path, "mp_rank_*_model_states.pt"):
        saved = DeepSpeedAutoTP(path, split_record(engine.module))
        check_gathered_model(engine, path, saved, layout)
        _load_split_module(engine, saved, layout, strict)
    return saved


def _load_split_module(engine, saved, layout: dict, strict: bool) -> None:
    """The module entries outside the optimizer's layout (buffers) from a split folder."""
    held = _layout_names(engine, layout)
    mine = {k: v for k, v in engine.module.state_dict().items() if k not in held and saved.knows(k)}
    _load_module(engine, {k: saved.module_value(k, v) for k, v in mine.items()}, strict, held)


def _load_schedule(engine, state: dict, path) -> None:
    """DeepSpeed's schedules keep one counter, last_batch_iteration (-1 before the first step);
    a torch scheduler (the trainer's HF schedules) keeps last_epoch (0 before it): the same
    position under another name, so this run's own schedule continues where DeepSpeed's was."""
    scheduler = engine.lr_scheduler
    own = scheduler.state_dict()
    if set(state) <= set(own):
        scheduler.load_state_dict(state)
        return
    if "last_batch_iteration" not in state or "last_epoch" not in own:
        raise CheckpointError(f"{path}: its LR schedule's state ({', '.join(sorted(state))}) does not fit this run's "
                              f"{type(scheduler).__name__}; pass load_lr_scheduler_states=False to start it afresh")
    scheduler.last_epoch = int(state["last_batch_iteration"])
    with warnings.catch_warnings():  # torch's "step() before optimizer.step()": here no step is skipped
        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step", category=UserWarning)
        scheduler.step()  # last_epoch + 1 steps taken, and the groups' lr set from this run's curve
    if engine.comm.rank == 0:
        log.warning("%s: its LR schedule is DeepSpeed's, this run's is %s: the latter continues at step %d",
                    path, type(scheduler).__name__, scheduler.last_epoch)
