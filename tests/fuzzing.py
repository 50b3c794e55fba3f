"""Hostile input for the config loader, the data readers and checkpoint loading: hypothesis
strategies and one check per case, shared by the CI fuzz tests (a few hundred cases each)
and `harness/fuzz_inputs.py` (thousands, with a time limit per case).

A check runs one case and returns the project's error it raised, or None when the input
was accepted. Any other exception propagates: that is the bug being hunted. A broken promise
that is not an exception (an empty dataset accepted, a damaged checkpoint loaded, pickled
code run, an error that does not name the file) raises `Violation`.

    import fuzzing                      # tests/ is on sys.path under pytest (tests/conftest.py)
    err = fuzzing.config_case({"train_batch_size": "x"})
    assert fuzzing.one_line(err)
"""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import shutil
from decimal import Decimal
from pathlib import Path

from hypothesis import strategies as st

from zerotrain.errors import CheckpointError, ConfigError, DataError


class Violation(AssertionError):
    """The input was handled without a stray exception, but a promise was still broken."""


def one_line(err: BaseException | None) -> bool:
    """An error a user sees is one non-empty line per problem (None: nothing was raised, nothing
    to show); a config's problems come together, one line each (config/loader.py `collected`)."""
    if err is None:
        return True
    lines = getattr(err, "problems", None) or [str(err)]
    return all(bool(m.strip()) and "\n" not in m and "\r" not in m for m in lines)


# ---- inputs both targets meet: hostile bytes -------------------------------------------------
# A fixed list: hypothesis only picks one, so a large input costs no generation time.
hostile_bytes = st.sampled_from([
    b"", b"\x00" * 64, b"\xef\xbb\xbf", b"\xff\xfe{\x00}\x00", b"\r" * 10, b"\n" * 1000,
    b"a" * 100_000 + b"\n",                                  # a long line
    b'"' + b"a" * 200_000,                                   # longer than csv's field limit
    b"[" * 100_000 + b"]" * 100_000,                         # deeper than any parser recurses
    b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
    b'{"text": ' + b"[" * 900 + b"]" * 900 + b"}",           # deep, but under the recursion limit
    b"1" * 5_000,                                            # more digits than int() reads
    b'{"text": "x", "n": ' + b"9" * 5_000 + b"}",
    b'{"text": 1e999, "label": -1e999}', b'{"text": NaN}', b'{"text": "\\ud800"}',
])

# ---- config ------------------------------------------------------------------------------------
KEYS = ["train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "steps_per_print",
        "gradient_clipping", "fp16", "bf16", "zero_optimization", "optimizer", "scheduler", "enabled", "stage",
        "type", "params", "lr", "loss_scale", "offload_optimizer", "device", "nvme_path", "curriculum_learning",
        "progressive_layer_drop", "theta", "min_difficulty", "schedule_type", "schedule_config", "data_efficiency",
        "token_budget", "train_tokens", "reduce_bucket_size", "stage3_prefetch_bucket_size", "bogus"]

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
                    st.sampled_from(["auto", "cpu", "nvme", "Adam"]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.sampled_from(KEYS), inner, max_size=4)),
                      max_leaves=12)
# JSON-shaped dicts: what a config file can hold.
configs = st.dictionaries(st.sampled_from(KEYS), values, max_size=6)

# What only a Python caller can pass: keys that are not strings, values JSON has no word for,
# nesting deeper than the recursion limit, and a dict that contains itself.
odd_keys = st.sampled_from([0, -1, 1.5, None, True, ("stage",), b"stage", frozenset()])
odd_values = st.sampled_from([b"8", bytearray(b"8"), (1, 2), {1, 2}, frozenset(), 1 + 2j, Decimal("8"),
                              Decimal("NaN"), 10**400, object(), type, print, range(3), Path("/"), ...])


def _nested(depth: int) -> dict:
    config: dict = {"train_batch_size": 1}
    node = config
    for _ in range(depth):
        node["fp16"] = {}
        node = node["fp16"]
    return config


def _cyclic(key: str) -> dict:
    config: dict = {"train_batch_size": 1, key: {}}
    config[key]["enabled"] = config
    return config


python_configs = st.one_of(
    st.dictionaries(st.one_of(st.sampled_from(KEYS), odd_keys), st.one_of(values, odd_values), max_size=4),
    st.dictionaries(st.sampled_from(KEYS), st.dictionaries(odd_keys, values, max_size=2), max_size=3),
    st.integers(1, 5_000).map(_nested),
    st.sampled_from(KEYS).map(_cyclic),
)
config_file_contents = st.one_of(st.binary(max_size=200), st.text(max_size=200), hostile_bytes)


def block(keys: list[str]):
    return st.dictionaries(st.sampled_from(keys), scalars, max_size=len(keys))


