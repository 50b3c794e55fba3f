"""Data files in every format, tokenization into blocks, the disk cache, and bad data."""

from __future__ import annotations

import json
import os

import pytest
from trainer_helpers import lines, write_text

from zerotrain.comm import Comm, ParallelState
from zerotrain.errors import ConfigError, DataError
from zerotrain.trainer.data import prepare as tdata
from zerotrain.trainer.data.collate import mask_tokens
from zerotrain.trainer.args import DataArguments, ModelArguments
from zerotrain.trainer.data.readers import read_table
from zerotrain.trainer.data.tokenizer import byte_tokenizer

COMM = Comm(ParallelState())


def prepare(tmp_path, train_file, task="clm", positions=128, tokenizer=None, **data):
    data.setdefault("cache_dir", str(tmp_path / "cache"))
    return tdata.prepare(ModelArguments(task=task), DataArguments(train_file=str(train_file), **data), 0,
                         tokenizer or byte_tokenizer(), positions, COMM)


TEXTS = ["alpha beta", "gamma\ndelta", "epsilon"]


@pytest.mark.parametrize("kind", ["txt", "jsonl", "json", "json_data", "json_columns", "csv", "tsv", "folder",
                                  "saved"])
def test_every_format_reads_its_rows(tmp_path, kind):
    import datasets

    path = tmp_path / f"data.{kind.split('_')[0]}"
    if kind == "txt":
        path.write_text("alpha beta\ngamma\n", encoding="utf-8")
        expected = ["alpha beta\n", "gamma\n"]
    elif kind == "jsonl":
        path.write_text("".join(json.dumps({"text": t}) + "\n\n" for t in TEXTS), encoding="utf-8")
        expected = TEXTS
    elif kind.startswith("json"):
        body = {"json": [{"text": t} for t in TEXTS], "json_data": {"data": [{"text": t} for t in TEXTS]},
                "json_columns": {"text": TEXTS}}[kind]
        path.write_text(json.dumps(body), encoding="utf-8")
        expected = TEXTS
    elif kind in ("csv", "tsv"):
        sep = "," if kind == "csv" else "\t"
        path.write_text(f"text{sep}label\n" + "".join(f'"{t}"{sep}1\n' for t in TEXTS), encoding="utf-8")
        expected = TEXTS
    elif kind == "folder":
        path.mkdir()
        for i, t in enumerate(TEXTS):
            (path / f"{i}.py").write_text(t, encoding="utf-8")
        (path / ".hidden").write_text("skip me", encoding="utf-8")
        expected = TEXTS
    else:
        datasets.Dataset.from_dict({"text": TEXTS}).save_to_disk(str(path))
        expected = TEXTS
    ds, _ = read_table(str(path), "train_file", "text")
    assert ds["text"] == expected


@pytest.mark.parametrize("content, message", [
    (b"ok line\n\xff\xfe bad\n", "not UTF-8 text (byte 0xff at offset 8)"),
    (b"", "no rows; the dataset is empty"),
])
def test_bad_text_files(tmp_path, content, message):
    (tmp_path / "t.txt").write_bytes(content)
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace(")", r"\)")):
        prepare(tmp_path, tmp_path / "t.txt")


