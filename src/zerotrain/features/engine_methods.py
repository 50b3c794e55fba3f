"""DeepSpeed's engine methods that belong to a feature, kept out of engine/ (which names none),
and what a feature knows, asked of any engine by the feature's type.

`initialize` builds its engine as `TrainingEngine`, the engine plus these methods, so a
DeepSpeed script's `engine.get_pld_theta()` works whether or not the feature is on.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..engine.engine import Engine
from ..engine.getters import ConfigGetters
from ..engine.state_offload import StateOffload
from .curriculum import CurriculumFeature
from .data_sampling import DataSamplingFeature
from .layer_drop import LayerDropFeature
from .random_ltd import RandomLTDFeature
from .token_budget import TokenBudgetFeature


def curriculum_seqlen(engine) -> int | None:
    """The seqlen curriculum's length for the current step; None without one."""
    feature = engine.feature(CurriculumFeature)
    return feature.current_seqlen() if feature is not None else None


def tokens_consumed(engine) -> int | None:
    """Tokens trained so far over all ranks, as the token budget counts them; None without it."""
    feature = engine.feature(TokenBudgetFeature)
    return feature.tokens if feature is not None else None


def token_budget_block(engine):
    """The token budget's config block (what a report says of the budget); None without it."""
    feature = engine.feature(TokenBudgetFeature)
    return feature.cfg if feature is not None else None


class FeatureMethods:
    """Mixed into an Engine: each finds its feature by type through `engine.feature`."""

    def get_pld_theta(self) -> float | None:
        """Progressive layer drop's current keep probability, None when PLD is off."""
        feature = self.feature(LayerDropFeature)
        return feature.pld.get_theta() if feature is not None else None

    def random_ltd_enabled(self) -> bool:
        return self.feature(RandomLTDFeature) is not None

    @property
    def random_ltd_scheduler(self):
        """random-LTD's RandomLTDScheduler (DeepSpeed's attribute); None when it is off."""
        feature = self.feature(RandomLTDFeature)
        return feature.scheduler if feature is not None else None

    def random_ltd_initialize(self) -> None:
        """DeepSpeed's second half of convert_to_random_ltd: zerotrain routes the layers in
        convert_to_random_ltd itself (or at initialize), so this only checks that some are."""
        feature = self.feature(RandomLTDFeature)
        if feature is None or not feature.layers:
            raise RuntimeError("random_ltd_initialize: no routed layers; call "
                               "zerotrain.data_efficiency.convert_to_random_ltd(engine, LayerClass) with random-LTD "
                               "enabled in the config")

    def set_custom_curriculum_learning_schedule(self, fn) -> None:
        """Curriculum learning with schedule_type "custom": difficulty = fn(step); for the
        data_efficiency curriculum a dict {metric: fn}, as DeepSpeed takes it."""
        sampling = self.feature(DataSamplingFeature)
        if sampling is not None:
            sampler = sampling.sampler
            if not isinstance(fn, Mapping):
                raise TypeError("set_custom_curriculum_learning_schedule: the data_efficiency curriculum takes a "
                                f"dict {{metric: fn}} (metrics: {', '.join(sampler.metrics)})")
            sampler.set_custom_curriculum_learning_schedule(fn)
            return
        feature = self.feature(CurriculumFeature)
        if feature is None:
            raise RuntimeError("set_custom_curriculum_learning_schedule: curriculum learning is not enabled")
        if isinstance(fn, Mapping):  # data_efficiency's form for its one seqlen metric
            fn = next(iter(fn.values()))
        feature.scheduler.set_custom_get_difficulty(fn)

    def set_data_post_process_func(self, fn) -> None:
        """fn(batch, sampler_state) -> batch, applied to each batch of the curriculum's training
        loader (zerotrain.data.curriculum_loader has seqlen_truncate and seqlen_reshape)."""
        sampling = self.feature(DataSamplingFeature)
        if sampling is None:
            raise RuntimeError("set_data_post_process_func: needs the data_efficiency curriculum on and "
                               "initialize(training_data=...) (its loader applies the function)")
        sampling.loader.post_process_func = fn


class TrainingEngine(FeatureMethods, StateOffload, ConfigGetters, Engine):
    """The engine `zerotrain.initialize` returns."""
