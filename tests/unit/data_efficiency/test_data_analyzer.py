"""The data analyzer: its files read back by a reader of the mmap format written here (struct
and numpy, not zerotrain's indexed.py) and compared with a brute-force reference of what
DeepSpeed's analyzer writes; the same files from one process, two workers and forked threads,
through item-by-item and batched reading; the sampler drawing from them; bad inputs."""

from __future__ import annotations

import math
import os
from collections import Counter

import numpy as np
import pytest
import torch

import zerotrain
from zerotrain.config import load_config
from zerotrain.data.curriculum_sampler import CurriculumSampler
from zerotrain.data.indexed import write_indexed
from zerotrain.data_efficiency import DataAnalyzer, metrics
from zerotrain.data_efficiency.tokens import ArrowTokens, IndexedTokens
from zerotrain.errors import ConfigError, DataError

from mmap_reader import expected_files, narrowest, read_mmap

N, VOCAB = 300, 64
SINGLE, ACC = "single_value_per_sample", "accumulate_value_over_samples"


def token_rows(seed: int = 0) -> list[np.ndarray]:
    """Rows of 1-40 tokens, skewed so some ids are rare (and one, VOCAB - 1, never occurs)."""
    rng = np.random.default_rng(seed)
    return [np.minimum(rng.geometric(0.08, rng.integers(1, 41)), VOCAB - 2).astype(np.int64) for _ in range(N)]


def brute_metrics(rows) -> dict:
    counts = Counter(int(t) for r in rows for t in r)
    freq = [counts.get(i, 0) for i in range(VOCAB)]
    total = sum(max(f, 1) for f in freq)
    minus_log = [-math.log(max(f, 1) / total) for f in freq]
    return {"freq": freq, "seqlen": [len(r) for r in rows],
            "vocab_rarity": [int(sum(minus_log[int(t)] for t in r)) for r in rows],
            "shifted": [int(r[0]) - 20 for r in rows]}


def assert_metric_files(save_path, name: str, want: dict) -> None:
    for suffix, (dtype, rows) in want.items():
        got_dtype, got_rows = read_mmap(os.path.join(save_path, name, f"{name}_{suffix}"))
        assert got_dtype == dtype, (name, suffix)
        assert got_rows == rows, (name, suffix)


def analyze(dataset, save_path, rows_for_freq, **kw) -> None:
    """total_vocab_freq, then seqlen, vocab_rarity and a signed metric, as the CLI runs them."""
    common = dict(batch_size=kw.pop("batch_size", 32), save_path=str(save_path), progress=False, **kw)
    workers = common.pop("workers", [0])
    for w in workers:
        DataAnalyzer(dataset, metric_names=["total_vocab_freq"], metric_functions=[metrics.total_vocab_freq(VOCAB)],
                     metric_types=[ACC], metric_dtypes=[np.int64], worker_id=w, num_workers=len(workers),
                     **common).run_map()
    DataAnalyzer(dataset, metric_names=["total_vocab_freq"], metric_types=[ACC], metric_functions=[None],
                 metric_dtypes=[np.int64], num_workers=len(workers), **common).run_reduce()
    freq = metrics.read_vocab_freq(str(save_path))
    names = ["seqlen", "vocab_rarity", "shifted"]
    fns = [metrics.seqlen, metrics.vocab_rarity(freq), lambda b: torch.as_tensor(np.asarray(b["input_ids"][:, 0]).astype(np.int64) - 20)]
    last = None
    for w in workers:
        last = DataAnalyzer(dataset, metric_names=names, metric_functions=fns, metric_types=[SINGLE] * 3,
                            metric_dtypes=[np.int64, np.int64, torch.int64], worker_id=w, num_workers=len(workers),
                            **common)
        last.run_map()
    last.run_reduce()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tokens")
    rows = token_rows()
    write_indexed(str(folder / "tok"), rows, np.uint16)
    return rows, IndexedTokens(str(folder / "tok")), brute_metrics(rows)


def test_files_match_the_brute_force_reference(data, tmp_path):
    rows, dataset, brute = data
    analyze(dataset, tmp_path, rows)
    dtype, freq = read_mmap(str(tmp_path / "total_vocab_freq" / "total_vocab_freq_metric_value"))
    assert freq == [brute["freq"]] and dtype == narrowest(0, max(brute["freq"]))
    assert len(set(brute["vocab_rarity"])) > 100  # percentile rows merge more than one value
    for name in ("seqlen", "vocab_rarity", "shifted"):
        assert_metric_files(tmp_path, name, expected_files(brute[name]))
    assert read_mmap(str(tmp_path / "shifted" / "shifted_index_to_metric"))[0] == np.int8  # signed when negative


class ItemRows(torch.utils.data.Dataset):
    """No get_batch: read item by item and collated by the analyzer's collate_fn."""

    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def pad(items):
    width = max(len(r) for r in items)
    ids = torch.zeros(len(items), width, dtype=torch.long)
    mask = torch.zeros(len(items), width, dtype=torch.bool)
    for k, r in enumerate(items):
        ids[k, :len(r)], mask[k, :len(r)] = torch.as_tensor(r), True
    return {"input_ids": ids, "attention_mask": mask}


