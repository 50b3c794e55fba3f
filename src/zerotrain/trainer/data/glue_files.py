"""GLUE data files into rows of (sentence, second sentence, label id or score).

GLUE's TSVs are read as GLUE writes them: fields split on tabs only, quote characters kept
literally (SST-2 and MNLI sentences hold stray `"` that CSV quoting would swallow, joining
lines), a header row except in CoLA's train and dev files, and MRPC's byte-order mark. A
row with the wrong number of fields (QQP's distribution has a few) is left out with a note;
a file made mostly of them is not the task's file. Every label is checked against the
task's set, naming the file and line of the first one outside it.
"""

from __future__ import annotations

from pathlib import Path

from ...errors import DataError
from .glue_tasks import COLA_COLUMNS, STSB_RANGE, GlueTask
from .readers import _read_text, _shown, read_table, require_columns


def read_glue_tsv(path, what: str, task: GlueTask):
    """A TSV file as a Dataset of its header's columns (CoLA without a header: COLA_COLUMNS),
    plus a `_line` column (the line each row came from) and notes on rows left out."""
    import datasets

    text = _read_text(Path(path).expanduser(), what)
    lines = text.split("\n")  # not splitlines: \x0b, \x1c or \u2028 inside a sentence is text
    lines = [line[:-1] if line.endswith("\r") else line for line in lines]
    first = lines[0].split("\t") if lines else []
    headerless = task.name == "cola" and "sentence" not in first
    header, start = (list(COLA_COLUMNS), 0) if headerless else (first, 1)
    columns: dict[str, list] = {name: [] for name in header}
    columns["_line"] = []
    bad, first_bad = 0, None
    for n, line in enumerate(lines[start:], start + 1):
        if not line:
            continue
        fields = line.split("\t")
        if len(fields) != len(header):
            bad, first_bad = bad + 1, first_bad or n
            continue
        for name, value in zip(header, fields):
            columns[name].append(value)
        columns["_line"].append(n)
    kept = len(columns["_line"])
    if not kept and not bad:
        raise DataError(f"{what} {_shown(path)}: no rows; the file is empty")
    if bad > max(1, (kept + bad) // 100):
        raise DataError(f"{what} {_shown(path)}: {bad} of {kept + bad} rows do not have the {len(header)} fields of "
                        f"its {'layout' if headerless else 'header'} (first at line {first_bad}); is it "
                        f"{task.folder}'s file?")
    notes = [f"{what} {_shown(path)}: {bad} row{'s' if bad > 1 else ''} without the {len(header)} fields of the "
             f"header left out (first at line {first_bad})"] if bad else []
    return datasets.Dataset.from_dict(columns), notes


def read_source(path: str, what: str, task: GlueTask):
    """Any data file for a GLUE task: TSVs as GLUE writes them, the rest through readers.py."""
    if str(path).endswith(".tsv"):
        return read_glue_tsv(path, what, task)
    ds, _ = read_table(path, what, "text")
    return ds, []


def _pick(names: list[str], options: list, what: str, path: str, role: str):
    for option in options:
        if option is None or isinstance(option, int) or option in names:
            return option
    wanted = " or ".join(repr(o) for o in options if isinstance(o, str))
    raise DataError(f"{what} {path}: no {role} column ({wanted}); its columns are "
                    f"{', '.join(map(_shown, [n for n in names if n != '_line']))}")


def columns_of(ds, task: GlueTask, what: str, path: str) -> tuple:
    """(sentence, second sentence or None, label) column names: the distributed file's, then
    run_glue's convention (the task's own names, then sentence1/sentence2), then `label`."""
    names = list(ds.column_names)
    file_a, file_b, file_label = task.file_columns
    if isinstance(file_a, int):  # CoLA's positions, named by COLA_COLUMNS
        file_a, file_label = COLA_COLUMNS[file_a], COLA_COLUMNS[file_label]
    a = _pick(names, [file_a, task.keys[0], "sentence1", "sentence"], what, path, "sentence")
    b = None
    if task.pair:
        b = _pick(names, [file_b, task.keys[1], "sentence2"], what, path, "second sentence")
    label = _pick(names, [file_label, "label"], what, path, "label")
    require_columns(ds, [c for c in (a, b, label) if c], what, path)
    return a, b, label


def label_value(value, task: GlueTask, where: str):
    """A label as the task's class id (names, "0"/"1", or an integer id) or STS-B's score."""
    if task.labels is None:
        try:
            score = float(value)
        except (TypeError, ValueError):
            raise DataError(f"{where}: label {value!r} is not a number; stsb's labels are similarity scores in "
                            f"[{STSB_RANGE[0]:g}, {STSB_RANGE[1]:g}]") from None
        if not STSB_RANGE[0] <= score <= STSB_RANGE[1]:
            raise DataError(f"{where}: label {value!r} is outside stsb's score range [{STSB_RANGE[0]:g}, "
                            f"{STSB_RANGE[1]:g}]")
        return score
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(task.labels):
        return value
    text = value.strip() if isinstance(value, str) else None
    if text in task.labels:
        return task.labels.index(text)
    hint = " (GLUE test files have no gold labels: -1)" if str(value).strip() == "-1" else ""
    raise DataError(f"{where}: label {value!r} is not one of {task.name}'s labels "
                    f"({', '.join(task.labels)}, or their ids 0-{len(task.labels) - 1}){hint}")


def glue_rows(ds, task: GlueTask, what: str, path: str):
    """A Dataset of text_a, text_b (pairs), label: the task's sentences and checked labels."""
    import datasets

    a, b, label = columns_of(ds, task, what, path)
    lines = ds["_line"] if "_line" in ds.column_names else None
    labels = []
    for i, value in enumerate(ds[label]):
        where = f"{what} {_shown(path)}:{lines[i]}" if lines else f"{what} {_shown(path)} record {i + 1}"
        labels.append(label_value(value, task, where))
    out = {"text_a": ["" if t is None else str(t) for t in ds[a]], "labels": labels}
    if b is not None:
        out["text_b"] = ["" if t is None else str(t) for t in ds[b]]
    features = datasets.Features({**{k: datasets.Value("string") for k in out if k != "labels"},
                                  "labels": datasets.Value("float32" if task.labels is None else "int64")})
    return datasets.Dataset.from_dict(out, features=features)
