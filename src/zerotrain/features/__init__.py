"""Optional training features that attach to the engine through engine/hooks.py events.

`build_features(config)` turns the config blocks into EngineFeature objects; the engine only
calls their hooks and never names one. The order of the table is the order of the hooks:
layer drop adds its kwargs first (as DeepSpeed does), the curriculum then cuts the batch,
and the token count sees what is left.
"""

from __future__ import annotations

from ..errors import ConfigError
from .curriculum import CurriculumFeature, CurriculumScheduler, scheduler_from_data_efficiency
from .layer_drop import LayerDropFeature, ProgressiveLayerDrop
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
        return CurriculumFeature(CurriculumScheduler(legacy))
    return CurriculumFeature(scheduler_from_data_efficiency(newer)) if newer is not None else None


def _token_budget(cfg):
    block = cfg.token_budget
    return TokenBudgetFeature(block) if block is not None and block.enabled else None


FEATURES = (_layer_drop, _curriculum, _token_budget)


def _refuse_unimplemented(cfg) -> None:
    de = cfg.data_efficiency
    if de is None or not de.enabled:
        return
    if de.data_sampling.enabled and de.data_sampling.dynamic_batching.enabled:
        raise ConfigError("data_efficiency.data_sampling.dynamic_batching: not supported by zerotrain; "
                          "set \"enabled\": false")
    if de.data_routing.enabled and de.data_routing.random_ltd.enabled:
        raise ConfigError("data_efficiency.data_routing.random_ltd: not supported by zerotrain; "
                          "set \"enabled\": false")


def build_features(config) -> list:
    _refuse_unimplemented(config)
    return [f for f in (make(config) for make in FEATURES) if f is not None]


__all__ = ["build_features", "CurriculumScheduler", "ProgressiveLayerDrop", "FEATURES"]
