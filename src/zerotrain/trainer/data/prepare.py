"""From data files to tokenized train / eval datasets, cached on disk.

    read (readers.py) ─► hold out validation_split_percentage ─► map(tokenize, num_proc=N)
        clm / mlm:        concatenate every row's tokens, cut into block_size chunks
        line_by_line:     one truncated sequence per row
        classification:   one truncated sequence per row + its label id
        sft:              one conversation per row, labels on the assistant's tokens (chat.py),
                          --packing: several per block (packing.py)
        --task_name:      a GLUE task's files, sentence pairs encoded as pairs (glue.py)
    ─► save_to_disk(cache_dir/<key>)   key = hash of the data bytes, the tokenizer and these options

Rank 0 does the work while the others wait, then every rank memory-maps the cached result;
a data error found by rank 0 is handed to every rank, so they all stop with the same line.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import ConfigError, DataError
from .readers import fingerprint_source, read_table, require_columns

CACHE_VERSION = 2


@dataclass
class PreparedData:
    train: object | None  # datasets.Dataset; None when only evaluating from a validation file
    eval: object | None
    labels: list | None  # classification: the label names, index = class id
    block_size: int
    test: object | None = None
    notes: list = field(default_factory=list)  # lines to show once (rows left out, and why)
    extra_eval: dict = field(default_factory=dict)  # metric suffix -> dataset (GLUE MNLI mismatched: "mm")
    regression: bool = False  # one output, MSE (GLUE STS-B)


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "zerotrain" / "datasets"


def resolve_block_size(requested: int | None, max_positions: int | None) -> int:
    if requested is not None and requested < 1:
        raise ConfigError(f"block_size: should be a positive integer, got {requested}")
    if max_positions is None:
        return requested or 1024
    if requested is None:
        return min(1024, max_positions)
    if requested > max_positions:
        raise ConfigError(f"block_size {requested} is larger than the model's {max_positions} positions; "
                          f"use --block_size {max_positions} or less")
    return requested


def _tokenizer_hash(tokenizer) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else json.dumps(tokenizer.get_vocab(), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _split(ds, what: str, path: str):
    """A saved DatasetDict -> (train, validation or None)."""
    import datasets

    if isinstance(ds, datasets.DatasetDict):
        if "train" not in ds:
            raise DataError(f"{what} {path}: the saved dataset has splits {', '.join(ds)}, none named train")
        return ds["train"], ds.get("validation") or ds.get("test")
    return ds, None


def _label_ids(train, label_column: str, path: str) -> list:
    values = train[label_column]
    if any(v is None or (isinstance(v, str) and not v.strip()) for v in values):
        raise DataError(f"train_file {path}: empty value in label column {label_column!r}")
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        if min(values) < 0:
            raise DataError(f"train_file {path}: integer labels should be >= 0, got {min(values)}")
        return list(range(max(values) + 1))
    return sorted({str(v) for v in values})


def _tokenize_fn(tokenizer, task: str, text_column: str, label_column: str, block_size: int, line_by_line: bool,
                 documents: bool, label_index: dict | None):
    eos = tokenizer.eos_token_id
    add_eos = documents and eos is not None and task == "clm"

    def tokenize(batch):
        texts = ["" if t is None else str(t) for t in batch[text_column]]
        if task == "classification" or line_by_line:
            keep = [i for i, t in enumerate(texts) if t.strip()] if line_by_line else range(len(texts))
            ids = tokenizer([texts[i].rstrip("\n") for i in keep], truncation=True, max_length=block_size)["input_ids"]
            out = {"input_ids": ids, "length": [len(x) for x in ids]}
            if task == "classification":
                out["labels"] = [label_index[str(v) if not isinstance(v, int) else v] for v in batch[label_column]]
            return out
        ids = tokenizer(texts)["input_ids"]
        flat = [t for row in ids for t in (row + [eos] if add_eos else row)]
        n = len(flat) // block_size * block_size
        blocks = [flat[i: i + block_size] for i in range(0, n, block_size)]
        return {"input_ids": blocks, "length": [block_size] * len(blocks)}

    return tokenize


def _process(ds, fn, workers: int | None, what: str, key: str, with_indices: bool = False):
    """Tokenized rows, and how many came out empty (dropped)."""
    # Concatenation happens within each map batch, so large batches keep few tail tokens.
    # Our cache key names the result, so datasets need not hash the tokenizer closure.
    out = ds.map(fn, batched=True, batch_size=2000, num_proc=workers if workers and workers > 1 else None,
                 with_indices=with_indices, remove_columns=ds.column_names, desc=f"tokenizing {what}",
                 new_fingerprint=f"{key}-{what}")
    if not len(out):
        return out, 0
    kept = out.filter(lambda n: n > 0, input_columns="length", new_fingerprint=f"{key}-{what}-nonempty")
    return kept, len(out) - len(kept)


def _check_text(ds, column: str, what: str, path: str) -> None:
    """A column read as text must hold text: a list of messages would train on its repr."""
    import datasets

    feature = ds.features[column]
    if isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string", "null"):
        return
    kind = f"{feature.dtype} values" if isinstance(feature, datasets.Value) else \
        f"{type(feature).__name__.lower()} values ({feature})"
    hint = "; conversations train with --task sft" if not isinstance(feature, datasets.Value) else ""
    raise DataError(f"{what} {path}: column {column!r} holds {kind[:120]}, not text{hint}")


ROW = "zerotrain_row"  # sft: a row's place in its file, for errors naming it after the split shuffled


def _numbered(ds, numbered: bool):
    return ds.add_column(ROW, list(range(len(ds)))) if numbered and ds is not None and ROW not in ds.column_names else ds


def _read_sources(data_args, seed: int, numbered: bool = False):
    """(train, validation, test) tables (None when absent) and whether rows are documents (not
    lines of a .txt file): the training file's answer, which every split follows."""
    train = held = test = None
    documents = True
    if data_args.train_file:
        train, documents = read_table(data_args.train_file, "train_file", data_args.text_column)
        train, held = _split(train, "train_file", data_args.train_file)
        train, held = _numbered(train, numbered), _numbered(held, numbered)
    if data_args.validation_file:
        held, held_documents = read_table(data_args.validation_file, "validation_file", data_args.text_column)
        held, _ = _split(held, "validation_file", data_args.validation_file)
        held = _numbered(held, numbered)
        documents = documents if train is not None else held_documents
    elif held is None and train is not None and data_args.validation_split_percentage > 0:
        n_eval = int(len(train) * data_args.validation_split_percentage / 100)
        if n_eval > 0 and len(train) - n_eval > 0:
            parts = train.train_test_split(test_size=n_eval, seed=seed, shuffle=True)
            train, held = parts["train"], parts["test"]
    if data_args.test_file:
        test, _ = _split(read_table(data_args.test_file, "test_file", data_args.text_column)[0],
                         "test_file", data_args.test_file)
        test = _numbered(test, numbered)
    return {"train": train, "validation": held, "test": test}, documents


