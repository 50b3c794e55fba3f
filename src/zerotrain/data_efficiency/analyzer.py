"""DeepSpeed's data analyzer: each sample's difficulty, written as the index files the
curriculum sampler reads (data/curriculum_sampler.py, and DeepSpeed's own).

    run_map     the dataset is split into num_workers parts (one per process or machine),
                each into num_threads parts (one forked process each); every part reads its
                samples batch_size at a time and writes, per metric, under
                save_path/<metric>/worker<w>_thread<t>/:
                  <metric>_sample_to_metric   one row per sample, its value (as DeepSpeed's)
                  <metric>_sample_index       one row: the sample ids, in the same order
                  <metric>_metric_value       accumulate metrics: one row, the part's sum
    run_reduce  worker 0 merges every part into save_path/<metric>/ (names and dtypes as
                DeepSpeed's reduce writes them, so either tool reads the other's files):
                  <metric>_sample_to_metric   row i: sample i's value
                  <metric>_index_to_metric    row j: the j-th smallest distinct value
                  <metric>_index_to_sample    row j: the samples with that value, in map order
                  <metric>_index_to_sample_percentile_merged
                                              rows of len(index_to_metric) // 100 consecutive
                                              values merged (about a percentile each)
                  <metric>_metric_value       accumulate metrics: the sum over the dataset
                values in the narrowest integer type holding their range (signed only if
                negative), sample ids in the narrowest unsigned type holding len(dataset) - 1
    run_map_reduce  map, a barrier, worker 0 reduces, a barrier (torch.distributed through
                zerotrain.comm, gloo or nccl); a failure on any rank stops every rank with
                the same line

The reduce is one vectorised pass (a stable argsort of the values), where DeepSpeed writes a
CSV file per distinct value and merges them in num_threads_reduce processes; the files are the
same. A dataset with `get_batch(indices)` (tokens.py) gives each batch in one call; others are
read item by item and collated as DataLoader does (collate_fn, else torch's default_collate).
A sample's id is its position, or `sample_indices[position]`, or a batch's "index" field
(Megatron's datasets carry it). sample_to_metric is written in sample-id order; DeepSpeed
writes it in map order, which is the same unless sample_indices or "index" reorder it.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from collections.abc import Mapping

import numpy as np
import torch

from ..comm import facade
from ..data.indexed import IndexedFile, fit_int_dtype, write_rows
from ..errors import ConfigError, DataError

log = logging.getLogger("zerotrain")
SINGLE, ACCUMULATE = "single_value_per_sample", "accumulate_value_over_samples"
# DeepSpeed's metric dtypes (its indexed-dataset codes), in numpy's and torch's spellings
_DTYPES = {np.dtype(t): np.dtype(t) for t in (np.uint8, np.int8, np.int16, np.int32, np.int64, np.uint16,
                                                np.uint32, np.uint64)}
_TORCH = {torch.uint8: np.uint8, torch.int8: np.int8, torch.int16: np.int16, torch.int32: np.int32,
          torch.int64: np.int64}


def split_range(start: int, end: int, parts: int) -> list[tuple[int, int]]:
    """[start, end) in `parts` pieces, as DeepSpeed's split_index cuts them (linspace, rounded down)."""
    edges = np.linspace(start, end, num=parts + 1, dtype=int)
    return [(int(edges[i]), int(edges[i + 1])) for i in range(parts)]


def _numpy_dtype(dtype, what: str) -> np.dtype:
    found = _TORCH.get(dtype) if isinstance(dtype, torch.dtype) else _DTYPES.get(np.dtype(dtype))
    if found is None:
        shown = dtype if isinstance(dtype, torch.dtype) else np.dtype(dtype)
        raise ConfigError(f"{what}: {shown} is not an index-file dtype; use one of uint8, int8, int16, int32, int64, "
                          "uint16, uint32, uint64")
    return np.dtype(found)


