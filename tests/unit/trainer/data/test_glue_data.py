"""GLUE data: every task's folder as GLUE distributes it (tests/glue_layouts.py writes the real
headers and quirks), run_glue's column convention for user files, the pair encoding, and one
clear line for each mistake."""

from __future__ import annotations

import json

import pytest
from glue_layouts import FOLDERS, rows, write_task, write_tsv

from zerotrain.errors import ConfigError, DataError
from zerotrain.trainer.args import build
from zerotrain.trainer.data.glue import _cut_longest_first, encode_fn
from zerotrain.trainer.data.glue_files import glue_rows, read_source
from zerotrain.trainer.data.glue_tasks import TASKS, get_task, task_folder


def _expected_label(task, text):
    t = TASKS[task]
    return float(text) if t.labels is None else t.labels.index(text)


@pytest.mark.parametrize("task", list(TASKS))
def test_every_task_folder_reads_as_distributed(tmp_path, task):
    written = write_task(tmp_path, task, n_train=30, n_dev=12)
    t = get_task(task)
    folder = task_folder(str(tmp_path), t)  # the GLUE root works: the task's folder is found in it
    assert folder.name == FOLDERS[task]
    files = {"train": "train.tsv", "validation": t.dev_files[0]}
    if task == "mnli":
        files["validation_mm"] = "dev_mismatched.tsv"
    assert set(files) == set(written)
    for split, name in files.items():
        raw, notes = read_source(str(folder / name), "data_dir", t)
        got = glue_rows(raw, t, "data_dir", str(folder / name))
        want = written[split]
        assert got["text_a"] == [a for a, _, _ in want]  # quotes kept literally, one row per line
        if t.pair:
            assert got["text_b"] == [b for _, b, _ in want]
        assert got["labels"] == pytest.approx([_expected_label(task, lab) for _, _, lab in want])
        assert bool(notes) == (task == "qqp")  # QQP's short row is left out, and said so
    if task == "cola":
        assert not (folder / "train.tsv").read_text().startswith("sentence")  # no header row
    if task == "mrpc":
        assert (folder / "train.tsv").read_bytes().startswith(b"\xef\xbb\xbf")