_WHAT = {"train": "train_file", "validation": "validation_file", "test": "test_file"}


def _publish(tmp: Path, target: Path, meta: dict) -> None:
    (tmp / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)


def _build(model_args, data_args, seed: int, tokenizer, block_size: int, target: Path, key: str,
           need_train: bool = True) -> None:
    import datasets

    from .chat import detect_format, sft_tokenize_fn
    from .packing import pack

    datasets.disable_progress_bars()
    task = model_args.task
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    if data_args.task_name:
        from .glue import build_glue

        meta = build_glue(data_args, seed, tokenizer, block_size, tmp, key, need_train, _process)
        return _publish(tmp, target, {**meta, "block_size": block_size})
    tables, documents = _read_sources(data_args, seed, numbered=task == "sft")
    path_of = {split: getattr(data_args, _WHAT[split]) or data_args.train_file for split in tables}
    formats = {}
    for split, ds in tables.items():
        if ds is None:
            continue
        if task == "sft":
            columns = [c for c in ds.column_names if c != ROW]
            formats[split] = detect_format(columns, data_args.sft_format, _WHAT[split], path_of[split])
            continue
        needed = [data_args.text_column] + ([data_args.label_column] if task == "classification" else [])
        require_columns(ds, needed, _WHAT[split], path_of[split])
        _check_text(ds, data_args.text_column, _WHAT[split], path_of[split])
    labels = None
    if task == "classification":
        source = "train" if tables["train"] is not None else "validation"
        labels = _label_ids(tables[source], data_args.label_column, path_of[source])
        for split in ("validation", "test"):
            if tables[split] is not None and source != split:
                seen = {str(v) if not isinstance(v, int) else v for v in tables[split][data_args.label_column]}
                if seen - set(labels):
                    raise DataError(f"{_WHAT[split]} {path_of[split]}: labels not seen in training: "
                                    f"{sorted(map(str, seen - set(labels)))[:5]}")
    index = {v: i for i, v in enumerate(labels)} if labels is not None else None
    workers = data_args.preprocessing_num_workers
    dropped = {}
    for split, ds in tables.items():
        if ds is None:
            continue
        if task == "sft":
            fn = sft_tokenize_fn(tokenizer, formats[split], data_args.chat_template, data_args.train_on_prompt,
                                 block_size, _WHAT[split], path_of[split])
            out, dropped[split] = _process(ds, fn, workers, split, key, with_indices=True)
            if data_args.packing and len(out):
                out = out.map(pack, batched=True, batch_size=2000, fn_kwargs={"block_size": block_size},
                              remove_columns=out.column_names, new_fingerprint=f"{key}-{split}-packed")
        else:
            fn = _tokenize_fn(tokenizer, task, data_args.text_column, data_args.label_column, block_size,
                              data_args.line_by_line, documents, index)
            out, _ = _process(ds, fn, workers, split, key)
        if split == "train" and len(out) == 0:
            unit = ("conversation with an assistant token within block_size" if task == "sft" else
                    "chunk of block_size tokens" if task != "classification" and not data_args.line_by_line
                    else "text")
            raise DataError(f"train_file {data_args.train_file}: no training samples after tokenization (not one "
                            f"{unit}); add data or {'raise' if task == 'sft' else 'lower'} --block_size")
        if len(out):
            out.save_to_disk(str(tmp / split))
    _publish(tmp, target, {"labels": labels, "block_size": block_size, "dropped": dropped})


