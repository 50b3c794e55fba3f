"""`zerotrain analyze` on a tiny text file: the training set `zerotrain train` would build (the
built-in byte tokenizer, one sample per line), its seqlen and vocab_rarity files against a
brute force over the lines' bytes, and its option mistakes as one line."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from mmap_reader import expected_files, read_mmap
from zerotrain.cli import main

BLOCK = 24
SPECIALS = 3  # the byte tokenizer's <|endoftext|> <|pad|> <|mask|>: never in the text, counted once each


def test_analyze_writes_the_metrics_of_the_training_lines(tmp_path, capsys):
    lines = [("ab" * (i % 7) + "xyz"[i % 3] * (i % 5) + "q" * (i % 11)).strip() or "z" for i in range(60)]
    lines[5] = "a much longer line than the block size, cut by truncation"
    (tmp_path / "train.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "run.yaml").write_text("learning_rate: 0.5\nlora_rank: 4\nseed: 3\n", encoding="utf-8")
    out = tmp_path / "analysis"
    code = main(["analyze", str(tmp_path / "run.yaml"), "--train_file", str(tmp_path / "train.txt"), "--line_by_line",
                 "--block_size", str(BLOCK), "--validation_split_percentage", "0", "--save_path", str(out),
                 "--cache_dir", str(tmp_path / "cache"), "--batch_size", "8"])
    assert code == 0
    printed = capsys.readouterr().out
    assert ("zerotrain: notice: learning_rate, lora_rank: no effect on the analysis (only the data, tokenizer and "
            "seed options decide the training set)") in printed
    assert f"analyzed {len(lines)} training samples" in printed

    samples = [line.encode()[:BLOCK] for line in lines]
    counts = Counter(b for s in samples for b in s)
    total = sum(max(counts.get(b, 0), 1) for b in range(256)) + SPECIALS
    rarity = [int(sum(-math.log(counts[b] / total) for b in s)) for s in samples]
    for name, values in (("seqlen", [len(s) for s in samples]), ("vocab_rarity", rarity)):
        for suffix, (dtype, rows) in expected_files(values).items():
            assert read_mmap(str(out / name / f"{name}_{suffix}")) == (dtype, rows), (name, suffix)
        assert f"index_to_metric_path {out}/{name}/{name}_index_to_metric" in printed
    _, freq = read_mmap(str(out / "total_vocab_freq" / "total_vocab_freq_metric_value"))
    assert sorted(freq[0]) == sorted([counts.get(b, 0) for b in range(256)] + [0] * SPECIALS)


def test_option_mistakes_are_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["analyze", "--train_file", "x.txt", "--save_path", str(tmp_path), "--metrics", "rarity"])
    assert "invalid choice: 'rarity'" in capsys.readouterr().err
    assert main(["analyze", "--train_file", str(tmp_path / "none.txt"), "--save_path", str(tmp_path / "a"),
                 "--cache_dir", str(tmp_path / "cache")]) == 2
    assert capsys.readouterr().err.strip() == f"zerotrain: error: train_file {tmp_path}/none.txt: does not exist"
    (tmp_path / "typo.yaml").write_text("lerning_rate: 0.5\n", encoding="utf-8")
    assert main(["analyze", str(tmp_path / "typo.yaml"), "--train_file", "x", "--save_path", str(tmp_path / "a")]) == 2
    assert "zerotrain: error: lerning_rate: unknown option" in capsys.readouterr().err
