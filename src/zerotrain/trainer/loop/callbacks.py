"""What a Trainer tells its callbacks, and when.

    on_train_begin(trainer)          the engine is built; before the first step (or the lone
                                     evaluation when there is no training set)
    on_step_end(trainer)             after each optimizer step, its logging, evaluation and save
    on_evaluate(trainer, metrics)    after each evaluation, with its eval_* metrics
    on_save(trainer, folder)         after each checkpoint is written and published
    on_train_end(trainer)            after the final evaluation, model and summary

Every rank calls every event. Subclass `TrainerCallback` and override the events you need;
the rest do nothing.
"""

from __future__ import annotations

from pathlib import Path


class TrainerCallback:
    def on_train_begin(self, trainer) -> None:
        pass

    def on_step_end(self, trainer) -> None:
        pass

    def on_evaluate(self, trainer, metrics: dict) -> None:
        pass

    def on_save(self, trainer, folder: Path) -> None:
        pass

    def on_train_end(self, trainer) -> None:
        pass


def checked(callbacks) -> list[TrainerCallback]:
    """The callbacks as a list, each a TrainerCallback (one line naming any that is not)."""
    found = list(callbacks)
    for cb in found:
        if not isinstance(cb, TrainerCallback):
            raise TypeError(f"callbacks: {type(cb).__name__} is not a zerotrain.TrainerCallback; subclass it "
                            "(its events are on_train_begin, on_step_end, on_evaluate, on_save, on_train_end)")
    return found
