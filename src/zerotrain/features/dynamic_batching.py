"""Dynamic batching in the engine: the loader's position in checkpoints, each step's LR scaled
for that step's batch, its sample count in the logs. The batches themselves come from the
training loader (data/dynamic_batching.py), the scaling from the schedule
(schedules/variable_batch.py)."""

from __future__ import annotations

import logging

from ..engine.hooks import EngineFeature

log = logging.getLogger("zerotrain")


class DynamicBatchingFeature(EngineFeature):
    name = "dynamic_batching"

    def __init__(self, sampler):
        self.sampler = sampler

    def describe(self) -> str:
        return f"dynamic batching (at most {self.sampler.max_tokens} tokens a pack, order {self.sampler.order})"

    def on_train_start(self, engine) -> None:
        if engine.comm.rank == 0:
            s = self.sampler
            log.info("dynamic batching on: at most %d tokens a pack, %d packs a step (train_batch_size), order %s, "
                     "LR scaled %s", s.max_tokens, s.effective_batch_size, s.order, self._method(engine))

    @staticmethod
    def _method(engine) -> str:
        return getattr(engine.lr_scheduler, "lr_scaling_method", "not at all (no optimizer)")

    def on_boundary(self, engine) -> None:
        # The step about to run trained on batch global_steps (one batch a step, skipped
        # steps included): its LR takes that batch's scale even if a skipped step held the
        # schedule back.
        align = getattr(engine.lr_scheduler, "align", None)
        if align is not None:
            align(engine.global_steps)

    def log_fields(self, engine) -> dict:
        return {"batch_samples": self.sampler.batch_size(max(engine.global_steps - 1, 0))}

    def state_dict(self) -> dict:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state)


def dynamic_batching_feature(loader):
    """The feature of a training loader that batches by tokens, else None."""
    from ..data.dynamic_batching import DynamicBatchSampler

    sampler = getattr(loader, "batch_sampler", None)
    return DynamicBatchingFeature(sampler) if isinstance(sampler, DynamicBatchSampler) else None
