"""Dynamic batching under DeepSpeed's names (deepspeed.runtime.data_pipeline.data_sampling.
variable_batch_size_and_lr): a loader of token-budget batches and the LR schedule that scales
each step's LR by its samples, made together because the schedule must know the loader's
steps. The batching rules live in data/dynamic_batching.py, the scaling in
schedules/variable_batch.py.

Two ways in:
    zerotrain.initialize(..., training_data=dataset)   with data_efficiency.enabled,
        data_sampling.enabled and dynamic_batching.enabled: the returned loader and
        scheduler are these (the engine steps the scaled schedule; checkpoints hold the
        loader's position)
    get_dataloader_and_lr_scheduler_for_variable_batch_size_deepspeed(dataset, engine)
        DeepSpeed's call after initialize; zerotrain also makes the results the engine's
        own, so that engine.step() scales the LR and checkpoints hold the position (DeepSpeed
        leaves both to the script)
"""

from __future__ import annotations

import logging
import os

import numpy as np
import torch

from ..data.dynamic_batching import (WHERE, DynamicBatchSampler, batch_by_seqlens, pad_collate, sample_length,
                                     variable_batch_loader)
from ..data.indexed import IndexedFile
from ..errors import ConfigError, DataError
from ..schedules.variable_batch import VariableBatchSizeLR, lr_scheduler_for_variable_batch_size, scale_lr

log = logging.getLogger("zerotrain")
DEFAULT_SEED = 1234  # data_efficiency.seed's default: a random order must agree on every rank


def get_dataloader_and_lr_scheduler_for_variable_batch_size(
        dataset, dataset_seqlens, max_tokens: int, effective_batch_size: int, dataset_filter_ids=None,
        lr_scaling_method: str = "linear", min_batch_size: int = 1, max_batch_size: int | None = None,
        sequence_picking_order: str = "dataloader", dataloader_batch_size: int = 1, dataloader_rank: int = 0,
        dataloader_num_replicas: int = 1, dataloader_num_workers: int = 0, dataloader_collate_fn=None,
        dataloader_pin_memory: bool = False, lr_scheduler_or_optimizer=None,
        required_microbatches_of_same_size: bool = False, required_microbatches_of_same_seqlen: bool = False,
        sample_padding_fn=None, verbose: bool = False, seed: int | None = None):
    """(dataloader, lr_scheduler, kwargs the loader was made from). effective_batch_size is
    train_batch_size (dataloader_batch_size x accumulation x replicas); the scheduler is None
    when lr_scheduler_or_optimizer is. seed None means data_efficiency.seed's default, 1234
    (DeepSpeed would draw a different random order on every rank)."""
    per = dataloader_batch_size * dataloader_num_replicas
    if effective_batch_size % per:
        raise ConfigError(f"{WHERE}: effective_batch_size {effective_batch_size} is not a multiple of "
                          f"dataloader_batch_size x dataloader_num_replicas = {per}")
    if len(dataset_seqlens) != len(dataset):
        raise DataError(f"{WHERE}: {len(dataset_seqlens)} sequence lengths for a dataset of {len(dataset)} samples: "
                        "lengths made for another dataset? (delete metrics_path's files to measure them again)")
    sampler = DynamicBatchSampler(
        dataset_seqlens, max_tokens, dataloader_batch_size, effective_batch_size // per, dataloader_rank,
        dataloader_num_replicas, dataset_filter_ids, min_batch_size, max_batch_size, sequence_picking_order,
        required_microbatches_of_same_size, DEFAULT_SEED if seed is None else seed, verbose,
        pad_to_step=required_microbatches_of_same_seqlen)
    loader = variable_batch_loader(dataset, sampler, dataloader_collate_fn, sample_padding_fn, dataloader_num_workers,
                                   dataloader_pin_memory)
    sampler.plan(0)  # the plan's problems (too few samples) surface here, not at the first batch
    scheduler = None
    if lr_scheduler_or_optimizer is not None:
        scheduler = lr_scheduler_for_variable_batch_size(effective_batch_size, sampler.batch_size, loader,
                                                         lr_scheduler_or_optimizer, lr_scaling_method, verbose)
    kwargs = dict(dataset=dataset, batch_size=dataloader_batch_size, pin_memory=dataloader_pin_memory,
                  data_sampler=sampler, collate_fn=loader.collate_fn, num_local_io_workers=dataloader_num_workers)
    return loader, scheduler, kwargs


def dynamic_batching_on(cfg) -> bool:
    """Whether initialize(training_data=...) batches by tokens (every switch on the way is on)."""
    de = cfg.data_efficiency
    return bool(de is not None and de.enabled and de.data_sampling.enabled
                and de.data_sampling.dynamic_batching.enabled)


def dynamic_batching_notice(cfg, has_training_data: bool) -> tuple[bool, str] | None:
    """(is it a mistake, the line) when an enabled dynamic_batching block does not batch
    initialize's loader: a switch above it is off (a mistake), or there is no training_data
    (the script may call the DeepSpeed function next)."""
    de = cfg.data_efficiency
    if de is None or not de.data_sampling.dynamic_batching.enabled:
        return None
    if not dynamic_batching_on(cfg):
        off = "data_efficiency.enabled" if not de.enabled else "data_efficiency.data_sampling.enabled"
        return True, (f"{WHERE}.enabled is true but {off} is false: initialize's loader makes fixed-size batches "
                f"(enable {off} to batch by tokens)")
    from ..engine.summary import should_log

    if not has_training_data and should_log():  # a caller with its own summary (the trainer) attaches it itself
        return False, (f"{WHERE} is enabled but initialize got no training_data: batches by tokens come from "
                "initialize(training_data=...) or get_dataloader_and_lr_scheduler_for_variable_batch_size_deepspeed")
    return None