def test_workers_threads_and_item_reading_write_the_same_files(data, tmp_path):
    rows, dataset, _ = data
    analyze(dataset, tmp_path / "one", rows)
    analyze(dataset, tmp_path / "split", rows, workers=[0, 1], num_threads=3, batch_size=7)
    analyze(ItemRows(rows), tmp_path / "items", rows, collate_fn=pad, batch_size=50)
    for name in ("total_vocab_freq", "seqlen", "vocab_rarity", "shifted"):
        for other in ("split", "items"):
            for f in (tmp_path / "one" / name).glob("*.*"):
                assert f.read_bytes() == (tmp_path / other / name / f.name).read_bytes(), (other, f.name)


def test_sample_indices_and_index_fields_name_the_samples(data, tmp_path):
    rows, dataset, brute = data
    perm = np.random.default_rng(3).permutation(N)
    DataAnalyzer(dataset, batch_size=16, metric_names=["seqlen"], metric_functions=[metrics.seqlen],
                 metric_types=[SINGLE], metric_dtypes=[np.int64], save_path=str(tmp_path), sample_indices=perm,
                 progress=False).run_map_reduce()
    by_id = [0] * N
    for pos, sample in enumerate(perm):
        by_id[sample] = brute["seqlen"][pos]
    assert_metric_files(tmp_path, "seqlen", expected_files(by_id, order=perm.tolist()))

    indexed = ItemRows([{"input_ids": torch.as_tensor(r[:1]), "index": torch.tensor([perm[i]])}
                        for i, r in enumerate(rows)])
    DataAnalyzer(indexed, batch_size=16, metric_names=["first"], metric_functions=[lambda b: b["input_ids"][:, 0]],
                 metric_types=[SINGLE], metric_dtypes=[torch.int64], save_path=str(tmp_path),
                 progress=False).run_map_reduce()
    first = [0] * N
    for pos, sample in enumerate(perm):
        first[sample] = int(rows[pos][0])
    assert_metric_files(tmp_path, "first", expected_files(first, order=perm.tolist()))


def test_arrow_and_mmap_batches_agree(data):
    import datasets

    rows, dataset, _ = data
    arrow = ArrowTokens(datasets.Dataset.from_dict({"input_ids": [r.tolist() for r in rows]}))
    for idx in (np.arange(5, 40), np.array([7, 3, 200, 3])):
        a, b = arrow.get_batch(idx), dataset.get_batch(idx)
        assert all(np.array_equal(a[k], b[k]) for k in ("input_ids", "attention_mask", "length"))
        assert b["input_ids"][1, :len(rows[idx[1]])].tolist() == rows[idx[1]].tolist()
    assert arrow[4]["input_ids"].tolist() == dataset[4]["input_ids"].tolist() == rows[4].tolist()


# ---- the sampler reads the analyzer's files --------------------------------------------------
def curriculum(save_path, metrics_block: dict, cluster_path):
    return load_config({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "data_efficiency": {
        "enabled": True, "seed": 11, "data_sampling": {"enabled": True, "curriculum_learning": {
            "enabled": True, "data_cluster_path": str(cluster_path), "curriculum_metrics": metrics_block}}}},
        world_size=1).data_efficiency


def metric_block(prefix: str, kind: str, lo: int, hi: int, merged: bool = False) -> dict:
    return {"index_to_sample_path": f"{prefix}_index_to_sample" + ("_percentile_merged" if merged else ""),
            "index_to_metric_path": f"{prefix}_index_to_metric", "difficulty_type": kind,
            "clustering_type": "schedule_based", "min_difficulty": lo, "max_difficulty": hi,
            "schedule_type": "fixed_linear", "schedule_config": {"total_curriculum_step": 8, "difficulty_step": 1}}


def test_the_sampler_draws_from_the_analyzer_files(data, tmp_path):
    rows, dataset, brute = data
    DataAnalyzer(dataset, batch_size=64, metric_names=["seqlen"], metric_functions=[metrics.seqlen],
                 metric_types=[SINGLE], metric_dtypes=[np.int64], save_path=str(tmp_path / "a"),
                 progress=False).run_map_reduce()
    # the same metric written by hand from the brute force, as the sampler's own tests lay it out
    levels = sorted(set(brute["seqlen"]))
    write_indexed(str(tmp_path / "ref_index_to_sample"),
                  [[i for i in range(N) if brute["seqlen"][i] == v] for v in levels], np.uint16)
    write_indexed(str(tmp_path / "ref_index_to_metric"), [[v] for v in levels], np.uint8)
    for kind, lo, hi, merged in (("value", 6, 40, False), ("percentile", 10, 100, True)):
        ours = CurriculumSampler(curriculum(tmp_path, {"seqlen": metric_block(str(tmp_path / "a/seqlen/seqlen"), kind,
                                                                              lo, hi, merged)}, tmp_path / "c1"),
                                 N, 4, 0, 1, 2)
        ref = CurriculumSampler(curriculum(tmp_path, {"seqlen": metric_block(str(tmp_path / "ref"), kind, lo, hi)},
                                           tmp_path / "c2"), N, 4, 0, 1, 2)
        drawn, want = iter(ours), iter(ref)
        for _ in range(12):
            batch = next(drawn)
            assert batch == next(want)
            if kind == "value":
                assert max(brute["seqlen"][i] for i in batch) <= ours.current_difficulties["seqlen"]


