"""Curriculum by any metric: the batch sampler behind `data_efficiency.data_sampling.curriculum_learning`.

Each metric has a difficulty schedule (features/curriculum.py's, shared with the legacy
curriculum). Each global batch, the step advances; when a difficulty changes, a new cluster of
samples is made, and the batch is drawn across all clusters so far:

    step 1: difficulty 3  -> cluster A = samples with metric <= 3      (shuffled once)
    step 5: difficulty 6  -> cluster B = samples with metric in (3, 6]  (A stays)
    batch:  n_A, n_B ~ multinomial(global batch, sizes |A| : |B|)
            take n_A from A's read position on (reshuffle A when it runs out), same for B,
            shuffle the batch, give each data-parallel rank its slice of each micro-batch

    value       the difficulty is a metric value: (previous, current]
    percentile  the difficulty counts parts of the samples in metric order (index_to_sample's
                rows end to end): [previous, current) parts of len // max_difficulty samples,
                the last part taking the remainder (max_difficulty 100: percentiles)
    single_cluster  the metric selects nothing: every sample is in the first cluster (a post-
                process function uses its difficulty, e.g. seqlen_truncate)
    schedule_based  with two or more such metrics a new cluster is the intersection of each
                metric's "up to current" set, less the samples already clustered

The numbers are DeepSpeed's (DeepSpeedDataSampler): the same numpy generator seeded with
`data_efficiency.seed`, drawn in the same order, so one process gives DeepSpeed's batches.
Every rank computes the same batch from the same generator instead of receiving it from
rank 0: no collective, and a checkpoint from any rank restores all of them. The state saved
is the generator's own (DeepSpeed saves numpy's global generator instead, so its resumed runs
replay the sampler's stream: its issue 8405) plus the clusters' order and read positions.
Rank 0 also writes each cluster to `data_cluster_path` under DeepSpeed's file names.
"""

from __future__ import annotations

import logging
import os

import numpy as np
import torch

from ..errors import DataError
from ..features.curriculum import CurriculumScheduler
from .indexed import IndexedFile, smallest_index_dtype, write_indexed

log = logging.getLogger("zerotrain")
WHERE = "data_efficiency.data_sampling.curriculum_learning"
_SCHEDULE_KEYS = ("min_difficulty", "max_difficulty", "schedule_type", "schedule_config")


def _index_file(prefix: str, what: str, metric: str) -> IndexedFile:
    """A metric's index file, or one line saying which is missing and what writes it."""
    for suffix in (".idx", ".bin"):
        if not os.path.isfile(prefix + suffix):
            raise DataError(f"{what}: {prefix}{suffix} not found; write the index files with `zerotrain analyze` "
                            f"(or zerotrain.data_efficiency.DataAnalyzer) on this training data and give the path "
                            f"without .idx/.bin, e.g. SAVE_PATH/{metric}/{metric}_index_to_sample")
    return IndexedFile(prefix, what)


class _Metric:
    """One metric's schedule and, for schedule_based clustering, its index files."""

    def __init__(self, name: str, spec, num_samples: int):
        self.name, self.where = name, f"{WHERE}.curriculum_metrics.{name}"
        self.difficulty_type, self.clustering_type = spec.difficulty_type, spec.clustering_type
        self.max_difficulty = spec.max_difficulty
        schedule = {k: v for k, v in spec.model_dump(exclude_none=True).items() if k in _SCHEDULE_KEYS}
        self.scheduler = CurriculumScheduler(schedule, name=self.where)
        self.samples = self.values = None
        if self.clustering_type != "schedule_based":
            return
        index = _index_file(spec.index_to_sample_path, f"{self.where}.index_to_sample_path", name)
        self.samples = index.concatenated()
        largest = int(self.samples.max()) if len(self.samples) else -1
        if len(self.samples) != num_samples or largest >= num_samples:
            raise DataError(f"{self.where}.index_to_sample_path: {spec.index_to_sample_path} indexes "
                            f"{len(self.samples)} samples (largest {largest}) but the training data has "
                            f"{num_samples}: index files made for another dataset? Analyse this data again")
        if self.difficulty_type == "value":
            metric = _index_file(spec.index_to_metric_path, f"{self.where}.index_to_metric_path", name)
            if len(metric) != len(index) or np.any(metric.sizes != 1):
                raise DataError(f"{self.where}.index_to_metric_path: {spec.index_to_metric_path} should hold one "
                                f"value per row of index_to_sample ({len(index)} rows), has {len(metric)} rows")
            # one metric value per sample, in index_to_sample's order
            self.values = np.repeat(metric.concatenated(), index.sizes)

    def value_range(self) -> str:
        """The metric's values, for the line saying no sample lies within a difficulty."""
        if self.values is None or not len(self.values):
            return ""
        return f"; {self.name}'s values run from {self.values.min()} to {self.values.max()}"

    def first_previous(self):
        return float("-inf") if self.difficulty_type == "value" else 0

    def between(self, previous, current) -> np.ndarray:
        """The samples this metric puts in (previous, current]: values, or [previous, current)
        percentiles of the samples in metric order (DeepSpeed's per-percentile count rounds
        down; the last percentile takes the remainder)."""
        if self.difficulty_type == "value":
            return self.samples[(self.values > previous) & (self.values <= current)]
        total = len(self.samples)
        per = total // self.max_difficulty
        start, end = per * previous, total if current == self.max_difficulty else per * current
        return self.samples[start:max(start, end)]


