"""The sampling curriculum: index files, the sampler against a brute-force reference written
from DeepSpeed's description (row by row, lists, one generator), resume, bad inputs, and the
loader through initialize."""

from __future__ import annotations

import logging
import struct

import numpy as np
import pytest
import torch

import zerotrain
from zerotrain.config import load_config
from zerotrain.data.curriculum_loader import seqlen_reshape, seqlen_truncate
from zerotrain.data.curriculum_sampler import CurriculumSampler
from zerotrain.data.indexed import IndexedFile, write_indexed
from zerotrain.errors import DataError
from zerotrain.features.data_sampling import DataSamplingFeature

N = 60


def values(seed: int, high: int = 10) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, high, N)


def write_metric(folder, name: str, vals: np.ndarray) -> dict:
    """index_to_sample / index_to_metric for one metric, as DeepSpeed's analyzer lays them out."""
    levels = np.unique(vals)
    write_indexed(str(folder / f"{name}_i2s"), [np.nonzero(vals == v)[0] for v in levels], np.uint16)
    write_indexed(str(folder / f"{name}_i2m"), [[v] for v in levels], np.int64)
    return {"index_to_sample_path": str(folder / f"{name}_i2s"), "index_to_metric_path": str(folder / f"{name}_i2m")}


def metric(paths: dict, kind: str, clustering: str, lo: int, hi: int, total: int = 6) -> dict:
    return {**paths, "difficulty_type": kind, "clustering_type": clustering, "min_difficulty": lo,
            "max_difficulty": hi, "schedule_type": "fixed_linear",
            "schedule_config": {"total_curriculum_step": total, "difficulty_step": 1}}


def block(folder, metrics: dict, seed: int = 5, epochs: int = 2):
    return load_config({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3, "data_efficiency": {
        "enabled": True, "seed": seed, "data_sampling": {"enabled": True, "num_epochs": epochs, "curriculum_learning": {
            "enabled": True, "data_cluster_path": str(folder / "clusters"), "curriculum_metrics": metrics}}}},
        world_size=1).data_efficiency


def sampler(de, rank: int = 0, world: int = 1) -> CurriculumSampler:
    return CurriculumSampler(de, N, 2, rank, world, 3, drop_last=False, write_clusters=rank == 0)


# ---- the reference: DeepSpeed's sampler as its description reads, nothing shared -------------
def difficulty(step, lo, hi, total):
    d = int(np.floor(min(step / total, 1.0) * (hi - lo) + lo))
    return min(d, hi)


def reference(specs: dict, vals: dict, seed: int, global_batch: int, batches: int):
    """(global batches, clusters as made) for metrics {name: (kind, clustering, lo, hi, total)}."""
    rng = np.random.default_rng(seed)
    rows = {m: [[i for i in range(N) if vals[m][i] == v] for v in sorted(set(vals[m].tolist()))] for m in specs}
    levels = {m: sorted(set(vals[m].tolist())) for m in specs}

    def pick(m, prev, cur):
        kind, _, _, hi, _ = specs[m]
        if kind == "value":
            return [s for r, v in zip(rows[m], levels[m]) if prev < v <= cur for s in r]
        flat = [s for r in rows[m] for s in r]
        per = len(flat) // hi
        return flat[per * prev: len(flat) if cur == hi else per * cur]

    clusters, made, positions, current, out = [], [], [], {}, []
    for step in range(1, batches + 1):
        prev = {m: current.get(m, float("-inf") if specs[m][0] == "value" else 0) for m in specs}
        nxt = {m: difficulty(step, *specs[m][2:]) for m in specs}
        if nxt != current:
            current = nxt
            scheduled = [m for m in specs if specs[m][1] == "schedule_based"]
            new = None
            if len(scheduled) > 1:
                sets = [set(range(N)) if specs[m][1] != "schedule_based" else
                        set(pick(m, float("-inf") if specs[m][0] == "value" else 0, current[m])) for m in specs]
                new = sorted(set.intersection(*sets) - {s for c in clusters for s in c})
            else:
                new = list(range(N)) if not clusters else None
                for m in scheduled:
                    new = pick(m, prev[m], current[m])
            if new:
                new = np.array(new)
                rng.shuffle(new)
                clusters.append(list(new))
                made.append(sorted(new.tolist()))
                positions.append(0)
        sizes = [len(c) for c in clusters]
        counts = np.bincount(rng.choice(len(clusters), global_batch, replace=True,
                                        p=[x / sum(sizes) for x in sizes]), minlength=len(clusters))
        batch = []
        for i, k in enumerate(counts):
            got = clusters[i][positions[i]:positions[i] + k]
            positions[i] += k
            if len(got) < k:  # ran out: reshuffle the cluster, go on from its top
                rest = k - len(got)
                c = np.array(clusters[i])
                rng.shuffle(c)
                clusters[i] = list(c)
                got = got + clusters[i][:rest]
                positions[i] = rest
            batch += got
        rng.shuffle(batch)
        out.append([int(s) for s in batch])
    return out, made