class DataAnalyzer:
    """DeepSpeed's DataAnalyzer (same arguments). num_workers and worker_id default to the
    process group's size and this rank (1 and 0 without one), so run_map_reduce splits the
    work over the ranks that call it. num_threads_reduce has no effect (one vectorised reduce)."""

    def __init__(self, dataset, num_workers=None, worker_id=None, num_threads=1, num_threads_reduce=1,
                 specific_threads=(), batch_size=1, metric_names=(), metric_functions=(), metric_types=(),
                 metric_dtypes=(), save_path="./", collate_fn=None, custom_map_init=None, custom_map_update=None,
                 custom_map_finalize=None, custom_reduce=None, sample_indices=None, *, progress: bool = True):
        self.dataset = dataset
        self.num_workers = facade.get_world_size() if num_workers is None else num_workers
        self.worker_id = facade.get_rank() if worker_id is None else worker_id
        self.num_threads, self.num_threads_reduce = num_threads, num_threads_reduce
        self.specific_threads = list(specific_threads)
        self.batch_size = batch_size
        self.metric_names, self.metric_functions = list(metric_names), list(metric_functions)
        self.metric_types, self.metric_dtypes = list(metric_types), list(metric_dtypes)
        self.save_path, self.collate_fn = save_path, collate_fn
        self.custom_map_init, self.custom_map_update = custom_map_init, custom_map_update
        self.custom_map_finalize, self.custom_reduce = custom_map_finalize, custom_reduce
        self.sample_indices = None if sample_indices is None else np.asarray(sample_indices, dtype=np.int64)
        self.progress = progress
        self._check()
        self._dtypes = [None if d is None else _numpy_dtype(d, f"DataAnalyzer metric_dtypes ({n})")
                        for n, d in zip(self.metric_names, self.metric_dtypes)]
        if num_threads_reduce != 1 and self.worker_id == 0:
            log.info("DataAnalyzer: num_threads_reduce %s has no effect (the reduce is one vectorised pass)",
                     num_threads_reduce)

    def _check(self) -> None:
        where = "DataAnalyzer"
        counts = {len(self.metric_names), len(self.metric_types)} | (
            {len(self.metric_functions)} if self.custom_map_update is None else set())
        if self.custom_reduce is None:
            counts.add(len(self.metric_dtypes))
        if len(counts) != 1:
            raise ConfigError(f"{where}: metric_names, metric_functions, metric_types and metric_dtypes should have one "
                              f"entry per metric, got {len(self.metric_names)}, {len(self.metric_functions)}, "
                              f"{len(self.metric_types)} and {len(self.metric_dtypes)}")
        for name, kind in zip(self.metric_names, self.metric_types):
            if kind not in (SINGLE, ACCUMULATE):
                raise ConfigError(f"{where}: metric {name} has type {kind!r}; use {SINGLE!r} or {ACCUMULATE!r}")
        for key in ("num_workers", "num_threads", "batch_size"):
            if not isinstance(getattr(self, key), int) or getattr(self, key) < 1:
                raise ConfigError(f"{where}: {key} should be a positive integer, got {getattr(self, key)!r}")
        if not 0 <= self.worker_id < self.num_workers:
            raise ConfigError(f"{where}: worker_id {self.worker_id} is not one of the {self.num_workers} workers "
                              f"(0 to {self.num_workers - 1})")
        if any(not 0 <= t < self.num_threads for t in self.specific_threads):
            raise ConfigError(f"{where}: specific_threads {self.specific_threads} should be threads 0 to "
                              f"{self.num_threads - 1}")
        if len(self.dataset) == 0:
            raise DataError(f"{where}: the dataset is empty; there is nothing to analyse")
        if self.sample_indices is not None and len(self.sample_indices) != len(self.dataset):
            raise ConfigError(f"{where}: sample_indices has {len(self.sample_indices)} entries, the dataset "
                              f"{len(self.dataset)} samples")

    # ---- map --------------------------------------------------------------------------------
    def part_folder(self, name: str, worker: int, thread: int) -> str:
        return os.path.join(self.save_path, name, f"worker{worker}_thread{thread}")

    def run_map(self) -> None:
        worker = split_range(0, len(self.dataset), self.num_workers)[self.worker_id]
        self.thread_splits = split_range(*worker, self.num_threads)
        threads = self.specific_threads or list(range(self.num_threads))
        if self.num_threads == 1:
            self._map_part(threads[0])
            return
        # forked (os.fork: the dataset and metric functions need no pickling, and a daemonic
        # process, such as a DataLoader worker or a test pool's rank, may fork too)
        children = {t: _fork(self._map_part, t) for t in threads}
        failed = [t for t, pid in children.items() if os.waitpid(pid, 0)[1] != 0]
        if failed:
            raise RuntimeError(f"DataAnalyzer: map thread(s) {failed} of worker {self.worker_id} failed (see the "
                               f"traceback above); rerun them with specific_threads={failed}")

    def _map_part(self, thread: int) -> None:
        start, end = self.thread_splits[thread]
        custom = self.custom_map_init is not None
        results = self.custom_map_init(thread, self.metric_names, self.metric_types, self.metric_dtypes,
                                       self.save_path, self.worker_id) if custom else self._init_results(thread)
        from tqdm import tqdm

        with tqdm(total=end - start, desc=f"worker {self.worker_id} thread {thread}", unit=" samples",
                  position=thread if self.num_threads > 1 else None, disable=not self.progress, leave=False) as bar:
            for first in range(start, end, self.batch_size):
                last = min(first + self.batch_size, end)
                data = self._fetch(first, last)
                if self.custom_map_update is not None:
                    self.custom_map_update(data, self.metric_types, self.metric_dtypes, self.metric_functions,
                                           results, first)
                else:
                    self._update(data, results, first, last - first)
                bar.update(last - first)
        if self.custom_map_finalize is not None:
            self.custom_map_finalize(self.metric_types, self.metric_dtypes, results)
        else:
            self._finalize(results)

    def _fetch(self, first: int, last: int):
        if self.collate_fn is None and hasattr(self.dataset, "get_batch"):
            return self.dataset.get_batch(np.arange(first, last))
        from torch.utils.data import default_collate

        return (self.collate_fn or default_collate)([self.dataset[i] for i in range(first, last)])

    def _init_results(self, thread: int) -> list[dict]:
        return [{"name": n, "type": k, "dtype": d, "folder": self.part_folder(n, self.worker_id, thread),
                 "values": [], "ids": [], "total": None}
                for n, k, d in zip(self.metric_names, self.metric_types, self._dtypes)]

    def _values(self, result: dict, fn, data) -> np.ndarray:
        out = fn(data)
        name = result["name"]
        if torch.is_tensor(out):
            out = out.detach().cpu().numpy()
        if not isinstance(out, np.ndarray):
            raise DataError(f"DataAnalyzer: metric {name}'s function returned {type(out).__name__}; return a tensor "
                            "or numpy array")
        if result["dtype"] is None:  # DistributedDataAnalyzer: the first batch says
            result["dtype"] = _numpy_dtype(out.dtype, f"DataAnalyzer metric {name}'s values")
        if out.dtype != result["dtype"]:
            raise DataError(f"DataAnalyzer: metric {name}'s function returned {out.dtype} values and "
                            f"metric_dtypes says {result['dtype']}; make them agree")
        return out

    def _update(self, data, results: list[dict], first: int, count: int) -> None:
        for result, fn in zip(results, self.metric_functions):
            values = self._values(result, fn, data)
            if result["type"] == ACCUMULATE:
                total = result["total"]
                if total is not None and total.shape != values.shape:
                    raise DataError(f"DataAnalyzer: metric {result['name']} returned shape {values.shape} after "
                                    f"{total.shape}; an accumulated value keeps its shape in every batch")
                result["total"] = values.copy() if total is None else total + values
                continue
            values = values.reshape(len(values), -1) if values.ndim else values.reshape(1, 1)
            if values.shape != (count, 1):
                raise DataError(f"DataAnalyzer: metric {result['name']} gave values of shape {values.shape} for a "
                                f"batch of {count} samples; a {SINGLE} metric gives one value per sample")
            if isinstance(data, Mapping) and "index" in data:  # Megatron's datasets name each sample
                ids = np.asarray(data["index"]).reshape(count, -1)[:, 0]
            elif self.sample_indices is not None:
                ids = self.sample_indices[first:first + count]
            else:
                ids = np.arange(first, first + count)
            result["values"].append(values[:, 0])
            result["ids"].append(ids.astype(np.int64))

    def _finalize(self, results: list[dict]) -> None:
        for r in results:
            os.makedirs(r["folder"], exist_ok=True)
            prefix = os.path.join(r["folder"], r["name"])
            if r["type"] == ACCUMULATE:
                total = r["total"] if r["total"] is not None else np.zeros(0, r["dtype"])
                write_rows(f"{prefix}_metric_value", total.reshape(-1), [total.size], r["dtype"])
                continue
            values = np.concatenate(r["values"]) if r["values"] else np.zeros(0, r["dtype"])
            ids = np.concatenate(r["ids"]) if r["ids"] else np.zeros(0, np.int64)
            write_rows(f"{prefix}_sample_to_metric", values, np.ones(len(values), np.int64), r["dtype"])
            write_rows(f"{prefix}_sample_index", ids, [len(ids)], np.int64)

    # ---- reduce -----------------------------------------------------------------------------
    def _parts(self, name: str, suffix: str, workers=None):
        for w in range(self.num_workers) if workers is None else workers:
            for t in range(self.num_threads):
                prefix = os.path.join(self.part_folder(name, w, t), f"{name}_{suffix}")
                if not (os.path.isfile(prefix + ".idx") and os.path.isfile(prefix + ".bin")):
                    raise DataError(f"DataAnalyzer.run_reduce: {prefix}.idx/.bin not found: worker {w} thread {t} "
                                    f"has not mapped metric {name} (run run_map with worker_id={w}"
                                    f"{f', specific_threads=[{t}]' if self.num_threads > 1 else ''})")
                yield IndexedFile(prefix, f"metric {name}")

    def run_reduce(self) -> None:
        if self.custom_reduce is not None:
            self.custom_reduce(self.dataset, self.metric_names, self.metric_types, self.save_path, self.num_workers,
                               self.num_threads, self.num_threads_reduce)
            return
        self._write(self._read_parts())

    def _read_parts(self, workers=None) -> dict:
        """Per metric, what the map parts hold: (values, sample ids) or the accumulated parts."""
        found = {}
        for name, kind in zip(self.metric_names, self.metric_types):
            if kind == ACCUMULATE:
                parts = [p.concatenated().astype(np.int64) for p in self._parts(name, "metric_value", workers)]
                found[name] = [p for p in parts if p.size]
                continue
            found[name] = (np.concatenate([p.concatenated().astype(np.int64)
                                           for p in self._parts(name, "sample_to_metric", workers)]),
                           np.concatenate([p.concatenated() for p in self._parts(name, "sample_index", workers)]))
        return found

    def _write(self, found: dict) -> None:
        for name, kind in zip(self.metric_names, self.metric_types):
            if kind == ACCUMULATE:
                write_accumulated(self.save_path, name, found[name])
            else:
                write_metric(self.save_path, name, *found[name], len(self.dataset))

    def run_map_reduce(self, comm_group=None) -> None:
        """Map this worker's share, then worker 0 reduces; every rank returns once the files are
        written, or raises the first rank's error."""
        _agree("map", self.run_map, comm_group)
        _agree("reduce", self.run_reduce if self.worker_id == 0 else lambda: None, comm_group)