class CurriculumSampler:
    """A batch sampler: yields this rank's list of sample indices for each micro-batch."""

    def __init__(self, data_efficiency, num_samples: int, micro_batch_size: int, rank: int, world_size: int,
                 gradient_accumulation_steps: int, drop_last: bool = True, write_clusters: bool | None = None):
        sampling = data_efficiency.data_sampling
        block = sampling.curriculum_learning
        if num_samples <= 0:
            raise DataError(f"{WHERE}: the training data is empty; the curriculum has nothing to draw")
        if not block.data_cluster_path:
            raise DataError(f"{WHERE}.data_cluster_path is missing: the sampler writes its cluster files there")
        self.num_samples = num_samples
        self.total_samples = num_samples * sampling.num_epochs
        self.micro_batch_size, self.rank, self.world_size = micro_batch_size, rank, world_size
        self.micro_times_ranks = micro_batch_size * world_size
        self.global_batch_size = self.micro_times_ranks * gradient_accumulation_steps
        self.drop_last = drop_last
        self.cluster_path = block.data_cluster_path
        self.write_clusters = rank == 0 if write_clusters is None else write_clusters
        self.index_dtype = smallest_index_dtype(num_samples)
        self.rng = np.random.default_rng(data_efficiency.seed)
        self.metrics = {name: _Metric(name, spec, num_samples) for name, spec in block.curriculum_metrics.items()}
        # progress (all of it in state_dict)
        self.batch: list[int] = []
        self.consumed_samples = 0
        self.curriculum_step = 0
        self.current_difficulties: dict = {}
        self.clusters: list[np.ndarray] = []
        self.cluster_names: list[str] = []
        self.positions: list[int] = []

    # ---- DeepSpeed's API --------------------------------------------------------------------
    def __len__(self) -> int:
        return self.total_samples

    def set_custom_curriculum_learning_schedule(self, schedule_func_dict: dict) -> None:
        for name, fn in schedule_func_dict.items():
            if name in self.metrics:
                self.metrics[name].scheduler.set_custom_get_difficulty(fn)

    def get_start_end_idx(self, batch_len: int | None = None) -> tuple[int, int]:
        """This rank's slice of a micro-batch across ranks (round() splits uneven lengths)."""
        batch_len = batch_len or self.micro_times_ranks
        edge = lambda r: round(r * batch_len / self.world_size)  # noqa: E731
        return edge(self.rank), edge(self.rank + 1)

    # ---- clusters ---------------------------------------------------------------------------
    def _new_cluster(self, previous: dict) -> None:
        name = "cluster" + "".join(f"_{m}{self.current_difficulties[m]}" for m in self.metrics)
        scheduled = [m for m in self.metrics.values() if m.clustering_type == "schedule_based"]
        cluster = None
        if len(scheduled) > 1:
            for m in self.metrics.values():
                upto = (np.arange(self.num_samples, dtype=self.index_dtype) if m.clustering_type != "schedule_based"
                        else m.between(m.first_previous(), self.current_difficulties[m.name]))
                cluster = upto if cluster is None else np.intersect1d(cluster, upto, assume_unique=True)
            for old in self.clusters:
                cluster = np.setdiff1d(cluster, old, assume_unique=True)
        else:
            if not self.clusters:
                cluster = np.arange(self.num_samples, dtype=self.index_dtype)
            for m in scheduled:
                cluster = m.between(previous[m.name], self.current_difficulties[m.name])
        if cluster is None or len(cluster) == 0:
            log.info("curriculum: no new samples between difficulties %s and %s", previous, self.current_difficulties)
            return
        cluster = np.array(cluster, dtype=self.index_dtype)
        self.rng.shuffle(cluster)
        self.clusters.append(cluster)
        self.cluster_names.append(name)
        self.positions.append(0)
        self._write(len(self.clusters) - 1)
        log.info("curriculum: cluster %s of %d samples (difficulties %s)", name, len(cluster),
                 self.current_difficulties)

    def _write(self, i: int) -> None:
        if self.write_clusters:
            os.makedirs(self.cluster_path, exist_ok=True)
            write_indexed(os.path.join(self.cluster_path, self.cluster_names[i]), [self.clusters[i]], self.index_dtype)

    def _take(self, i: int, count: int) -> list[int]:
        start = self.positions[i]
        taken = self.clusters[i][start:start + count].tolist()
        self.positions[i] += count
        if len(taken) < count:  # ran out: reshuffle and go on from the top
            rest = count - len(taken)
            self.clusters[i] = self.clusters[i].copy()
            self.rng.shuffle(self.clusters[i])
            self._write(i)
            taken += self.clusters[i][:rest].tolist()
            self.positions[i] = rest
        return taken

    def _next_global_batch(self) -> None:
        self.curriculum_step += 1
        changed, previous = False, {}
        for name, m in self.metrics.items():
            difficulty = m.scheduler.update_difficulty(self.curriculum_step)
            changed |= name not in self.current_difficulties or difficulty != self.current_difficulties[name]
            previous[name] = self.current_difficulties.get(name, m.first_previous())
            self.current_difficulties[name] = difficulty
        if changed:
            self._new_cluster(previous)
        if not self.clusters:
            raise DataError(f"{WHERE}.curriculum_metrics: no sample lies within the difficulties "
                            f"{self.current_difficulties} at curriculum step {self.curriculum_step}: nothing to draw "
                            f"(check min_difficulty against the metric's values"
                            f"{''.join(m.value_range() for m in self.metrics.values())})")
        sizes = np.array([len(c) for c in self.clusters], dtype=np.float64)
        counts = np.bincount(self.rng.choice(len(self.clusters), self.global_batch_size, replace=True,
                                             p=sizes / sizes.sum()), minlength=len(self.clusters))
        batch = np.array([s for i, n in enumerate(counts) for s in self._take(i, int(n))], dtype=np.int64)
        self.rng.shuffle(batch)
        self.batch = batch.tolist()

    def __iter__(self):
        while self.consumed_samples < self.total_samples:
            if not self.batch:
                self._next_global_batch()
            current = self.batch[:self.micro_times_ranks]
            self.batch = self.batch[self.micro_times_ranks:]
            if len(current) == self.micro_times_ranks or (current and not self.drop_last):
                self.consumed_samples += len(current)  # before the yield: a saved state is exact
                start, end = self.get_start_end_idx(len(current))
                yield current[start:end]

    @property
    def epoch(self) -> int:
        """Whole passes over the dataset's sample count so far."""
        return self.consumed_samples // self.num_samples

    # ---- checkpoints ------------------------------------------------------------------------
    def progress(self) -> dict:
        """DeepSpeed's state keys: what a post-process function reads (current_difficulties)."""
        return {"batch": list(self.batch), "consumed_samples": self.consumed_samples,
                "curriculum_step": self.curriculum_step, "current_difficulties": dict(self.current_difficulties),
                "data_cluster_paths": list(self.cluster_names), "data_cluster_current_position": list(self.positions)}

    def state_dict(self) -> dict:
        """progress() plus the generator's own state, the schedulers' and the clusters' current
        order (as int64 tensors: checkpoints load with weights_only)."""
        return {**self.progress(), "rng_state": self.rng.bit_generator.state,
                "schedulers": {n: m.scheduler.state_dict() for n, m in self.metrics.items()},
                "clusters": [torch.from_numpy(c.astype(np.int64)) for c in self.clusters]}

    def load_state_dict(self, state: dict) -> None:
        self.batch = list(state["batch"])
        self.consumed_samples = state["consumed_samples"]
        self.curriculum_step = state["curriculum_step"]
        self.current_difficulties = dict(state["current_difficulties"])
        # DeepSpeed kept absolute paths once; names are relative to data_cluster_path now
        self.cluster_names = [os.path.basename(p) for p in state["data_cluster_paths"]]
        self.positions = list(state["data_cluster_current_position"])
        for name, m in self.metrics.items():
            if name in state.get("schedulers", {}):
                m.scheduler.load_state_dict(state["schedulers"][name])
        if "clusters" in state:
            self.clusters = [np.asarray(c).astype(self.index_dtype) for c in state["clusters"]]
        else:  # DeepSpeed's checkpoint: the clusters are its files
            self.clusters = [np.array(IndexedFile(os.path.join(self.cluster_path, n), f"{WHERE}.data_cluster_path")[0])
                             for n in self.cluster_names]
        if "rng_state" in state:
            self.rng.bit_generator.state = state["rng_state"]
        else:
            log.warning("curriculum: the checkpoint holds numpy's global generator state, not the sampler's "
                        "(DeepSpeed's format); the sampler's draws restart from data_efficiency.seed")
