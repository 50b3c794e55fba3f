"""Events a feature can react to. The engine calls these and never names a feature.

Curriculum learning, progressive layer drop, token budgets and the like each live in their
own module as an `EngineFeature`; adding one adds a file, not `if`s in the engine.
"""

from __future__ import annotations


class EngineFeature:
    """Override only what you need; every hook defaults to doing nothing."""

    name = "feature"

    def describe(self) -> str:
        """What the start-up summary's features line says of it (its name unless it says more)."""
        return self.name

    def on_train_start(self, engine) -> None:
        """Once, at the end of initialize (validate the model, log that the feature is on)."""

    def before_forward(self, engine, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """Training-mode forwards only: may add kwargs or cut the batch."""
        return args, kwargs

    def after_backward(self, engine, loss) -> None:
        """After each engine.backward, with the unscaled loss it was given (detached)."""

    def on_boundary(self, engine) -> None:
        """At each optimizer-step boundary, before the step and before global_steps += 1."""

    def after_step(self, engine) -> None:
        """After the boundary's bookkeeping (global_steps already incremented)."""

    def should_stop(self, engine) -> bool:
        """True once the feature wants training to end (a token budget is spent)."""
        return False

    def log_fields(self, engine) -> dict:
        """Name -> number (int or float) the feature reports: the engine's steps_per_print line
        shows them (floats to 4 decimals), and the trainer logs them as they are, to its progress
        line, metrics.jsonl and TensorBoard, without knowing the feature."""
        return {}

    def on_close(self, engine) -> None:
        """At engine.destroy(): close what the feature opened (files, a logging run)."""

    def state_dict(self) -> dict | None:
        return None

    def load_state_dict(self, state: dict) -> None:
        pass