def test_missing_file_unknown_column_bad_json(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        prepare(tmp_path, tmp_path / "nope.txt")
    (tmp_path / "d.jsonl").write_text('{"body": "x"}\n', encoding="utf-8")
    with pytest.raises(DataError, match="no column 'text'; its columns are body"):
        prepare(tmp_path, tmp_path / "d.jsonl")
    (tmp_path / "e.jsonl").write_text('{"text": "x"}\n{"text": \n', encoding="utf-8")
    with pytest.raises(DataError, match="e.jsonl:2: invalid JSON"):
        prepare(tmp_path, tmp_path / "e.jsonl")
    (tmp_path / "f.parquet").write_bytes(b"x")
    with pytest.raises(DataError, match="unsupported file type .parquet"):
        prepare(tmp_path, tmp_path / "f.parquet")


def test_too_little_text_for_one_block(tmp_path):
    (tmp_path / "t.txt").write_text("tiny\n", encoding="utf-8")
    with pytest.raises(DataError, match="no training samples after tokenization.*lower --block_size"):
        prepare(tmp_path, tmp_path / "t.txt", block_size=64)


def test_block_size_cuts_concatenated_text_and_is_checked_against_positions(tmp_path):
    path = write_text(tmp_path / "t.txt", n=50)
    total = len(path.read_bytes())  # byte tokenizer: one token per byte
    out = prepare(tmp_path, path, block_size=16, validation_split_percentage=0)
    assert all(len(x) == 16 for x in out.train["input_ids"])
    assert len(out.train) == total // 16  # concatenated across lines, remainder dropped
    out = prepare(tmp_path, path, block_size=40, validation_split_percentage=0)
    assert len(out.train) == total // 40
    with pytest.raises(ConfigError, match="block_size 256 is larger than the model's 128 positions"):
        prepare(tmp_path, path, block_size=256, positions=128)
    assert prepare(tmp_path, path, positions=48).block_size == 48  # default: the model's positions


def test_line_by_line_and_validation_split(tmp_path):
    path = write_text(tmp_path / "t.txt", n=40)
    out = prepare(tmp_path, path, block_size=64, line_by_line=True, validation_split_percentage=25)
    assert len(out.train) == 30 and len(out.eval) == 10
    lengths = sorted(out.train["length"])
    assert lengths[0] < lengths[-1] <= 64  # one sequence per line, not blocks
    assert out.train["length"] == [len(x) for x in out.train["input_ids"]]


def test_classification_labels_and_unknown_validation_label(tmp_path):
    (tmp_path / "t.csv").write_text("text,label\nnice,pos\nawful,neg\nfine,pos\n", encoding="utf-8")
    out = prepare(tmp_path, tmp_path / "t.csv", task="classification", validation_split_percentage=0)
    assert out.labels == ["neg", "pos"] and out.train["labels"] == [1, 0, 1]
    (tmp_path / "v.csv").write_text("text,label\nmeh,neutral\n", encoding="utf-8")
    with pytest.raises(DataError, match="labels not seen in training"):
        prepare(tmp_path, tmp_path / "t.csv", task="classification", validation_file=str(tmp_path / "v.csv"))
    with pytest.raises(DataError, match="no column 'stars'"):
        prepare(tmp_path, tmp_path / "t.csv", task="classification", label_column="stars")


def test_max_train_samples(tmp_path):
    path = write_text(tmp_path / "t.txt", n=60)
    out = prepare(tmp_path, path, block_size=16, max_train_samples=7, validation_split_percentage=0)
    assert len(out.train) == 7


def test_cache_is_reused_and_keyed_by_content(tmp_path, monkeypatch):
    path = write_text(tmp_path / "t.txt", n=40)
    prepare(tmp_path, path, block_size=16)
    calls = []
    real = tdata._build
    monkeypatch.setattr(tdata, "_build", lambda *a, **k: (calls.append(1), real(*a, **k)))
    prepare(tmp_path, path, block_size=16)
    assert calls == []  # same data, tokenizer and options: read from disk
    prepare(tmp_path, path, block_size=16, overwrite_cache=True)
    assert calls == [1]
    path.write_text(path.read_text() + "one more line\n", encoding="utf-8")
    prepare(tmp_path, path, block_size=16)
    assert calls == [1, 1]  # the data changed


class PidTokenizer:
    """Records the pid of each process that tokenizes (pickled into datasets' workers)."""

    def __init__(self, inner, log):
        self.inner, self.log = inner, log

    def __getattr__(self, name):
        if name.startswith("__") or name in ("inner", "log"):  # unpickling looks these up first
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __len__(self):
        return len(self.inner)

    def __call__(self, *args, **kwargs):
        with open(self.log, "a") as f:
            f.write(f"{os.getpid()}\n")
        return self.inner(*args, **kwargs)


def test_preprocessing_num_workers_tokenizes_in_parallel_processes(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("".join(line + "\n" for line in lines(4000)), encoding="utf-8")
    log = tmp_path / "pids.txt"
    tok = PidTokenizer(byte_tokenizer(), str(log))
    out = prepare(tmp_path, path, block_size=32, tokenizer=tok, preprocessing_num_workers=2,
                  validation_split_percentage=0)
    pids = set(log.read_text().split())
    assert len(pids) == 2 and str(os.getpid()) not in pids
    log.unlink()
    one = prepare(tmp_path, path, block_size=32, tokenizer=tok, validation_split_percentage=0,
                  overwrite_cache=True)
    assert set(log.read_text().split()) == {str(os.getpid())}
    assert len(one.train) == len(out.train)


def test_mlm_masking_rates(tmp_path):
    import torch

    tok = byte_tokenizer()
    ids = torch.randint(0, 256, (64, 64))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    out = mask_tokens(batch, tok, 0.15, torch.Generator().manual_seed(0))
    picked = out["labels"] != -100
    assert 0.13 < picked.float().mean() < 0.17
    assert torch.equal(out["labels"][picked], ids[picked])
    masked = (out["input_ids"] == tok.mask_token_id) & picked
    assert 0.75 < masked.sum() / picked.sum() < 0.85
    assert torch.equal(out["input_ids"][~picked], ids[~picked])


class SecondNode:
    """Rank 1, local rank 0 of its node, whose disk does not hold rank 0's cache folder."""

    def __init__(self, rank0_cache: str):
        self.rank, self.world_size, self.state = 1, 2, ParallelState(rank=1, world_size=2, local_rank=0)
        self.calls, self.rank0_cache = 0, rank0_cache

    def all_gather_object(self, obj):
        self.calls += 1
        return [("ok", self.rank0_cache), obj] if self.calls == 1 else [None, obj]


def test_a_node_that_cannot_see_rank_0s_cache_tokenizes_for_itself(tmp_path):
    path = write_text(tmp_path / "t.txt", n=40)
    comm = SecondNode(str(tmp_path / "elsewhere" / "abc"))
    out = tdata.prepare(ModelArguments(), DataArguments(train_file=str(path), block_size=16,
                                                        cache_dir=str(tmp_path / "node1")),
                        0, byte_tokenizer(), 128, comm)
    assert len(out.train) > 0 and comm.calls == 2 and any((tmp_path / "node1").iterdir())