def test_quotes_are_text_not_csv_quoting(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_text('sentence\tlabel\n" the film opens\t1\nit is " fine \t0\n"quoted"\t1\n', encoding="utf-8")
    raw, _ = read_source(str(path), "train_file", get_task("sst2"))
    assert glue_rows(raw, get_task("sst2"), "train_file", str(path))["text_a"] == ['" the film opens', 'it is " fine ',
                                                                                 '"quoted"']


def test_user_files_follow_run_glues_columns(tmp_path):
    t = get_task("mnli")
    jsonl = tmp_path / "train.jsonl"  # HF datasets' export: the task's own names, integer labels
    jsonl.write_text("".join(json.dumps({"premise": f"p{i}", "hypothesis": f"h{i}", "label": i % 3, "idx": i}) + "\n"
                             for i in range(6)), encoding="utf-8")
    raw, _ = read_source(str(jsonl), "train_file", t)
    got = glue_rows(raw, t, "train_file", str(jsonl))
    assert got["text_a"][:2] == ["p0", "p1"] and got["text_b"][2] == "h2" and got["labels"] == [0, 1, 2, 0, 1, 2]
    csv = tmp_path / "dev.csv"  # run_glue's generic names, label names as text
    csv.write_text('sentence1,sentence2,label\n"a, b",c,neutral\nd,"e ""f""",contradiction\n', encoding="utf-8")
    raw, _ = read_source(str(csv), "validation_file", t)
    got = glue_rows(raw, t, "validation_file", str(csv))
    assert got["text_a"] == ["a, b", "d"] and got["text_b"] == ["c", 'e "f"'] and got["labels"] == [1, 2]


def test_mistakes_are_one_line_each(tmp_path):
    write_task(tmp_path, "rte", 10, 5)
    base = {"output_dir": str(tmp_path / "out"), "data_dir": str(tmp_path / "RTE"), "model_config": "bert-tiny"}
    with pytest.raises(ConfigError, match=r"task_name 'rtee': not a GLUE task; choose one of .*did you mean rte\?"):
        build({**base, "task_name": "rtee"})
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"empty: no train.tsv or dev.tsv for task rte \(GLUE's RTE folder holds"):
        build({**base, "task_name": "rte", "data_dir": str(tmp_path / "empty")})
    with pytest.raises(DataError, match=r"no dev_matched.tsv or dev_mismatched.tsv for task mnli"):
        build({**base, "task_name": "MNLI"})  # GLUE's upper-case names are accepted
    with pytest.raises(ConfigError, match="data_dir is read with --task_name"):
        build(base)
    with pytest.raises(ConfigError, match="drop --task mlm"):
        build({**base, "task_name": "rte", "task": "mlm"})
    with pytest.raises(ConfigError, match="data_dir and train_file both name the data"):
        build({**base, "task_name": "rte", "train_file": str(tmp_path / "RTE" / "train.tsv")})
    _, data, _ = build({**base, "task_name": "rte"})
    assert data.task_name == "rte"
    t = get_task("rte")
    bad = write_tsv(tmp_path / "bad.tsv", "rte", rows("rte", 4, 0)[:3] + [("x", "y", "maybe")])
    raw, _ = read_source(str(bad), "validation_file", t)
    with pytest.raises(DataError, match=r"bad.tsv:5: label 'maybe' is not one of rte's labels \(entailment, "
                                        r"not_entailment, or their ids 0-1\)"):
        glue_rows(raw, t, "validation_file", str(bad))
    s = get_task("stsb")
    for value, message in (("7.5", "is outside stsb's score range"), ("high", "is not a number")):
        path = write_tsv(tmp_path / "s.tsv", "stsb", [("a", "b", value)])
        with pytest.raises(DataError, match=rf"s.tsv:2: label '{value}' {message}"):
            glue_rows(read_source(str(path), "train_file", s)[0], s, "train_file", str(path))
    test_like = tmp_path / "test.jsonl"
    test_like.write_text(json.dumps({"sentence": "a", "label": -1}) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"record 1: label -1 .*GLUE test files have no gold labels"):
        glue_rows(read_source(str(test_like), "test_file", get_task("sst2"))[0], get_task("sst2"), "test_file", "t")
    broken = tmp_path / "broken.tsv"
    broken.write_text("sentence\tlabel\na\n\nb\nc\t1\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"2 of 3 rows do not have the 2 fields of its header .*SST-2's file"):
        read_source(str(broken), "train_file", get_task("sst2"))


def test_pairs_are_encoded_as_pairs_with_token_types():
    from zerotrain.trainer.data.tokenizer import byte_tokenizer

    tok = byte_tokenizer()
    eos = tok.eos_token_id
    out = encode_fn(tok, 16, pair=True)({"text_a": ["abc", "a" * 20], "text_b": ["de", "b" * 3], "labels": [1, 0]})
    assert out["input_ids"][0] == [eos, *tok("abc")["input_ids"], eos, *tok("de")["input_ids"], eos]
    assert out["token_type_ids"][0] == [0, 0, 0, 0, 0, 1, 1, 1]
    assert len(out["input_ids"][1]) == 16 and out["token_type_ids"][1].count(1) == 4  # b kept whole, a cut
    single = encode_fn(tok, 8, pair=False)({"text_a": ["hello world"], "labels": [0]})
    assert single["input_ids"][0] == [eos, *tok("hello ")["input_ids"], eos] and set(single["token_type_ids"][0]) == {0}


def test_a_tokenizer_with_a_pair_template_encodes_pairs_itself():
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat"])}
    raw = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    raw.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                       special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]")
    out = encode_fn(tok, 32, pair=True)({"text_a": ["the cat"], "text_b": ["sat"], "labels": [0]})
    assert out["input_ids"][0] == [2, 5, 6, 3, 7, 3] and out["token_type_ids"][0] == [0, 0, 0, 0, 1, 1]


def test_longest_first_cut_matches_removing_one_token_at_a_time():
    for la in range(0, 12):
        for lb in range(0, 12):
            for budget in range(0, 14):
                a, b = la, lb
                while a + b > budget:  # HF's rule: drop from the longer, from the second on a tie
                    if a > b:
                        a -= 1
                    else:
                        b -= 1
                assert _cut_longest_first(la, lb, budget) == (a, b), (la, lb, budget)
