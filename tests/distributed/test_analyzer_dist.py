"""The data analyzer over 2 real ranks (gloo): each maps its half with 2 forked threads, rank 0
reduces (from the shared folder, or, DistributedDataAnalyzer, from values sent through the
group); the files equal one process's byte for byte, and a failure on one rank stops both with
a line naming it."""

from __future__ import annotations

import numpy as np

N, VOCAB = 257, 50
SINGLE, ACC = "single_value_per_sample", "accumulate_value_over_samples"


def write_tokens(prefix: str) -> None:
    from zerotrain.data.indexed import write_indexed

    rng = np.random.default_rng(5)
    write_indexed(prefix, [rng.integers(0, VOCAB - 1, rng.integers(1, 30)) for _ in range(N)], np.uint16)


def analyze(tokens: str, save_path: str, num_threads: int = 1) -> list[str]:
    """total_vocab_freq, then seqlen and vocab_rarity, on every rank of the world (or alone)."""
    from zerotrain.data_efficiency import DataAnalyzer, metrics
    from zerotrain.data_efficiency.tokens import IndexedTokens

    ds = IndexedTokens(tokens)
    common = dict(batch_size=16, save_path=save_path, num_threads=num_threads, progress=False)
    DataAnalyzer(ds, metric_names=["total_vocab_freq"], metric_functions=[metrics.total_vocab_freq(VOCAB)],
                 metric_types=[ACC], metric_dtypes=[np.int64], **common).run_map_reduce()
    freq = metrics.read_vocab_freq(save_path)
    analyzer = DataAnalyzer(ds, metric_names=["seqlen", "vocab_rarity"],
                            metric_functions=[metrics.seqlen, metrics.vocab_rarity(freq)],
                            metric_types=[SINGLE] * 2, metric_dtypes=[np.int64] * 2, **common)
    analyzer.run_map_reduce()
    return [analyzer.worker_id, analyzer.num_workers]


def analyze_in_memory(tokens: str, base: str) -> int:
    """DeepSpeed's DistributedDataAnalyzer: each rank its own folder; rank 0's gets the files."""
    import zerotrain.comm as dist
    from zerotrain.data_efficiency import DistributedDataAnalyzer, metrics
    from zerotrain.data_efficiency.tokens import IndexedTokens

    analyzer = DistributedDataAnalyzer(IndexedTokens(tokens), batch_size=16, num_threads=2,
                                       metric_names=["seqlen", "total_vocab_freq"],
                                       metric_functions=[metrics.seqlen, metrics.total_vocab_freq(VOCAB)],
                                       metric_types=[SINGLE, ACC], save_path=f"{base}/rank{dist.get_rank()}",
                                       device="cpu", progress=False)
    analyzer.run_map_reduce()
    return analyzer.num_workers


def failing_on_rank1(tokens: str, save_path: str) -> str:
    from zerotrain.data_efficiency import DataAnalyzer
    from zerotrain.data_efficiency.tokens import IndexedTokens

    import zerotrain.comm as dist

    def metric(batch):
        if dist.get_rank() == 1:
            raise ValueError("bad sample")
        return batch["length"]

    analyzer = DataAnalyzer(IndexedTokens(tokens), metric_names=["m"], metric_functions=[metric],
                            metric_types=[SINGLE], metric_dtypes=[np.int64], save_path=save_path, progress=False)
    try:
        analyzer.run_map_reduce()
    except Exception as e:  # noqa: BLE001  (what each rank raised is the result)
        return f"{type(e).__name__}: {e}"
    return "no error"


def test_two_ranks_write_the_files_one_process_writes(world2, tmp_path):
    tokens = str(tmp_path / "tok")
    write_tokens(tokens)
    ranks = world2.run(analyze, tokens, str(tmp_path / "two"), 2)
    assert ranks == [[0, 2], [1, 2]]  # the world's ranks are the workers
    analyze(tokens, str(tmp_path / "one"))
    names = sorted(p.relative_to(tmp_path / "one") for p in (tmp_path / "one").glob("*/*.*"))
    assert len(names) == 2 + 8 + 8  # metric_value; 4 files of each single-value metric, .idx and .bin
    for name in names:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name

    assert world2.run(analyze_in_memory, tokens, str(tmp_path / "mem")) == [2, 2]
    for name in names:
        if name.parts[0] != "vocab_rarity":
            assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "mem" / "rank0" / name).read_bytes(), name

    failed = world2.run(failing_on_rank1, tokens, str(tmp_path / "bad"))
    assert failed == ["DataError: DataAnalyzer: map failed on worker 1: ValueError: bad sample",
                      "ValueError: bad sample"]
