"""The trainer's batches when the `data_efficiency` block draws them, in place of its own sampler
(sampler.py): the curriculum by any metric, or dynamic batching.

    curriculum by metric   initialize(training_data=train set, collate_fn=the collator) builds
                           DeepSpeed's sampler over it (data/curriculum_sampler.py); the index
                           files are `zerotrain analyze`'s over the same data options. A metric
                           named seqlen_truncate or seqlen_reshape cuts or reshapes each batch
                           by its difficulty (data/curriculum_loader.py), as Megatron-DeepSpeed's
                           script does; data_cluster_path defaults to output_dir/data_clusters
    dynamic batching       the token-batch loader is built here, before the engine, from the
                           set's length column (or metrics_path's seqlen files): the LR schedule
                           needs the step count, which is the packing's; after initialize it
                           becomes the engine's, its LR scaled per step (attach_variable_batch).
                           Through pipeline stages a step's micro-batches must share one shape:
                           the packs are made with equal sample counts (the engine's rule) and
                           each collated micro-batch is padded to its step's longest sample

An epoch of the trainer is the training set's sample count: len // train_batch_size steps under
the curriculum (its sampler draws from clusters, so an epoch is a count, not a pass), the
packing's steps under dynamic batching (reshuffled per epoch with the random order, so the
count may change from epoch to epoch). Both loaders keep their place in the engine's
checkpoints, so a resume continues the same batches; the trainer only counts micro-batches.
"""

from __future__ import annotations

import math
import os

from ...data.curriculum_loader import BUILT_IN, built_in_post_process, curriculum_sampling_on
from ...data_efficiency.variable_batch_size_and_lr import (attach_variable_batch, build_variable_batch_training,
                                                           dynamic_batching_on, measured_seqlens)
from ...errors import ConfigError
from .collate import pad_to_length
from .sampler import sample_lengths

WHERE = "data_efficiency.data_sampling"


class StepLengthCollate:
    """The token-batch loader's collate function through pipeline stages: the sampler hands each
    sample with its step's longest length (with_step_length), and the trainer's collator's batch
    is padded to it, whatever that collator is."""

    def __init__(self, collator):
        self.collator = collator
        self.pad_id = getattr(collator, "pad_id", 0)

    def __call__(self, tagged: list) -> dict:
        return pad_to_length(self.collator([sample for sample, _ in tagged]), tagged[0][1], self.pad_id)


def with_step_length(sample, length: int) -> tuple:
    """The loader's sample_padding_fn: the trainer's samples are token lists its collator pads,
    so the step's length travels beside the sample to StepLengthCollate."""
    return sample, length


def equal_micro_batches(plan) -> bool:
    """Whether a step's micro-batches must share one shape: through pipeline stages."""
    return plan.parallel.pipeline > 1