class DistributedDataAnalyzer(DataAnalyzer):
    """DeepSpeed's DistributedDataAnalyzer (same arguments): every rank maps its share into its
    own save_path, the values reach rank 0 through the process group (no shared folder), and
    rank 0 writes the same files DataAnalyzer does. num_workers and worker_id are the group's
    (comm_group's, else the world's); metric dtypes are the values' own; `device` has no
    effect (the values travel as objects)."""

    def __init__(self, dataset, num_workers=None, num_threads=1, worker_id=None, batch_size=1, metric_names=(),
                 metric_functions=(), metric_types=(), save_path="./", collate_fn=None, device="cuda",
                 comm_group=None, sample_indices=None, *, progress: bool = True):
        self.comm_group, self.device = comm_group, device
        if comm_group is not None:
            num_workers, worker_id = facade.get_world_size(comm_group), facade.get_rank(comm_group)
        super().__init__(dataset, num_workers, worker_id, num_threads, batch_size=batch_size,
                         metric_names=metric_names, metric_functions=metric_functions, metric_types=metric_types,
                         metric_dtypes=[None] * len(metric_names), save_path=save_path, collate_fn=collate_fn,
                         sample_indices=sample_indices, progress=progress)

    def run_map_reduce(self) -> None:
        _agree("map", self.run_map, self.comm_group)
        found = [None] * facade.get_world_size(self.comm_group)
        facade.all_gather_object(found, self._read_parts([self.worker_id]), group=self.comm_group)

        def reduce():
            if self.worker_id == 0:
                merged = {}
                for name, kind in zip(self.metric_names, self.metric_types):
                    parts = [f[name] for f in found]
                    merged[name] = [p for part in parts for p in part] if kind == ACCUMULATE else \
                        tuple(np.concatenate([part[k] for part in parts]) for k in (0, 1))
                self._write(merged)

        _agree("reduce", reduce, self.comm_group)


