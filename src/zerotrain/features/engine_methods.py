"""DeepSpeed's engine methods that belong to a feature, kept out of engine/ (which names none),
and what a feature knows, asked of any engine by the feature's type.

`initialize` builds its engine as `TrainingEngine`, the engine plus these methods, so a
DeepSpeed script's `engine.get_pld_theta()` works whether or not the feature is on.
"""

from __future__ import annotations

from ..engine.engine import Engine
from .curriculum import CurriculumFeature
from .layer_drop import LayerDropFeature
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

    def set_custom_curriculum_learning_schedule(self, fn) -> None:
        """Curriculum learning with schedule_type "custom": difficulty = fn(step)."""
        feature = self.feature(CurriculumFeature)
        if feature is None:
            raise RuntimeError("set_custom_curriculum_learning_schedule: curriculum learning is not enabled")
        feature.scheduler.set_custom_get_difficulty(fn)


class TrainingEngine(FeatureMethods, Engine):
    """The engine `zerotrain.initialize` returns."""
