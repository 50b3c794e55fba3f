"""Optional training features that attach to the engine through engine/hooks.py events.

`build_features(config)` turns the config blocks into EngineFeature objects; the engine only
calls their hooks and never names one. The order of the table is the order of the hooks:
fp16 auto-cast first, then layer drop adds its kwargs (as DeepSpeed does), the curriculum cuts
the batch, random-LTD counts layer tokens of what is left, and the token count sees it too.
"""

from __future__ import annotations

from ..errors import ConfigError
from .auto_cast import AutoCastFeature
from .curriculum import CurriculumFeature, CurriculumScheduler, scheduler_from_data_efficiency
from .data_sampling import DataSamplingFeature
from .dynamic_batching import dynamic_batching_feature
from .flops_profile import FlopsProfileFeature
from .layer_drop import LayerDropFeature, ProgressiveLayerDrop
from .random_ltd import RandomLTDFeature
from .token_budget import TokenBudgetFeature


def _layer_drop(cfg):
    block = cfg.progressive_layer_drop
    return LayerDropFeature(block.theta, block.gamma) if block is not None and block.enabled else None


def _curriculum(cfg):
    legacy = cfg.curriculum_learning
    de = cfg.data_efficiency
    sampling = de.data_sampling if de is not None and de.enabled and de.data_sampling.enabled else None
    newer = sampling.curriculum_learning if sampling is not None and sampling.curriculum_learning.enabled else None
    if legacy is not None and legacy.enabled:
        if newer is not None:
            raise ConfigError("curriculum_learning and data_efficiency.data_sampling.curriculum_learning are both "
                              "enabled; keep one")
        return CurriculumFeature(CurriculumScheduler(legacy), legacy.curriculum_type)
    return CurriculumFeature(scheduler_from_data_efficiency(newer)) if newer is not None else None


def _random_ltd(cfg):
    block = cfg.data_efficiency.random_ltd_on() if cfg.data_efficiency is not None else None
    if block is None:
        return None
    return RandomLTDFeature(block, cfg.data_efficiency.seed, cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu)


def _token_budget(cfg):
    block = cfg.token_budget
    return TokenBudgetFeature(block) if block is not None and block.enabled else None


def _monitor(cfg):
    from ..monitor import monitor_feature  # DeepSpeed's monitor blocks: tensorboard, csv_monitor, wandb, comet

    return monitor_feature(cfg)


def _auto_cast(cfg):
    return AutoCastFeature() if cfg.fp16.enabled and cfg.fp16.auto_cast else None


def _flops_profile(cfg):
    block = cfg.flops_profiler
    return FlopsProfileFeature(block) if block is not None and block.enabled else None


# auto_cast first: the other features then see (and cut) the inputs the model will get; the
# profile after them, so that it counts the forward as it runs; the monitor last, so its step
# events come after every other feature's step
FEATURES = (_auto_cast, _layer_drop, _curriculum, _random_ltd, _token_budget, _flops_profile, _monitor)


def build_features(config, training_loader=None) -> list:
    """A training loader that draws by the curriculum's metrics takes the curriculum's place; one that batches by tokens adds its
    feature first (its LR alignment precedes what the others do at a boundary)."""
    sampling = DataSamplingFeature(training_loader) if hasattr(training_loader, "data_sampler") else None
    made = (sampling if make is _curriculum and sampling is not None else make(config) for make in FEATURES)
    return [f for f in (dynamic_batching_feature(training_loader), *made) if f is not None]


__all__ = ["build_features", "CurriculumScheduler", "ProgressiveLayerDrop", "FEATURES"]
