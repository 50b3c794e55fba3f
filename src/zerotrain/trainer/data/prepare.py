"""From data files to tokenized train / eval datasets, cached on disk.

    read (readers.py) ─► hold out validation_split_percentage ─► map(tokenize, num_proc=N)
        clm / mlm:        concatenate every row's tokens, cut into block_size chunks
        line_by_line:     one truncated sequence per row
        classification:   one truncated sequence per row + its label id
    ─► save_to_disk(cache_dir/<key>)   key = hash of the data bytes, the tokenizer and these options

Rank 0 does the work while the others wait, then every rank memory-maps the cached result;
a data error found by rank 0 is handed to every rank, so they all stop with the same line.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from ...errors import ConfigError, DataError
from .readers import fingerprint_source, read_table, require_columns

CACHE_VERSION = 1


@dataclass
class PreparedData:
    train: object  # datasets.Dataset
    eval: object | None
    labels: list | None  # classification: the label names, index = class id
    block_size: int


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


def _process(ds, fn, workers: int | None, what: str, key: str):
    # Concatenation happens within each map batch, so large batches keep few tail tokens.
    # Our cache key names the result, so datasets need not hash the tokenizer closure.
    out = ds.map(fn, batched=True, batch_size=2000, num_proc=workers if workers and workers > 1 else None,
                 remove_columns=ds.column_names, desc=f"tokenizing {what}", new_fingerprint=f"{key}-{what}")
    if not len(out):
        return out
    return out.filter(lambda n: n > 0, input_columns="length", new_fingerprint=f"{key}-{what}-nonempty")


def _build(model_args, data_args, seed: int, tokenizer, block_size: int, target: Path, key: str) -> None:
    import datasets

    datasets.disable_progress_bars()
    task = model_args.task
    train, documents = read_table(data_args.train_file, "train_file", data_args.text_column)
    train, held = _split(train, "train_file", data_args.train_file)
    needed = [data_args.text_column] + ([data_args.label_column] if task == "classification" else [])
    require_columns(train, needed, "train_file", data_args.train_file)
    if data_args.validation_file:
        held, _ = _split(read_table(data_args.validation_file, "validation_file", data_args.text_column)[0],
                         "validation_file", data_args.validation_file)
        require_columns(held, needed, "validation_file", data_args.validation_file)
    elif held is None and data_args.validation_split_percentage > 0:
        n_eval = int(len(train) * data_args.validation_split_percentage / 100)
        if n_eval > 0 and len(train) - n_eval > 0:
            parts = train.train_test_split(test_size=n_eval, seed=seed, shuffle=True)
            train, held = parts["train"], parts["test"]
    labels = None
    if task == "classification":
        labels = _label_ids(train, data_args.label_column, data_args.train_file)
        if held is not None:
            unknown = {str(v) if not isinstance(v, int) else v for v in held[data_args.label_column]} - set(labels)
            if unknown:
                raise DataError(f"validation data has labels not seen in training: {sorted(map(str, unknown))[:5]}")
    index = {v: i for i, v in enumerate(labels)} if labels is not None else None
    fn = _tokenize_fn(tokenizer, task, data_args.text_column, data_args.label_column, block_size,
                      data_args.line_by_line, documents, index)
    workers = data_args.preprocessing_num_workers
    train = _process(train, fn, workers, "train", key)
    if len(train) == 0:
        unit = "chunk of block_size tokens" if task != "classification" and not data_args.line_by_line else "text"
        raise DataError(f"train_file {data_args.train_file}: no training samples after tokenization (not one "
                        f"{unit}); add data or lower --block_size")
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    train.save_to_disk(str(tmp / "train"))
    if held is not None:
        held = _process(held, fn, workers, "validation", key)
        if len(held):
            held.save_to_disk(str(tmp / "validation"))
    (tmp / "meta.json").write_text(json.dumps({"labels": labels, "block_size": block_size}), encoding="utf-8")
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)


def cache_key(model_args, data_args, seed: int, tokenizer, block_size: int) -> str:
    parts = {"v": CACHE_VERSION, "task": model_args.task, "block": block_size, "lbl": data_args.line_by_line,
             "text": data_args.text_column, "label": data_args.label_column, "seed": seed,
             "split": data_args.validation_split_percentage, "tok": _tokenizer_hash(tokenizer),
             "train": fingerprint_source(data_args.train_file),
             "val": fingerprint_source(data_args.validation_file) if data_args.validation_file else None}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


def prepare(model_args, data_args, seed: int, tokenizer, max_positions: int | None, comm) -> PreparedData:
    """Tokenized datasets for this run; every rank returns the same (memory-mapped) data."""
    import datasets

    if not data_args.train_file:
        raise ConfigError("train_file is required: pass --train_file PATH")
    block_size = resolve_block_size(data_args.block_size, max_positions)
    cache = Path(data_args.cache_dir).expanduser() if data_args.cache_dir else default_cache_dir()
    answer = None  # rank 0: ("ok", cache folder) or (error class, message)
    if comm.rank == 0:
        try:
            for name in ("train_file", "validation_file"):
                value = getattr(data_args, name)
                if value and not Path(value).expanduser().exists():
                    raise DataError(f"{name} {value}: does not exist")
            key = cache_key(model_args, data_args, seed, tokenizer, block_size)
            target = cache / key
            if data_args.overwrite_cache or not (target / "meta.json").is_file():
                cache.mkdir(parents=True, exist_ok=True)
                _build(model_args, data_args, seed, tokenizer, block_size, target, key)
            answer = ("ok", str(target))
        except (DataError, ConfigError) as e:
            answer = (type(e).__name__, str(e))
    kind, text = comm.all_gather_object(answer)[0]
    if kind != "ok":
        raise (DataError if kind == "DataError" else ConfigError)(text)
    target = Path(text)
    meta = json.loads((target / "meta.json").read_text(encoding="utf-8"))
    train = datasets.load_from_disk(str(target / "train"))
    held = datasets.load_from_disk(str(target / "validation")) if (target / "validation").is_dir() else None
    if data_args.max_train_samples is not None:
        train = train.select(range(min(data_args.max_train_samples, len(train))))
    if held is not None and data_args.max_eval_samples is not None:
        held = held.select(range(min(data_args.max_eval_samples, len(held))))
    return PreparedData(train, held, meta["labels"], block_size)
