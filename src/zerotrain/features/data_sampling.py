"""The sampling curriculum in the engine: its sampler's state in checkpoints, its difficulties
in the logs, and what DeepSpeed's engine methods reach through
`engine.feature(DataSamplingFeature)` (the custom schedules, the post-process function). The
sampler itself belongs to the training loader (data/curriculum_sampler.py)."""

from __future__ import annotations

import logging

from ..engine.hooks import EngineFeature

log = logging.getLogger("zerotrain")


class DataSamplingFeature(EngineFeature):
    name = "data_sampler"

    def __init__(self, loader):
        self.loader = loader
        self.sampler = loader.data_sampler

    def describe(self) -> str:
        metrics = ", ".join(f"{n} ({m.difficulty_type} {m.scheduler.state['min_difficulty']} -> "
                            f"{m.scheduler.state['max_difficulty']}, {m.clustering_type})"
                            for n, m in self.sampler.metrics.items())
        fn = self.loader.post_process_func
        return f"curriculum by {metrics}" + (f", batches through {fn.__name__}" if fn is not None else "")

    def on_train_start(self, engine) -> None:
        if engine.comm.rank == 0:
            kinds = ", ".join(f"{n} ({m.difficulty_type}, {m.clustering_type}, {m.scheduler.state['schedule_type']})"
                              for n, m in self.sampler.metrics.items())
            log.info("curriculum by metric on: %s; %d samples x %d epochs, clusters under %s", kinds,
                     self.sampler.num_samples, self.sampler.total_samples // self.sampler.num_samples,
                     self.sampler.cluster_path)

    def log_fields(self, engine) -> dict:
        return {f"difficulty_{n}": d for n, d in self.sampler.current_difficulties.items()
                if isinstance(d, (int, float))}

    def state_dict(self) -> dict:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state)
