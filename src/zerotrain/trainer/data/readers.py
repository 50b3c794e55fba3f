"""Reading the user's data files into an HF `datasets.Dataset`, with one clear line per mistake.

    .txt            a row per line (line breaks kept, so concatenated text keeps its lines)
    .jsonl          a row per JSON object
    .json           a list of objects, {"data": [...]}, or {column: [values]}
    .csv / .tsv     a row per record, the header names the columns
    folder          a row per file (hidden files skipped), columns text and file
    saved dataset   a folder written by datasets' save_to_disk (a DatasetDict's splits too)

We read the files ourselves instead of through `datasets.load_dataset`: its errors for a
non-UTF-8 byte or a bad JSON line surface as generation failures deep in a traceback.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from ...errors import DataError

TEXT_SUFFIXES = (".txt", ".jsonl", ".json", ".csv", ".tsv")
_SAVED_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")


def _shown(text: object) -> str:
    """A file or column name as one printable line: names come from the data too (a file in a
    folder, a CSV header), and a newline in one would split the error message."""
    text = str(text)
    return text if text and text.isprintable() else repr(text)


def _decode(path: Path, data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{what} {_shown(path)}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); "
                        "convert the file to UTF-8") from None


def _read_text(path: Path, what: str) -> str:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise DataError(f"{what} {_shown(path)}: cannot read ({e.strerror})") from None
    text = _decode(path, data, what)
    return text[1:] if text.startswith("\ufeff") else text


def _parse_json(text: str, where: str, hint: str = "", line_of_error: bool = False):
    # json raises more than JSONDecodeError on hostile input: RecursionError for nesting
    # deeper than the interpreter's limit, ValueError for an integer of more digits than
    # int() converts (sys.get_int_max_str_digits).
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        at = f":{e.lineno}" if line_of_error else ""
        raise DataError(f"{where}{at}: invalid JSON ({e.msg}){hint}") from None
    except RecursionError:
        raise DataError(f"{where}: invalid JSON (nested too deeply){hint}") from None
    except ValueError as e:
        raise DataError(f"{where}: invalid JSON ({_first_line(e).split(':')[0]}){hint}") from None


def _first_line(err: BaseException) -> str:
    """The first line of an error from a library, or its type when it has no message."""
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__


def is_saved_dataset(path: Path) -> bool:
    return path.is_dir() and any((path / m).is_file() for m in _SAVED_MARKERS)


def _rows_to_columns(rows: list, path: Path, what: str) -> dict[str, list]:
    columns: dict[str, list] = {}
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise DataError(f"{what} {path}: record {i + 1} is {type(row).__name__}, expected a JSON object")
        for key in row:
            columns.setdefault(key, [None] * i)
        for key, values in columns.items():
            values.append(row.get(key))
    return columns


def _jsonl(path: Path, what: str) -> dict[str, list]:
    rows = []
    for n, line in enumerate(_read_text(path, what).splitlines(), 1):
        if not line.strip():
            continue
        rows.append(_parse_json(line, f"{what} {path}:{n}", "; one object per line expected"))
    return _rows_to_columns(rows, path, what)


def _json(path: Path, what: str) -> dict[str, list]:
    data = _parse_json(_read_text(path, what), f"{what} {path}", line_of_error=True)
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if isinstance(data, list):
        return _rows_to_columns(data, path, what)
    if isinstance(data, dict) and data and all(isinstance(v, list) for v in data.values()):
        lengths = {len(v) for v in data.values()}
        if len(lengths) != 1:
            raise DataError(f"{what} {path}: columns have different lengths {sorted(lengths)}")
        return data
    raise DataError(f"{what} {path}: expected a list of objects, {{\"data\": [...]}} or {{column: [values]}}")


def _csv(path: Path, what: str) -> dict[str, list]:
    reader = csv.DictReader(io.StringIO(_read_text(path, what), newline=""),
                            delimiter="\t" if path.suffix == ".tsv" else ",")
    try:
        rows = list(reader)
    except csv.Error as e:
        raise DataError(f"{what} {path}:{max(reader.line_num, 1)}: bad CSV ({e})") from None
    if reader.fieldnames is None:
        return {}
    if any(None in row for row in rows):
        bad = next(i for i, row in enumerate(rows) if None in row)
        raise DataError(f"{what} {path}: record {bad + 1} has more fields than the header")
    return {name: [row[name] for row in rows] for name in reader.fieldnames}


def _txt(path: Path, what: str, column: str) -> dict[str, list]:
    return {column: _read_text(path, what).splitlines(keepends=True)}


def _folder(path: Path, what: str, column: str) -> dict[str, list]:
    files = sorted(p for p in path.rglob("*") if p.is_file()
                   and not any(part.startswith(".") for part in p.relative_to(path).parts))
    return {column: [_read_text(p, what) for p in files], "file": [str(p.relative_to(path)) for p in files]}


def read_table(path_text: str, what: str, text_column: str):
    """The rows of one data source as a Dataset (or DatasetDict for a saved dataset dict).
    Returns (dataset, documents): documents is False for line-per-row .txt files."""
    import datasets

    path = Path(path_text).expanduser()
    if not path.exists():
        raise DataError(f"{what} {path}: does not exist")
    if is_saved_dataset(path):
        try:
            return datasets.load_from_disk(str(path)), True
        except Exception as e:  # a damaged or foreign folder
            raise DataError(f"{what} {path}: cannot load the saved dataset ({_first_line(e)})") from None
    if path.is_dir():
        columns, documents = _folder(path, what, text_column), True
    elif path.suffix == ".txt":
        columns, documents = _txt(path, what, text_column), False
    elif path.suffix == ".jsonl":
        columns, documents = _jsonl(path, what), True
    elif path.suffix == ".json":
        columns, documents = _json(path, what), True
    elif path.suffix in (".csv", ".tsv"):
        columns, documents = _csv(path, what), True
    else:
        raise DataError(f"{what} {path}: unsupported file type {path.suffix or '(none)'}; use "
                        f"{', '.join(TEXT_SUFFIXES)}, a folder of text files or a saved dataset")
    if not columns or not next(iter(columns.values())):
        raise DataError(f"{what} {path}: no rows; the dataset is empty")
    try:
        return datasets.Dataset.from_dict(columns), documents
    except Exception as e:  # mixed types in one column, for example
        raise DataError(f"{what} {path}: cannot build a table ({_first_line(e)})") from None


def require_columns(ds, names: list[str], what: str, path: str) -> None:
    for name in names:
        if name not in ds.column_names:
            columns = ", ".join(map(_shown, ds.column_names))
            raise DataError(f"{what} {path}: no column {name!r}; its columns are {columns}")


def fingerprint_source(path_text: str) -> str:
    """Content identity of a data source for the tokenization cache."""
    import hashlib

    path = Path(path_text).expanduser()
    h = hashlib.sha256()
    if is_saved_dataset(path):
        for marker in ("state.json", "dataset_dict.json"):
            if (path / marker).is_file():
                h.update((path / marker).read_bytes())
        for sub in sorted(path.glob("*/state.json")):
            h.update(sub.read_bytes())
        return h.hexdigest()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for p in files:
        h.update(str(p.relative_to(path) if path.is_dir() else p.name).encode())
        h.update(p.read_bytes())
    return h.hexdigest()