def measured_seqlens(dataset, block, batch_seqlens_fn=None, collate_fn=None) -> np.ndarray:
    """Each sample's length: from the data analyzer's seqlen files under metrics_path when they
    are there, else from batch_seqlens_fn over collated batches, else measured per sample
    (sample_length)."""
    if block.metrics_path:
        prefix = os.path.join(block.metrics_path, "seqlen", "seqlen_sample_to_metric")
        if os.path.isfile(prefix + ".idx") and os.path.isfile(prefix + ".bin"):
            return np.asarray(IndexedFile(prefix, f"{WHERE}.metrics_path").concatenated(), dtype=np.int64)
        log.info("dynamic batching: no %s.idx/.bin; measuring the %d samples' lengths", prefix, len(dataset))
    if batch_seqlens_fn is None:
        return np.array([sample_length(dataset[i]) for i in range(len(dataset))], dtype=np.int64)
    collate, out = collate_fn or pad_collate, []
    for start in range(0, len(dataset), 1024):
        batch = collate([dataset[i] for i in range(start, min(start + 1024, len(dataset)))])
        out.append(np.asarray(torch.as_tensor(batch_seqlens_fn(batch)).reshape(-1), dtype=np.int64))
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def build_variable_batch_training(dataset, cfg, rank: int, world_size: int, collate_fn=None,
                                  lr_scheduler_or_optimizer=None, pipeline: bool = False, seqlens=None,
                                  filter_ids=None, sample_padding_fn=None, batch_seqlens_fn=None):
    """The loader and scaled schedule initialize returns with dynamic batching on; a pipeline
    gets equal micro-batches padded to each step's longest sample."""
    de = cfg.data_efficiency
    sampling, block = de.data_sampling, de.data_sampling.dynamic_batching
    if sampling.enabled and sampling.curriculum_learning.enabled:
        raise ConfigError("data_efficiency.data_sampling: curriculum_learning and dynamic_batching both draw the "
                          "training batches; enable one of them")
    if seqlens is None:
        seqlens = measured_seqlens(dataset, block, batch_seqlens_fn, collate_fn)
    return get_dataloader_and_lr_scheduler_for_variable_batch_size(
        dataset, seqlens, block.max_tokens, cfg.train_batch_size, filter_ids, block.lr_scaling_method,
        block.min_batch_size, block.max_batch_size, block.sequence_picking_order,
        cfg.train_micro_batch_size_per_gpu, rank, world_size, sampling.num_workers, collate_fn,
        sampling.pin_memory, lr_scheduler_or_optimizer, pipeline, pipeline, sample_padding_fn, block.verbose, de.seed)


def get_dataloader_and_lr_scheduler_for_variable_batch_size_deepspeed(
        dataset, engine, dataset_seqlens=None, dataset_filter_ids=None, dataloader_collate_fn=None,
        sample_padding_fn=None, batch_seqlens_fn=None):
    """DeepSpeed's call: the engine's config, batch sizes and data-parallel rank; the lengths
    from dataset_seqlens, else measured_seqlens. The loader and schedule become the engine's."""
    from ..parallel.pipeline.engine import PipelineEngine

    block = engine.config.data_efficiency.data_sampling.dynamic_batching
    if not block.enabled:
        raise ConfigError(f"{WHERE}.enabled is false: enable dynamic batching in the config to batch by tokens")
    comm = getattr(engine, "mesh", None)
    comm = comm.comm("data") if comm is not None else engine.strategy.comm  # the ranks that read different data
    loader, _, kwargs = build_variable_batch_training(
        dataset, engine.config, comm.rank, comm.world_size, dataloader_collate_fn, None,
        isinstance(engine, PipelineEngine), dataset_seqlens, dataset_filter_ids, sample_padding_fn, batch_seqlens_fn)
    return loader, attach_variable_batch(engine, loader), kwargs


def attach_variable_batch(engine, loader) -> VariableBatchSizeLR:
    """Make a token-batch loader the engine's: the engine's schedule (or its optimizer's constant
    LR) scaled by each step's samples, the loader's position in checkpoints."""
    from ..features.dynamic_batching import DynamicBatchingFeature

    block = engine.config.data_efficiency.data_sampling.dynamic_batching
    sampler = loader.batch_sampler
    scheduler = lr_scheduler_for_variable_batch_size(sampler.effective_batch_size, sampler.batch_size, loader,
                                                     engine.lr_scheduler or engine.optimizer, block.lr_scaling_method,
                                                     block.verbose)
    engine.training_dataloader, engine.lr_scheduler = loader, scheduler
    engine.features = [f for f in engine.features if not isinstance(f, DynamicBatchingFeature)]
    engine.features.insert(0, DynamicBatchingFeature(sampler))
    return scheduler


__all__ = ["VariableBatchSizeLR", "batch_by_seqlens", "scale_lr", "lr_scheduler_for_variable_batch_size",
           "get_dataloader_and_lr_scheduler_for_variable_batch_size",
           "get_dataloader_and_lr_scheduler_for_variable_batch_size_deepspeed"]
