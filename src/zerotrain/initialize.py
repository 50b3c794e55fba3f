"""`zerotrain.initialize`: DeepSpeed's entry point, same arguments, same four results."""

from __future__ import annotations

import hashlib
import json
import logging
import sys

import torch

from .config import load_config, tensor_parallel_size
from .config.report import notice as config_notice
from .data import build_dataloader
from .data.curriculum_loader import build_curriculum_loader, curriculum_sampling_on
from .data_efficiency.variable_batch_size_and_lr import (build_variable_batch_training,
                                                          dynamic_batching_notice, dynamic_batching_on)
from .engine import summary
from .helpers import activation_checkpointing
from .comm import Comm, init_parallel
from .errors import ConfigError
from .features import build_features
from .optim import adapt_client_optimizer, build_optimizer
from .parallel.split import ModelSplit, plain_split
from .parallel.mpu import mpu_split
from .parallel.sequence.setup import sequence_parallel_size
from .precision import build_loss_scaler, expose_loss_scale
from .schedules import build_scheduler
from .zero import build_strategy, is_partitioned
from .zero.strategy import detach_previous_owners

log = logging.getLogger("zerotrain")

_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def _setup_logging(rank: int) -> None:
    if not log.handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("[zerotrain] %(message)s"))
        log.addHandler(handler)
        log.propagate = False
    log.setLevel(logging.INFO if rank == 0 else logging.WARNING)


def _config_from_args(args, config):
    """DeepSpeed scripts pass the config path in `args.deepspeed_config` (argparse's
    --deepspeed_config), or in the deprecated `args.deepscale_config`."""
    if args is None:
        return config
    given = getattr(args, "deepspeed_config", None)
    old = getattr(args, "deepscale_config", None)
    if old is not None:
        if given is not None:
            raise ConfigError("args has both deepscale_config and deepspeed_config; keep deepspeed_config "
                              "(deepscale_config is its deprecated name)")
        log.warning("args.deepscale_config is deprecated; name it args.deepspeed_config (--deepspeed_config)")
        given = old
    given = given if given is not None else getattr(args, "zerotrain_config", None)
    if given is not None and config is not None:
        raise ConfigError("initialize was given a config twice, in args.deepspeed_config and in config=; "
                          "pass only one")
    return config if given is None else given


def _client_groups(client: torch.optim.Optimizer, model_parameters) -> list[dict]:
    """A client optimizer is used with its own param groups, whatever model_parameters says
    (as in DeepSpeed). Groups with no trainable parameter are dropped, from the client too, so
    its groups and the engine's stay one to one."""
    if model_parameters is not None:
        given = set()
        for item in model_parameters:
            params = item["params"] if isinstance(item, dict) else item[1] if isinstance(item, tuple) else item
            given |= {id(p) for p in ([params] if torch.is_tensor(params) else params)}
        if given != {id(p) for g in client.param_groups for p in g["params"]}:
            log.warning("model_parameters is ignored: the client optimizer trains its own param groups")
    client.param_groups[:] = [g for g in client.param_groups if any(p.requires_grad for p in g["params"])]
    return [dict(g) for g in client.param_groups]


def _param_groups(module: torch.nn.Module, model_parameters, client_optimizer,
                  replaced: dict | None = None) -> tuple[list[dict], dict]:
    """Normalise what the user passed into torch-style groups of trainable model parameters.
    `replaced`: parameters the model split swapped for new ones ({id(old): new}), named anew here."""
    registration = {id(p): i for i, p in enumerate(module.parameters())}
    if replaced:
        if isinstance(client_optimizer, torch.optim.Optimizer):
            for g in client_optimizer.param_groups:
                g["params"] = [replaced.get(id(p), p) for p in g["params"]]
        if model_parameters is not None:
            model_parameters = _renamed(model_parameters, replaced)
    if isinstance(client_optimizer, torch.optim.Optimizer):
        groups = _client_groups(client_optimizer, model_parameters)
    elif model_parameters is None:
        groups = [{"params": list(module.parameters())}]
    else:
        items = list(model_parameters)
        if items and isinstance(items[0], dict):
            groups = [dict(g) for g in items]
        else:
            groups = [{"params": [p[1] if isinstance(p, tuple) else p for p in items]}]
    seen = set()
    for i, group in enumerate(groups):
        params = [group["params"]] if torch.is_tensor(group["params"]) else list(group["params"])
        kept = []
        for p in params:
            if id(p) not in registration:
                raise ConfigError(f"model_parameters group {i} holds a tensor that is not a parameter of "
                                  "the model; pass model.parameters() or groups of them")
            if id(p) in seen:
                raise ConfigError(f"model_parameters group {i} repeats a parameter already in another group")
            seen.add(id(p))
            if p.requires_grad:
                kept.append(p)
        group["params"] = kept
    groups = [g for g in groups if g["params"]]
    if not groups:
        raise ConfigError("the model has no trainable parameters (none requires grad)")
    return groups, registration


