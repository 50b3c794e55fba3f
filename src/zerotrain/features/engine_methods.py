"""DeepSpeed's engine methods that belong to a feature, kept out of engine/ (which names none).

`initialize` builds its engine as `TrainingEngine`, the engine plus these methods, so a
DeepSpeed script's `engine.get_pld_theta()` works whether or not the feature is on.
"""

from __future__ import annotations

from ..engine.engine import Engine


class FeatureMethods:
    """Mixed into an Engine: answers through `feature_value`, the engine's generic query."""

    def get_pld_theta(self) -> float | None:
        """Progressive layer drop's current keep probability, None when PLD is off."""
        return self.feature_value("pld_theta")

    def set_custom_curriculum_learning_schedule(self, fn) -> None:
        """Curriculum learning with schedule_type "custom": difficulty = fn(step)."""
        scheduler = self.feature_value("curriculum_scheduler")
        if scheduler is None:
            raise RuntimeError("set_custom_curriculum_learning_schedule: curriculum learning is not enabled")
        scheduler.set_custom_get_difficulty(fn)


class TrainingEngine(FeatureMethods, Engine):
    """The engine `zerotrain.initialize` returns."""