# Plausible shapes with wrong values: these get past the unknown-key check and reach the
# per-field validation, the batch triad and the cross-block rules.
plausible = st.fixed_dictionaries({}, optional={
    "train_batch_size": scalars, "train_micro_batch_size_per_gpu": scalars, "gradient_accumulation_steps": scalars,
    "gradient_clipping": scalars, "steps_per_print": scalars, "prescale_gradients": scalars,
    "fp16": block(["enabled", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
                   "min_loss_scale", "consecutive_hysteresis"]),
    "bf16": block(["enabled", "check_grad_overflow"]),
    "zero_optimization": st.one_of(scalars, st.fixed_dictionaries({}, optional={
        "stage": scalars, "reduce_bucket_size": scalars, "overlap_comm": scalars, "cpu_offload": scalars,
        "stage3_param_persistence_threshold": scalars, "sub_group_size": scalars,
        "offload_optimizer": block(["device", "nvme_path", "pin_memory", "buffer_count", "ratio"]),
        "offload_param": block(["device", "nvme_path", "pin_memory"])})),
    "optimizer": block(["type", "params"]), "scheduler": block(["type", "params"]),
    "curriculum_learning": block(["enabled", "curriculum_type", "min_difficulty", "max_difficulty",
                                  "schedule_type", "schedule_config"]),
    "progressive_layer_drop": block(["enabled", "theta", "gamma"]),
    "token_budget": block(["train_tokens", "lr_decay_tokens", "lr_decay_style", "warmup_steps", "min_lr"]),
})


def config_case(config, world_size: int = 1) -> ConfigError | None:
    from zerotrain.config import load_config

    try:
        load_config(config, world_size=world_size)
    except ConfigError as err:
        return err
    return None


def config_file_case(path: Path, content: bytes | str) -> ConfigError | None:
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return config_case(str(path))


# ---- data readers --------------------------------------------------------------------------
READER_SUFFIXES = [".txt", ".jsonl", ".json", ".csv", ".tsv", ".bin"]
COLUMNS = ["text", "label", "x", "", "text "]

json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["text", "label", "x"]), inner,
                                                                         max_size=3)),
    max_leaves=8)
# Header and records with missing, extra and empty fields, stray quotes and the other separator.
csv_field = st.one_of(st.sampled_from(COLUMNS + ['"', '""', "a,b", "a\tb", '"a\nb"', "1", "-2.5", "NaN"]),
                      st.text(max_size=6))
csv_tables = st.lists(st.lists(csv_field, max_size=4), max_size=5).map(
    lambda rows: "\n".join(",".join(r) if i % 2 else "\t".join(r) for i, r in enumerate(rows)).encode())
# Rows of the right shape whose values have the wrong types (a list as text, mixed label types).
records = st.lists(st.fixed_dictionaries({"text": json_values}, optional={"label": json_values, "x": json_values}),
                   min_size=1, max_size=5)
contents = st.one_of(
    st.binary(max_size=300),
    records.map(lambda rows: json.dumps(rows).encode()),
    records.map(lambda rows: "\n".join(json.dumps(r) for r in rows).encode()),
    st.text(max_size=300).map(lambda t: t.encode("utf-8")),
    st.just(b""),
    hostile_bytes,
    csv_tables,
    json_values.map(lambda v: json.dumps(v).encode()),
    st.lists(json_values, max_size=5).map(lambda rows: "\n".join(json.dumps(r) for r in rows).encode()),
)


def _read(path: Path, allow_empty: bool = False) -> DataError | None:
    """What the trainer does with a data source: read it, then ask for its text column."""
    import datasets

    from zerotrain.trainer.data.readers import read_table, require_columns

    try:
        dataset, _ = read_table(str(path), "train_file", "text")
        if isinstance(dataset, datasets.Dataset):
            require_columns(dataset, ["text"], "train_file", str(path))
    except DataError as err:
        return err
    if not allow_empty and len(dataset) == 0:
        raise Violation(f"{path}: an empty dataset was accepted")
    return None


def reader_case(path: Path, content: bytes) -> DataError | None:
    path.write_bytes(content)
    return _read(path)


# A folder is read a row per file, hidden files skipped; a marker file makes it a saved dataset.
folder_names = st.sampled_from(["a.txt", "b.json", "sub/c.csv", ".hidden", "sub/.git/x", "noext", "new\nline",
                                "dataset_info.json", "state.json", "dataset_dict.json"])
folders = st.dictionaries(folder_names, contents, max_size=4)


def folder_case(folder: Path, files: dict[str, bytes]) -> DataError | None:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for name, content in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(content)
    return _read(folder)