def cache_key(model_args, data_args, seed: int, tokenizer, block_size: int, need_train: bool = True) -> str:
    from .chat import template_text

    source = lambda name: fingerprint_source(getattr(data_args, name)) if getattr(data_args, name) else None  # noqa: E731
    parts = {"v": CACHE_VERSION, "task": model_args.task, "block": block_size, "lbl": data_args.line_by_line,
             "text": data_args.text_column, "label": data_args.label_column, "seed": seed,
             "split": data_args.validation_split_percentage, "tok": _tokenizer_hash(tokenizer),
             "train": source("train_file"), "val": source("validation_file"), "test": source("test_file")}
    if data_args.task_name:
        from .glue import glue_key

        parts.update(glue=glue_key(data_args, need_train))
    if model_args.task == "sft":
        template = template_text(data_args.chat_template) or getattr(tokenizer, "chat_template", None)
        parts.update(fmt=data_args.sft_format, template=template, prompt=data_args.train_on_prompt,
                     packing=data_args.packing)
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


def prepare(model_args, data_args, seed: int, tokenizer, max_positions: int | None, comm,
            need_train: bool = True) -> PreparedData:
    """Tokenized datasets for this run; every rank returns the same (memory-mapped) data.
    `need_train` false (evaluating only) lets a GLUE folder go without train.tsv."""
    import datasets

    if not (data_args.train_file or data_args.validation_file or data_args.test_file or data_args.data_dir):
        raise ConfigError("train_file is required: pass --train_file PATH")
    block_size = resolve_block_size(data_args.block_size, max_positions)
    cache = Path(data_args.cache_dir).expanduser() if data_args.cache_dir else default_cache_dir()
    def build(overwrite: bool):
        """("ok", cache folder) or (error class, message)."""
        try:
            for name in _WHAT.values():
                value = getattr(data_args, name)
                if value and not Path(value).expanduser().exists():
                    raise DataError(f"{name} {value}: does not exist")
            key = cache_key(model_args, data_args, seed, tokenizer, block_size, need_train)
            target = cache / key
            if overwrite or not (target / "meta.json").is_file():
                cache.mkdir(parents=True, exist_ok=True)
                _build(model_args, data_args, seed, tokenizer, block_size, target, key, need_train)
            return "ok", str(target)
        except (DataError, ConfigError) as e:
            return type(e).__name__, str(e)

    kind, text = comm.all_gather_object(build(data_args.overwrite_cache) if comm.rank == 0 else None)[0]
    if kind == "ok" and comm.world_size > 1:
        # a node that cannot see rank 0's cache (node-local disks) tokenizes again for itself
        mine = None
        if comm.state.local_rank == 0 and comm.rank != 0 and not (Path(text) / "meta.json").is_file():
            mine = build(False)
        answers = comm.all_gather_object(mine)
        kind, text = answers[comm.rank - comm.state.local_rank] or (kind, text)
        kind, text = next((a for a in answers if a is not None and a[0] != "ok"), (kind, text))
    if kind != "ok":
        raise (DataError if kind == "DataError" else ConfigError)(text)
    target = Path(text)
    meta = json.loads((target / "meta.json").read_text(encoding="utf-8"))
    loaded = {split: datasets.load_from_disk(str(target / split)) if (target / split).is_dir() else None
              for split in _WHAT}
    for split, limit in (("train", data_args.max_train_samples), ("validation", data_args.max_eval_samples)):
        if loaded[split] is not None and limit is not None:
            loaded[split] = loaded[split].select(range(min(limit, len(loaded[split]))))
    notes = [f"{_WHAT[split]}: {n} conversation{'s' if n > 1 else ''} left out: no assistant token within "
             f"block_size {block_size}" for split, n in meta.get("dropped", {}).items() if n] + meta.get("notes", [])
    from .glue import EXTRA_EVAL

    extra = {EXTRA_EVAL[split]: datasets.load_from_disk(str(target / split)) for split in meta.get("extra", [])}
    return PreparedData(loaded["train"], loaded["validation"], meta["labels"], block_size, loaded["test"], notes,
                        extra, meta.get("regression", False))