class DrawnBatches:
    """The trainer's loader and sampler (set_epoch, iteration, micro-batches per epoch) over the
    loader data_efficiency makes; `equal`: every micro-batch of a step one shape."""

    def __init__(self, kind: str, dataset, config, args, data_rank: int, data_world: int, collator,
                 equal: bool = False):
        self.kind, self.dataset, self.config, self.collator = kind, dataset, config, collator
        self.micro, self.ga = args.per_device_train_batch_size, args.gradient_accumulation_steps
        self.loader, self.sampler, self._left = None, None, 0
        if kind == "curriculum":
            self.samples_per_step = self.micro * data_world * self.ga
            if len(dataset) // self.samples_per_step == 0:
                raise ConfigError(f"the training set has {len(dataset)} samples, fewer than train_batch_size "
                                  f"{self.samples_per_step}; lower the batch size or add data")
            return
        block = config.data_efficiency.data_sampling.dynamic_batching
        seqlens = measured_seqlens(dataset, block) if block.metrics_path else sample_lengths(dataset)
        pad = dict(collate_fn=StepLengthCollate(collator), sample_padding_fn=with_step_length) if equal else \
            dict(collate_fn=collator)
        self.loader, _, _ = build_variable_batch_training(dataset, config, data_rank, data_world, pipeline=equal,
                                                          seqlens=seqlens, **pad)
        self.sampler = self.loader.batch_sampler
        if self.micro_per_epoch(0) == 0:
            raise ConfigError(f"{WHERE}.dynamic_batching: an epoch packs no whole step of train_batch_size "
                              f"{self.sampler.effective_batch_size} packs; raise max_tokens, lower the batch size or "
                              "add data")

    # ---- sizes -----------------------------------------------------------------------------
    def micro_per_epoch(self, epoch: int) -> int:
        """This rank's micro-batches in trainer epoch `epoch` (a multiple of the accumulation)."""
        if self.kind == "curriculum":
            return len(self.dataset) // self.samples_per_step * self.ga
        s = self.sampler
        return len(s.plan(epoch).packs) // (s.micro * s.world_size)

    def total_steps(self, epochs: float) -> int:
        whole, part = int(epochs), epochs - int(epochs)
        steps = sum(self.micro_per_epoch(e) // self.ga for e in range(whole))
        return max(1, (steps + math.ceil(part * (self.micro_per_epoch(whole) // self.ga))) if part else steps)

    def check_total(self, total_steps: int) -> None:
        """The curriculum's sampler stops after num_epochs x the set's samples."""
        if self.kind != "curriculum":
            return
        epochs = self.config.data_efficiency.data_sampling.num_epochs
        need = total_steps * self.samples_per_step
        if need > epochs * len(self.dataset):
            raise ConfigError(f"{WHERE}.num_epochs: {epochs} draws at most {epochs * len(self.dataset)} samples and "
                              f"the run needs {need} ({total_steps} steps x {self.samples_per_step}); raise it to "
                              f"{-(-need // len(self.dataset))} or lower max_steps")

    # ---- the engine ------------------------------------------------------------------------
    def engine_config(self, ds: dict, output_dir) -> dict:
        """initialize's extra arguments; the config dict gets its cluster folder if it had none."""
        if self.kind != "curriculum":
            return {}
        block = ds["data_efficiency"]["data_sampling"]["curriculum_learning"]
        if not block.get("data_cluster_path"):
            block["data_cluster_path"] = os.path.join(str(output_dir), "data_clusters")
        return {"training_data": self.dataset, "collate_fn": self.collator}

    def attach(self, engine, loader) -> None:
        """After initialize: the curriculum's loader (with its built-in post-process function),
        or the token-batch loader made the engine's."""
        if self.kind == "curriculum":
            self.loader, self.sampler = loader, loader.data_sampler
            fn = built_in_post_process(self.sampler.metrics)
            if fn is not None:
                engine.set_data_post_process_func(fn)
        else:
            attach_variable_batch(engine, self.loader)

    # ---- the trainer's loop ----------------------------------------------------------------
    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        """`skip`: the samples of the epoch done, as the trainer counts them (micro-batches x
        per_device_train_batch_size); the loader's own place is in the engine's checkpoint and
        agrees with it (a token-batch loader is set to it)."""
        done = skip // self.micro
        self._left = self.micro_per_epoch(epoch) - done
        if self.kind != "curriculum":
            self.sampler.epoch, self.sampler.position = epoch, done

    def __iter__(self):
        """The epoch's remaining micro-batches, none read beyond them: a batch taken from the
        sampler is a batch its checkpointed state has handed out."""
        it = iter(self.loader)
        for _ in range(self._left):
            try:
                yield next(it)
            except StopIteration:
                return


def sampling_kind(plan) -> str | None:
    """Which part of the data_efficiency block draws the training batches ("curriculum",
    "dynamic_batching" or None), once the options agree with it: preflight asks before anything
    is loaded, so these mistakes cost a second."""
    on = [kind for kind, test in (("curriculum", curriculum_sampling_on), ("dynamic_batching", dynamic_batching_on))
          if test(plan.config)]
    if len(on) == 2:
        raise ConfigError(f"{WHERE}: curriculum_learning and dynamic_batching both draw the training batches; enable "
                          "one of them")
    if not on:
        return None
    kind, args = on[0], plan.options
    what = "curriculum_learning" if kind == "curriculum" else "dynamic_batching"
    if args.group_by_length:
        raise ConfigError(f"group_by_length: {WHERE}.{what} orders the training batches; drop one of them")
    if args.dataloader_num_workers:
        raise ConfigError(f"dataloader_num_workers: {WHERE}.{what}'s loader takes its workers from "
                          f"{WHERE}.num_workers; set that instead")
    for name, spec in (plan.config.data_efficiency.data_sampling.curriculum_learning.curriculum_metrics or {}).items():
        if kind == "curriculum" and spec.clustering_type == "single_cluster" and name not in BUILT_IN:
            raise ConfigError(f"{WHERE}.curriculum_learning.curriculum_metrics.{name}: a single_cluster metric picks "
                              f"no samples and acts only through a post-process function; the trainer has "
                              f"{' and '.join(BUILT_IN)}: name the metric one of them, or make it schedule_based")
    return kind


def drawn_batches(plan, dataset, args, data_rank: int, data_world: int, collator) -> DrawnBatches | None:
    """The data_efficiency loader the config asks for, or None (the trainer's own sampler)."""
    kind = sampling_kind(plan) if dataset is not None else None
    if not kind:
        return None
    return DrawnBatches(kind, dataset, plan.config, args, data_rank, data_world, collator, equal_micro_batches(plan))