def _fork(fn, *args) -> int:
    """Run fn(*args) in a child process; its exit status says whether it raised."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        fn(*args)
        code = 0
    except BaseException:  # noqa: BLE001  (the child's traceback, then its exit status)
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _agree(step: str, fn, group) -> None:
    """Run fn on every rank; if any rank fails, the others raise one line naming it instead of
    waiting for it at the next collective."""
    error = None
    try:
        fn()
    except Exception as e:  # noqa: BLE001  (told to the other ranks, then raised as it is)
        error = e
    if facade.get_world_size(group) > 1:
        outcomes = [None] * facade.get_world_size(group)
        facade.all_gather_object(outcomes, None if error is None else f"{type(error).__name__}: {error}", group=group)
        failed = next(((r, o) for r, o in enumerate(outcomes) if o is not None), None)
        if error is None and failed is not None:
            raise DataError(f"DataAnalyzer: {step} failed on worker {failed[0]}: {failed[1]}")
    if error is not None:
        raise error


def write_metric(save_path: str, name: str, values: np.ndarray, ids: np.ndarray, num_samples: int) -> None:
    """The reduce's files for a single-value metric: `values[k]` belongs to sample `ids[k]`,
    in map order (which orders the samples within one value)."""
    where = f"DataAnalyzer.run_reduce: metric {name}"
    if len(values) != num_samples:
        raise DataError(f"{where}: the map files hold {len(values)} samples and the dataset has {num_samples}; a map "
                        "part did not finish or was made for another dataset: run run_map again")
    seen = np.bincount(ids, minlength=num_samples) if len(ids) and ids.min() >= 0 else None
    if seen is None or len(seen) > num_samples or (seen != 1).any():
        bad = ids[ids < 0][:1].tolist() or ids[ids >= num_samples][:1].tolist() or np.nonzero(seen != 1)[0][:1].tolist()
        raise DataError(f"{where}: sample ids should cover 0 to {num_samples - 1} once each; sample {bad[0]} is out of "
                        "range, missing or repeated (check sample_indices or the batch's 'index')")
    folder = os.path.join(save_path, name)
    os.makedirs(folder, exist_ok=True)
    prefix = os.path.join(folder, name)
    value_dtype = fit_int_dtype(int(values.min()), int(values.max()))
    sample_dtype = fit_int_dtype(0, num_samples - 1)
    by_sample = np.empty(num_samples, dtype=np.int64)
    by_sample[ids] = values
    write_rows(f"{prefix}_sample_to_metric", by_sample, np.ones(num_samples, np.int64), value_dtype)
    levels, counts = np.unique(values, return_counts=True)
    samples = ids[np.argsort(values, kind="stable")]
    write_rows(f"{prefix}_index_to_metric", levels, np.ones(len(levels), np.int64), value_dtype)
    write_rows(f"{prefix}_index_to_sample", samples, counts, sample_dtype)
    step = max(1, len(levels) // 100)
    write_rows(f"{prefix}_index_to_sample_percentile_merged", samples,
               np.add.reduceat(counts, np.arange(0, len(levels), step)), sample_dtype)
    edges = np.searchsorted(np.cumsum(counts), num_samples * np.arange(5, 101, 5) / 100)
    log.info("DataAnalyzer: metric %s over %d samples, %d distinct values from %d to %d; every 5th percentile: %s",
             name, num_samples, len(levels), levels[0], levels[-1], levels[np.minimum(edges, len(levels) - 1)].tolist())


def write_accumulated(save_path: str, name: str, parts: list) -> None:
    """The reduce's file for an accumulate metric: one row, the sum of the parts' values."""
    if not parts or any(np.shape(p) != np.shape(parts[0]) for p in parts):
        raise DataError(f"DataAnalyzer.run_reduce: metric {name}: the parts hold values of shapes "
                        f"{[np.shape(p) for p in parts]}; they should be one shape (mapped with other settings?)")
    total = np.sum(np.stack([np.asarray(p, dtype=np.int64) for p in parts]), axis=0).reshape(-1)
    folder = os.path.join(save_path, name)
    os.makedirs(folder, exist_ok=True)
    write_rows(os.path.join(folder, f"{name}_metric_value"), total, [total.size],
               fit_int_dtype(int(total.min()), int(total.max())))