def test_bad_inputs_at_the_sampler_are_one_line_each(data, tmp_path):
    rows, dataset, brute = data
    DataAnalyzer(dataset, batch_size=64, metric_names=["seqlen"], metric_functions=[metrics.seqlen],
                 metric_types=[SINGLE], metric_dtypes=[np.int64], save_path=str(tmp_path),
                 progress=False).run_map_reduce()
    where = "data_efficiency.data_sampling.curriculum_learning.curriculum_metrics.seqlen"
    prefix = str(tmp_path / "seqlen" / "seqlen")
    lines = []
    for block, count in ((metric_block(prefix, "value", 3, 40), N + 7),
                         (metric_block(prefix, "value", -9, 0), N)):
        sampler = None
        with pytest.raises(DataError) as info:
            sampler = CurriculumSampler(curriculum(tmp_path, {"seqlen": block}, tmp_path / "c"), count, 4, 0, 1, 2)
            next(iter(sampler))
        lines.append(str(info.value))
    os.remove(prefix + "_index_to_metric.bin")
    with pytest.raises(DataError) as info:
        CurriculumSampler(curriculum(tmp_path, {"seqlen": metric_block(prefix, "value", 3, 40)}, tmp_path / "c"),
                          N, 4, 0, 1, 2)
    lines.append(str(info.value))
    lo, hi = min(brute["seqlen"]), max(brute["seqlen"])
    assert lines == [
        f"{where}.index_to_sample_path: {prefix}_index_to_sample indexes {N} samples (largest {N - 1}) but the "
        f"training data has {N + 7}: index files made for another dataset? Analyse this data again",
        "data_efficiency.data_sampling.curriculum_learning.curriculum_metrics: no sample lies within the difficulties "
        f"{{'seqlen': -8}} at curriculum step 1: nothing to draw (check min_difficulty against the metric's values; "
        f"seqlen's values run from {lo} to {hi})",
        f"{where}.index_to_metric_path: {prefix}_index_to_metric.bin not found; write the index files with "
        "`zerotrain analyze` (or zerotrain.data_efficiency.DataAnalyzer) on this training data and give the path "
        "without .idx/.bin, e.g. SAVE_PATH/seqlen/seqlen_index_to_sample"]


def test_bad_analyzer_arguments_are_one_line_each(data, tmp_path):
    _, dataset, _ = data
    base = dict(metric_names=["m"], metric_functions=[metrics.seqlen], metric_types=[SINGLE], metric_dtypes=[np.int64],
                save_path=str(tmp_path), progress=False)
    cases = [
        (ConfigError, {"metric_types": ["per_sample"]}, "DataAnalyzer: metric m has type 'per_sample'; use "
         "'single_value_per_sample' or 'accumulate_value_over_samples'"),
        (ConfigError, {"metric_dtypes": [np.float32]}, "DataAnalyzer metric_dtypes (m): float32 is not an index-file "
         "dtype; use one of uint8, int8, int16, int32, int64, uint16, uint32, uint64"),
        (ConfigError, {"worker_id": 2, "num_workers": 2}, "DataAnalyzer: worker_id 2 is not one of the 2 workers "
         "(0 to 1)"),
        (DataError, {"metric_dtypes": [np.int32]}, "DataAnalyzer: metric m's function returned int64 values and "
         "metric_dtypes says int32; make them agree"),
    ]
    for error, change, line in cases:
        with pytest.raises(error) as info:
            DataAnalyzer(dataset, **{**base, **change}).run_map_reduce()
        assert str(info.value) == line
    DataAnalyzer(dataset, **base, num_workers=2, worker_id=0).run_map()
    with pytest.raises(DataError) as info:
        DataAnalyzer(dataset, **base, num_workers=2).run_reduce()
    folder = tmp_path / "m" / "worker1_thread0"
    assert str(info.value) == (f"DataAnalyzer.run_reduce: {folder}/m_sample_to_metric.idx/.bin not found: worker 1 "
                               "thread 0 has not mapped metric m (run run_map with worker_id=1)")


def test_deepspeed_import_path_is_the_analyzer():
    import zerotrain as deepspeed

    assert deepspeed.runtime.data_pipeline.data_sampling.data_analyzer.DataAnalyzer is DataAnalyzer
    from zerotrain.runtime.data_pipeline.data_sampling.data_analyzer import DataAnalyzer as imported

    assert imported is zerotrain.data_efficiency.DataAnalyzer