def global_batches(s: CurriculumSampler, count: int) -> list[list[int]]:
    """The sampler's first `count` global batches (3 micro-batches of 2 each)."""
    it, out = iter(s), []
    for _ in range(count):
        out.append([i for _ in range(3) for i in next(it)])
    return out


CASES = {  # name: {metric: (kind, clustering, lo, hi, total steps)}
    "value-single": {"m": ("value", "single_cluster", 2, 9, 6)},
    "value-scheduled": {"m": ("value", "schedule_based", 2, 9, 6)},
    # percentiles in twentieths: DeepSpeed's step is len // max_difficulty samples (0 for 60 // 100)
    "percentile-single": {"m": ("percentile", "single_cluster", 2, 20, 6)},
    "percentile-scheduled": {"m": ("percentile", "schedule_based", 2, 20, 6)},
    "two-scheduled": {"m": ("value", "schedule_based", 3, 9, 5), "k": ("percentile", "schedule_based", 6, 20, 4)},
}


@pytest.mark.parametrize("case", list(CASES))
def test_batches_and_clusters_match_the_reference(tmp_path, case):
    specs = CASES[case]
    vals = {m: values(seed) for seed, m in enumerate(specs)}
    de = block(tmp_path, {m: metric(write_metric(tmp_path, m, vals[m]), *spec) for m, spec in specs.items()})
    s = sampler(de)
    got = global_batches(s, 14)  # 84 samples: past the schedule's end and into reshuffles
    want, made = reference(specs, vals, 5, 6, 14)
    assert got == want
    assert [sorted(c.tolist()) for c in s.clusters] == made
    # the clusters by their definition: each metric's samples within (previous, current]
    if case == "value-scheduled":
        bounds = [float("-inf"), 3, 4, 5, 6, 7, 9]  # floor(s / 6 * 7 + 2) for steps 1-6
        expect = [sorted(np.nonzero((vals["m"] > a) & (vals["m"] <= b))[0].tolist())
                  for a, b in zip(bounds, bounds[1:])]
        assert made == [c for c in expect if c]
    if case.endswith("single"):
        assert made == [list(range(N))]
    # the cluster files rank 0 writes hold the clusters, in draw order
    files = sorted((tmp_path / "clusters").glob("*.idx"))
    assert len(files) == len(made)
    assert all(IndexedFile(str(f)[:-4])[0].tolist() in [c.tolist() for c in s.clusters] for f in files)


def test_two_ranks_take_their_slices_of_the_same_batches(tmp_path):
    vals = values(0)
    de = block(tmp_path, {"m": metric(write_metric(tmp_path, "m", vals), "value", "schedule_based", 2, 9)})
    one = list(iter(CurriculumSampler(de, N, 4, 0, 1, 3)))[:10]  # the same global batch of 12 in one process
    both = [list(iter(sampler(de, r, 2)))[:10] for r in (0, 1)]
    # world 2: each micro-batch is 4 samples (2 per rank); rank r holds positions [2r, 2r + 2)
    merged = [a + b for a, b in zip(*both)]
    assert [i for b in merged for i in b] == [i for b in one for i in b]


def test_epochs_are_counted_and_the_sampler_stops(tmp_path):
    de = block(tmp_path, {"m": metric(write_metric(tmp_path, "m", values(0)), "value", "single_cluster", 2, 9)},
               epochs=2)
    s = sampler(de)
    batches = list(iter(s))
    assert len(batches) == 2 * N // 2 and s.consumed_samples == 2 * N and s.epoch == 2
    assert list(iter(s)) == []