def _renamed(model_parameters, replaced: dict) -> list:
    def swap(params):
        return replaced.get(id(params), params) if torch.is_tensor(params) else [replaced.get(id(p), p) for p in params]

    out = []
    for item in model_parameters:
        if isinstance(item, dict):
            out.append(dict(item, params=swap(item["params"])))
        elif isinstance(item, tuple):
            out.append((item[0], replaced.get(id(item[1]), item[1])))
        else:
            out.append(replaced.get(id(item), item))
    return out


def _first_difference(a, b, path: str = "") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            if a.get(key, "<missing>") != b.get(key, "<missing>"):
                return _first_difference(a.get(key, "<missing>"), b.get(key, "<missing>"), f"{path}.{key}".lstrip("."))
    return f"{path or '<config>'}: {a!r} vs {b!r}"


def _check_same_config(comm: Comm, raw: dict) -> None:
    """Ranks that were given different configs would silently train different things (or hang
    in mismatched collectives): compare a digest at start and name the first difference."""
    digest = hashlib.sha256(json.dumps(raw, sort_keys=True, default=str).encode()).hexdigest()
    digests = comm.all_gather_object(digest)
    if len(set(digests)) == 1:
        return
    odd = next(r for r, d in enumerate(digests) if d != digests[0])
    configs = comm.all_gather_object(raw)
    raise ConfigError(f"ranks were given different configs: rank 0 and rank {odd} differ at "
                      f"{_first_difference(configs[0], configs[odd])}")


def _accumulation_dtype(cfg, compute_dtype: torch.dtype) -> torch.dtype:
    """data_types.grad_accum_dtype: fp32 by default once micro-steps accumulate; with one
    micro-step per step there is nothing to accumulate, so no wider copy is kept."""
    if cfg.gradient_accumulation_steps == 1:
        return compute_dtype
    return {"fp16": torch.float16, "bf16": torch.bfloat16}.get(cfg.data_types.grad_accum_dtype, torch.float32)


def _model_split(model, comm, mpu, tensor: int, sequence: int | None = None) -> ModelSplit:
    """Which ranks share the data (ZeRO's group) and which hold other parts of the model."""
    from .parallel.pipeline.module import PipelineModule
    from .parallel.pipeline.setup import pipeline_parallel_split
    from .parallel.sequence.setup import sequence_parallel_split
    from .parallel.tensor.setup import tensor_parallel_split

    if sequence not in (None, 1) or hasattr(mpu, "get_sequence_parallel_group"):
        return sequence_parallel_split(model, comm, sequence, mpu, tensor)

    if isinstance(model, PipelineModule):
        return pipeline_parallel_split(model, comm, mpu)
    if type(model).__name__ == "PipelineModule":
        raise ConfigError(f"the model is {type(model).__module__}.PipelineModule; build it with "
                          "zerotrain.pipe.PipelineModule (and LayerSpec, TiedLayerSpec from zerotrain.pipe)")
    if tensor > 1:
        if mpu is not None:
            raise ConfigError("initialize: tensor_parallel.autotp_size builds its own groups; do not pass mpu= with it")
        return tensor_parallel_split(model, comm, tensor)
    if mpu is not None:
        return mpu_split(mpu, comm.state, model)
    return plain_split(model, comm)


def _state_bytes(cfg) -> int:
    """Optimizer state bytes per element, for the NVMe space check (Adam's 8 when unknown)."""
    from .zero.estimate import OPTIMIZER_BYTES

    return OPTIMIZER_BYTES.get(cfg.optimizer.type.lower(), 8) if cfg.optimizer is not None else 8


def _is_pipeline(model) -> bool:
    from .parallel.pipeline.module import PipelineModule

    return isinstance(model, PipelineModule)


