"""GLUE fine-tuning data: the task's files -> checked rows (glue_files.py) -> encoded pairs.

    one sentence    [CLS] a [SEP]                 token_type_ids 0 ... 0
    a pair          [CLS] a [SEP] b [SEP]         token_type_ids 0 ... 0 1 ... 1

A tokenizer with a pair template (BERT's WordPiece, ...) encodes pairs itself; one without
(the byte-level tokenizer) gets that layout from its own specials (cls or bos, sep or eos).
Pairs longer than block_size are cut longest first, as HF's `truncation=True` cuts them.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ...errors import ConfigError
from .glue_files import glue_rows, read_source
from .glue_tasks import get_task, task_folder
from .readers import fingerprint_source

# split -> the suffix HF's run_glue gives its metrics (MNLI mismatched: eval_accuracy_mm)
EXTRA_EVAL = {"validation_mm": "mm"}


def _cut_longest_first(la: int, lb: int, budget: int) -> tuple[int, int]:
    """Lengths after removing tokens one at a time from the longer side (the second on a tie)."""
    excess = la + lb - budget
    if excess <= 0:
        return la, lb
    gap = abs(la - lb)
    if excess <= gap:
        return (la - excess, lb) if la > lb else (la, lb - excess)
    m, rest = min(la, lb), excess - gap
    return m - rest // 2, m - (rest + 1) // 2


def encode_fn(tokenizer, block_size: int, pair: bool):
    """A batched datasets.map function: text_a (, text_b), labels -> input_ids, token_type_ids,
    labels, length."""
    if tokenizer.num_special_tokens_to_add(pair=pair) > 0:
        def encode(batch):
            texts = (batch["text_a"], batch["text_b"]) if pair else (batch["text_a"],)
            enc = tokenizer(*texts, truncation=True, max_length=block_size, return_token_type_ids=True)
            ids = enc["input_ids"]
            return {"input_ids": ids, "token_type_ids": enc["token_type_ids"], "labels": batch["labels"],
                    "length": [len(x) for x in ids]}
        return encode
    cls = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
    sep = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
    if cls is None or sep is None:
        raise ConfigError("GLUE inputs need a start and a separator token: the tokenizer has neither cls/bos nor "
                          "sep/eos; give a tokenizer that has them")
    specials = 3 if pair else 2
    if block_size <= specials:
        raise ConfigError(f"block_size {block_size} leaves no room for text next to {specials} special tokens")

    def encode(batch):
        a_ids = tokenizer(batch["text_a"], add_special_tokens=False)["input_ids"]
        b_ids = tokenizer(batch["text_b"], add_special_tokens=False)["input_ids"] if pair else [[]] * len(a_ids)
        ids, types = [], []
        for a, b in zip(a_ids, b_ids):
            la, lb = _cut_longest_first(len(a), len(b), block_size - specials)
            first = [cls] + a[:la] + [sep]
            second = b[:lb] + [sep] if pair else []
            ids.append(first + second)
            types.append([0] * len(first) + [1] * len(second))
        return {"input_ids": ids, "token_type_ids": types, "labels": batch["labels"],
                "length": [len(x) for x in ids]}
    return encode


def _sources(data_args, need_train: bool) -> dict[str, tuple[str, str]]:
    """split -> (path, what) for this run's files."""
    task = get_task(data_args.task_name)
    if data_args.data_dir:
        folder = task_folder(data_args.data_dir, task, need_train)
        out = {"train": (str(folder / "train.tsv"), "data_dir")} if need_train else {}
        out["validation"] = (str(folder / task.dev_files[0]), "data_dir")
        if len(task.dev_files) > 1:
            out["validation_mm"] = (str(folder / task.dev_files[1]), "data_dir")
        return out
    return {split: (getattr(data_args, name), name) for split, name in
            (("train", "train_file"), ("validation", "validation_file"), ("test", "test_file"))
            if getattr(data_args, name)}


def glue_key(data_args, need_train: bool) -> str:
    """What the tokenized cache of a GLUE run depends on: the task and its files' contents."""
    parts = {"task": get_task(data_args.task_name).name,
             "files": {split: fingerprint_source(path) for split, (path, _) in _sources(data_args, need_train).items()}}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def build_glue(data_args, seed: int, tokenizer, block_size: int, tmp: Path, key: str, need_train: bool,
               process) -> dict:
    """Read, check, encode and save every split under `tmp`; returns the meta record (labels,
    regression, extra eval splits, notes). `process` is prepare's map-and-filter."""
    task = get_task(data_args.task_name)
    tables, notes = {}, []
    for split, (path, what) in _sources(data_args, need_train).items():
        raw, more = read_source(path, what, task)
        notes += more
        tables[split] = glue_rows(raw, task, what, path)
    if "validation" not in tables and "train" in tables and data_args.validation_split_percentage > 0:
        n_eval = int(len(tables["train"]) * data_args.validation_split_percentage / 100)
        if 0 < n_eval < len(tables["train"]):
            parts = tables["train"].train_test_split(test_size=n_eval, seed=seed, shuffle=True)
            tables["train"], tables["validation"] = parts["train"], parts["test"]
    fn = encode_fn(tokenizer, block_size, task.pair)
    for split, rows in tables.items():
        out, _ = process(rows, fn, data_args.preprocessing_num_workers, split, key)
        out.save_to_disk(str(tmp / split))
    return {"labels": list(task.labels) if task.labels else None, "regression": task.labels is None,
            "extra": [s for s in EXTRA_EVAL if s in tables], "notes": notes}