def test_resume_continues_bit_for_bit(tmp_path):
    vals = values(1)
    de = block(tmp_path, {"m": metric(write_metric(tmp_path, "m", vals), "percentile", "schedule_based", 2, 20)})
    straight = list(iter(sampler(de)))
    first = sampler(de)
    it = iter(first)
    head = [next(it) for _ in range(17)]  # mid global batch, after a reshuffle
    state = torch.load(_saved(tmp_path, first.state_dict()), weights_only=True)
    np.random.seed(0)  # numpy's global generator is not the sampler's
    resumed = sampler(de)
    resumed.load_state_dict(state)
    assert head + list(iter(resumed)) == straight


def _saved(folder, state):
    path = folder / "state.pt"
    torch.save(state, path)
    return path


# ---- bad inputs: one line each -------------------------------------------------------------
def test_bad_inputs_are_one_line_each(tmp_path):
    where = "data_efficiency.data_sampling.curriculum_learning"
    vals = values(0)
    paths = write_metric(tmp_path, "m", vals)
    missing = {**paths, "index_to_sample_path": str(tmp_path / "nope")}
    cases = [
        ({"m": metric(missing, "value", "schedule_based", 2, 9)}, N,
         f"{where}.curriculum_metrics.m.index_to_sample_path: {tmp_path}/nope.idx not found; write the index files "
         "with `zerotrain analyze` (or zerotrain.data_efficiency.DataAnalyzer) on this training data and give the "
         "path without .idx/.bin, e.g. SAVE_PATH/m/m_index_to_sample"),
        ({"m": metric(paths, "value", "schedule_based", 2, 9)}, N + 5,
         f"{where}.curriculum_metrics.m.index_to_sample_path: {paths['index_to_sample_path']} indexes {N} samples "
         f"(largest {N - 1}) but the training data has {N + 5}: index files made for another dataset? Analyse this "
         "data again"),
    ]
    for metrics, count, line in cases:
        with pytest.raises(DataError) as info:
            CurriculumSampler(block(tmp_path, metrics), count, 2, 0, 1, 3)
        assert str(info.value) == line
    s = CurriculumSampler(block(tmp_path, {"m": metric(paths, "value", "schedule_based", -5, -1)}), N, 2, 0, 1, 3)
    with pytest.raises(DataError) as info:
        next(iter(s))
    assert str(info.value) == (f"{where}.curriculum_metrics: no sample lies within the difficulties {{'m': -5}} at "
                               "curriculum step 1: nothing to draw (check min_difficulty against the metric's values; m's "
                               f"values run from {vals.min()} to {vals.max()})")


def test_index_files_in_the_format(tmp_path):
    rows = [np.array([3, 1, 2]), np.array([], dtype=np.int64), np.array([7])]
    write_indexed(str(tmp_path / "x"), rows, np.uint32)
    raw = (tmp_path / "x.idx").read_bytes()  # read by hand, as the format describes it
    assert raw[:9] == b"MMIDIDX\x00\x00" and struct.unpack_from("<QBQQ", raw, 9) == (1, 7, 3, 2)
    sizes = np.frombuffer(raw, np.int32, 3, 34)
    pointers = np.frombuffer(raw, np.int64, 3, 46)
    assert sizes.tolist() == [3, 0, 1] and pointers.tolist() == [0, 12, 12]
    assert np.frombuffer(raw, np.int64, 2, 70).tolist() == [0, 3]
    assert np.frombuffer((tmp_path / "x.bin").read_bytes(), np.uint32).tolist() == [3, 1, 2, 7]
    f = IndexedFile(str(tmp_path / "x"))
    assert [f[i].tolist() for i in range(3)] == [[3, 1, 2], [], [7]] and f.concatenated().tolist() == [3, 1, 2, 7]
    (tmp_path / "y.idx").write_bytes(b"TNTIDX\x00\x00" + bytes(40))
    (tmp_path / "y.bin").write_bytes(b"")
    with pytest.raises(DataError, match=r"^m: .*y\.idx is not an mmap indexed-dataset index"):
        IndexedFile(str(tmp_path / "y"), "m")