# ---- damage to a file: checkpoints and saved datasets --------------------------------------
damages = st.one_of(
    st.tuples(st.just("truncate"), st.floats(0, 1, exclude_max=True)),
    st.tuples(st.just("flip"), st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 7)),
                                        min_size=1, max_size=8)),
    st.tuples(st.just("overwrite"), st.floats(0, 1, exclude_max=True), st.binary(min_size=1, max_size=64)),
    st.tuples(st.just("replace"), st.one_of(st.binary(max_size=300), hostile_bytes)),
    st.just(("delete",)),
)


def damaged(data: bytes, how: tuple) -> bytes | None:
    """The bytes after `how`; None means the file is deleted."""
    kind = how[0]
    if kind == "truncate":
        return data[:int(how[1] * len(data))]
    if kind == "flip":
        out = bytearray(data)
        for where, bit in how[1]:
            if out:
                out[int(where * len(out))] ^= 1 << bit
        return bytes(out)
    if kind == "overwrite":
        start = int(how[1] * len(data))
        return data[:start] + how[2] + data[start + len(how[2]):]
    if kind == "replace":
        return how[1]
    return None


def saved_dataset_case(pristine: Path, work: Path, name: str, how: tuple) -> DataError | None:
    """A folder written by save_to_disk with one file damaged."""
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(pristine, work)
    data = damaged((work / name).read_bytes(), how)
    if data is None:
        (work / name).unlink()
    else:
        (work / name).write_bytes(data)
    return _read(work, allow_empty=True)


# ---- checkpoints ---------------------------------------------------------------------------
CHECKPOINT_FILES = ["model_states.pt", "optim_rank0.pt", "rng_rank0.pt"]  # what an engine writes at world size 1


class RunsCode:
    """Pickles to a call of exec: loading it with plain pickle creates `marker`."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').close()",)


def unsafe_pickle(kind: str, marker: Path) -> bytes:
    """A checkpoint file that runs code when unpickled: bare, in torch's zip, or inside a state."""
    import torch

    if kind == "pickle":
        return pickle.dumps(RunsCode(marker))
    buffer = io.BytesIO()
    torch.save(RunsCode(marker) if kind == "torch" else {"module": {}, "client_state": {"x": RunsCode(marker)}},
               buffer)
    return buffer.getvalue()


# A manifest that parses but lies: sizes and digests of every type (Infinity and NaN too),
# entries that are not objects, names that escape the folder.
manifests = st.fixed_dictionaries({
    "format": st.sampled_from(["zerotrain-checkpoint", "other"]), "version": scalars,
    "files": st.one_of(scalars, st.dictionaries(
        st.sampled_from(CHECKPOINT_FILES + ["../model_states.pt", ".hidden", "manifest.json", ""]),
        st.one_of(scalars, st.fixed_dictionaries({"size": scalars, "sha256": scalars})), max_size=3)),
}).map(lambda m: json.dumps(m).encode())
checkpoint_damages = st.one_of(damages, st.tuples(st.just("replace"), manifests),
                               st.tuples(st.just("payload"), st.sampled_from(["pickle", "torch", "nested"])))


def _rehash(folder: Path, name: str) -> None:
    """Make the manifest agree with the damaged file, as someone who replaced both would."""
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    data = (folder / name).read_bytes()
    manifest["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (folder / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")


def checkpoint_case(load, pristine: Path, work: Path, name: str, how: tuple, marker: Path,
                    rehash: bool = False) -> CheckpointError | None:
    """Copy the save_dir `pristine` to `work`, damage its file `name` (or `latest`) and call
    `load(work)`.

    With `rehash` the manifest is rewritten to match the damage, so it reaches the unpickler;
    otherwise the manifest check must catch it. A damaged data file must be refused with a
    CheckpointError naming it (with `rehash`, only unsafe pickles must be refused: a flipped
    bit inside a tensor still loads), and pickled code must never run.
    """
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(pristine, work)
    tag = (work / "latest").read_text(encoding="utf-8").strip()
    file = work / name if name == "latest" else work / tag / name
    before = file.read_bytes()
    after = unsafe_pickle(how[1], marker) if how[0] == "payload" else damaged(before, how)
    if after is None:
        file.unlink()
    else:
        file.write_bytes(after)
    if rehash and after is not None:
        _rehash(work / tag, name)
    marker.unlink(missing_ok=True)
    err = None
    try:
        load(work)
    except CheckpointError as caught:
        err = caught
    if marker.exists():
        raise Violation(f"pickled code ran while loading a damaged {name}")
    # With the manifest re-hashed, a file that unpickles to the wrong content is refused by
    # whoever reads it (a key the model lacks, say), so only unsafe pickles must be refused
    # by the loader itself, naming the file.
    if name in CHECKPOINT_FILES and after != before and (how[0] == "payload" or not rehash):
        if err is None:
            raise Violation(f"a damaged {name} ({how[0]}) loaded without an error")
        if name not in str(err):
            raise Violation(f"the error does not name {name}: {err}")
    return err