def initialize(args=None, model: torch.nn.Module | None = None, optimizer=None, model_parameters=None,
               training_data=None, lr_scheduler=None, distributed_port=None, mpu=None,
               dist_init_required=None, collate_fn=None, config=None, config_params=None):
    """Build the engine. Returns (engine, optimizer, training_dataloader, lr_scheduler)."""
    if isinstance(args, torch.nn.Module):
        raise ConfigError("initialize's first argument is args (the argparse namespace); pass the model as "
                          "model=...")
    if model is None:
        raise ConfigError("initialize needs model=<torch.nn.Module>")
    if config is None:
        config = config_params
    config = _config_from_args(args, config)
    if config is None:
        raise ConfigError("initialize needs config=<dict or path to a DeepSpeed JSON file>")

    state = init_parallel()
    _setup_logging(state.rank)
    comm = Comm(state)
    split = _model_split(model, comm, mpu, tensor_parallel_size(config), sequence_parallel_size(config))
    data = split.data_comm  # ZeRO's ranks
    batch = split.batch_comm or data  # the ranks that read different batches: the batch triad counts them
    cfg = load_config(config, world_size=batch.world_size)
    _check_same_config(comm, cfg.raw)
    split.check(cfg)
    if state.rank == 0 and (line := config_notice(cfg)) and not summary.should_log():
        log.info(line)  # otherwise the summary below names these keys
    compute_dtype = _DTYPES["fp16"] if cfg.fp16.enabled else _DTYPES["bf16"] if cfg.bf16.enabled else torch.float32

    detach_previous_owners(list(model.parameters()))  # initialize called again on this model
    model.to(state.device)
    if compute_dtype != torch.float32:
        model.to(compute_dtype)
    # Every rank starts from rank 0's weights, as DDP does (before any sharding).
    for tensor in list(model.parameters()) + list(model.buffers()):
        if not is_partitioned(tensor):  # zero.Init already gave every rank rank 0's chunks
            data.broadcast(tensor.data)
    split.after_broadcast()
    groups, registration = _param_groups(model, model_parameters, optimizer, split.replaced)
    strategy = build_strategy(cfg.zero_optimization, model, groups, registration, data, compute_dtype,
                              state.device, prescale_gradients=cfg.prescale_gradients,
                              gradient_predivide_factor=cfg.gradient_predivide_factor,
                              gradient_mean=cfg.gradient_allreduce_op == "mean",
                              accumulation_dtype=compute_dtype if split.accumulates_in_grads
                              else _accumulation_dtype(cfg, compute_dtype),
                              optimizer_state_bytes=_state_bytes(cfg))
    strategy = split.wrap(strategy)  # the norm over the other parts of the model, if any

    if optimizer is not None:
        torch_optimizer = strategy.build_optimizer(lambda groups: adapt_client_optimizer(optimizer, groups))
    elif cfg.optimizer is not None:
        torch_optimizer = strategy.build_optimizer(
            lambda groups: build_optimizer(cfg.optimizer.type, cfg.optimizer.params, groups))
    else:
        torch_optimizer = None

    if lr_scheduler is not None:
        # a factory is called with our optimizer; a scheduler object (not callable) is used as is
        scheduler = lr_scheduler(torch_optimizer) if callable(lr_scheduler) else lr_scheduler
    elif cfg.scheduler is not None:
        if torch_optimizer is None:
            raise ConfigError("scheduler: a scheduler needs an optimizer; add an \"optimizer\" block")
        scheduler = build_scheduler(cfg.scheduler.type, torch_optimizer, cfg.scheduler.params)
    else:
        scheduler = None

    fp16 = cfg.fp16
    scaler = build_loss_scaler(fp16.enabled, fp16.loss_scale, fp16.initial_scale_power, fp16.loss_scale_window,
                               fp16.hysteresis, fp16.consecutive_hysteresis, fp16.min_loss_scale)
    if torch_optimizer is not None and scaler is not None:  # optimizer.cur_scale etc., as DeepSpeed's fp16
        expose_loss_scale(torch_optimizer, scaler)
    loader = None
    if state.rank == 0 and (notice := dynamic_batching_notice(cfg, training_data is not None)):
        (log.warning if notice[0] else log.info)(notice[1])
    if training_data is not None and dynamic_batching_on(cfg):
        # batches by token count; the schedule (or the optimizer's constant LR) scaled per step
        loader, scheduler, _ = build_variable_batch_training(training_data, cfg, batch.rank, batch.world_size,
                                                             collate_fn, scheduler or torch_optimizer,
                                                             _is_pipeline(model))
    elif training_data is not None and curriculum_sampling_on(cfg):  # batches drawn by the metrics' difficulty
        loader = build_curriculum_loader(training_data, cfg, batch.rank, batch.world_size, collate_fn=collate_fn)
    elif training_data is not None:
        loader = build_dataloader(training_data, cfg.train_micro_batch_size_per_gpu, batch.rank,
                                  batch.world_size, collate_fn=collate_fn, drop_last=cfg.dataloader_drop_last)
    engine = split.make_engine(model, cfg, comm, strategy, torch_optimizer, scheduler, scaler, compute_dtype,
                                features=build_features(cfg, loader), training_dataloader=loader)
    engine.batch_comm = batch
    for feature in engine.features:
        feature.on_train_start(engine)
    if cfg.activation_checkpointing is not None:
        activation_checkpointing.configure(deepspeed_config=cfg)
    if state.rank == 0 and summary.should_log():
        log.info(summary.render(engine))
    return engine, torch_optimizer, loader, scheduler