# ---- through initialize --------------------------------------------------------------------
def test_initialize_loader_post_process_and_checkpoint(tmp_path):
    vals = values(2)
    paths = write_metric(tmp_path, "seqlen_truncate", vals)
    m = metric(paths, "value", "single_cluster", 2, 8, total=4)
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
           "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "data_efficiency": {
               "enabled": True, "data_sampling": {"enabled": True, "curriculum_learning": {
                   "enabled": True, "data_cluster_path": str(tmp_path / "c"),
                   "curriculum_metrics": {"seqlen_truncate": m}}}}}
    data = [torch.arange(8) + 100 * i for i in range(N)]

    def start():
        engine, _, loader, _ = zerotrain.initialize(model=torch.nn.Linear(1, 1), config=cfg, training_data=data)
        engine.set_data_post_process_func(seqlen_truncate)
        return engine, iter(loader)

    engine, it = start()
    seen = [next(it) for _ in range(3)]
    assert [b.shape[1] for b in seen] == [3, 5, 6]  # fixed_linear 2 -> 8 over 4 steps, cut per batch
    engine.save_checkpoint(tmp_path / "ck")
    rest = [next(it) for _ in range(3)]
    engine, it = start()
    engine.load_checkpoint(tmp_path / "ck")
    assert all(torch.equal(a, b) for a, b in zip(rest, [next(it) for _ in range(3)]))


def test_post_process_built_ins():
    batch = {"input_ids": torch.arange(12).view(2, 6), "mask": torch.ones(2, 6), "n": torch.tensor([1, 2])}
    cut = seqlen_truncate(batch, {"current_difficulties": {"seqlen_truncate": 4}})
    assert cut["input_ids"].tolist() == [[0, 1, 2, 3], [6, 7, 8, 9]] and cut["n"].tolist() == [1, 2]
    shaped = seqlen_reshape(batch, {"current_difficulties": {"seqlen_reshape": 4}})
    assert shaped["input_ids"].tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    with pytest.raises(DataError, match=r"^post-process: the curriculum has no metric named seqlen_reshape"):
        seqlen_reshape(batch, {"current_difficulties": {"vocab": 1}})


def test_custom_schedules_reach_the_sampler(tmp_path):
    m = {**metric(write_metric(tmp_path, "m", values(0)), "value", "schedule_based", 2, 9), "schedule_type": "custom"}
    del m["schedule_config"]
    cfg = {"train_micro_batch_size_per_gpu": 2, "data_efficiency": {"enabled": True, "data_sampling": {
        "enabled": True, "curriculum_learning": {"enabled": True, "data_cluster_path": str(tmp_path / "c"),
                                                 "curriculum_metrics": {"m": m}}}}}
    engine, _, loader, _ = zerotrain.initialize(model=torch.nn.Linear(1, 1), config=cfg,
                                                training_data=[torch.zeros(1)] * N)
    engine.set_custom_curriculum_learning_schedule({"m": lambda step: 4 + step})
    it = iter(loader)
    next(it), next(it)
    sampler = engine.feature(DataSamplingFeature).sampler
    assert sampler.current_difficulties == {"m": 6}
    assert sorted(np.concatenate(sampler.clusters).tolist()) == np.nonzero(values(0) <= 6)[0].tolist()


def test_deepspeed_state_reads_its_cluster_files(tmp_path, caplog):
    de = block(tmp_path, {"m": metric(write_metric(tmp_path, "m", values(3)), "value", "schedule_based", 2, 9)})
    first = sampler(de)
    it = iter(first)
    for _ in range(40):  # into reshuffles, which rewrite the cluster files
        next(it)
    ours = first.state_dict()
    theirs = {k: ours[k] for k in ("batch", "consumed_samples", "curriculum_step", "current_difficulties",
                                   "data_cluster_current_position")}
    theirs["data_cluster_paths"] = [str(tmp_path / "clusters" / n) for n in ours["data_cluster_paths"]]  # absolute
    theirs["np_rng_state"] = np.random.get_state()
    resumed = sampler(de)
    log = logging.getLogger("zerotrain")
    log.addHandler(caplog.handler)  # initialize turns propagation off
    try:
        resumed.load_state_dict(theirs)
    finally:
        log.removeHandler(caplog.handler)
    assert [c.tolist() for c in resumed.clusters] == [c.tolist() for c in first.clusters]
    assert resumed.cluster_names == first.cluster_names and resumed.positions == first.positions
    assert "numpy's global generator state" in caplog.text
