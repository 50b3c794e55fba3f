"""Turn a DeepSpeed-style JSON config into a validated `ZeroTrainConfig`.

Order of work: read (reader.py, the one reader) -> set comment keys aside -> unknown keys
(a typo is reported as one, with a did-you-mean, even when its value is "auto") -> fill
"auto" (auto.py, the one filler) -> pydantic -> batch triad (batch.py; needs the world size).
Every problem is one line that names the dotted key, so users never see a pydantic
traceback; the problems of one file are collected and raised together in one `ConfigError`
(every unknown key, every bad value and the batch triad), not one per run.
"""

from __future__ import annotations

import difflib
import json
import os
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

from ..errors import ConfigError, did_you_mean
from .auto import fill_auto
from .batch import TRIAD as _TRIAD
from .batch import resolve_batch_sizes
from .base import NO_EFFECT, field_class
from .reader import read_config
from .schema import FieldProblem, ZeroTrainConfig, spellings, valid_keys
from ..parallel.tensor.config import TensorParallelConfig

_SHORT_REASONS = {
    "missing": "is missing",
    "model_type": "should be a JSON object",
    "model_attributes_type": "should be a JSON object",
    "dict_type": "should be a JSON object",
    "int_type": "should be an integer",
    "int_parsing": "should be an integer",
    "int_from_float": "should be a whole number",
    "float_type": "should be a number",
    "float_parsing": "should be a number",
    "bool_type": "should be true or false",
    "bool_parsing": "should be true or false",
    "string_type": "should be a string",
    "list_type": "should be a list",
}
# Top-level keys whose contents nothing reads: "auto" inside them is left alone.
_OPAQUE = tuple(name for name, info in ZeroTrainConfig.model_fields.items()
                if field_class(info).get("effect") == NO_EFFECT and info.annotation is Any)


def load_config(
    config: dict | str | os.PathLike,
    world_size: int = 1,
    auto_values: dict[str, object] | None = None,
) -> ZeroTrainConfig:
    """Validate `config` (a dict, a JSON/hjson file path or a JSON string) for a data-parallel
    world of `world_size`. `auto_values` fills "auto" at dotted paths (what the trainer knows)."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(f"world_size should be a positive integer, got {world_size!r}")
    raw = read_config(config)
    comments: list[str] = []
    data = _without_comments(raw, "", comments)
    unknown = _unknown_keys(data, ZeroTrainConfig, ())
    problems = [line for _, line in unknown]
    data = _without(data, [loc for loc, _ in unknown])
    autos: dict[str, str] = {}
    try:
        data = fill_auto(data, auto_values, sources=autos, opaque=_OPAQUE)  # new containers; raw stays as given
    except ConfigError as err:
        raise collected(problems + [str(err)]) from None
    cfg = None
    try:
        cfg = ZeroTrainConfig.model_validate(data)
    except ValidationError as exc:
        problems += _explain_all(exc.errors(), _misspelt(unknown))
    given = [data.get(name) for name in _TRIAD] if cfg is None else [getattr(cfg, name) for name in _TRIAD]
    triad = None
    if all(v is None or isinstance(v, int) and not isinstance(v, bool) for v in given):  # else named above
        try:
            triad = resolve_batch_sizes(*given, world_size)
        except ConfigError as err:
            problems.append(str(err))
    if problems:
        raise collected(problems)
    for name, value in zip(_TRIAD, triad):
        if name in cfg.given:
            setattr(cfg, name, value)
        else:
            cfg.settle(name, value, f"derived: train_batch_size = micro batch x accumulation x world size {world_size}")
    cfg._raw, cfg._comments, cfg._autos = raw, comments, autos
    return cfg


def collected(problems: list[str]) -> ConfigError:
    """One error for all the problems of a config: the line itself when there is one, else a
    count and one indented line each. `problems` stays on the error for callers that sort
    them (`zerotrain config` sets refused keys aside)."""
    text = problems[0] if len(problems) == 1 else \
        f"{len(problems)} problems in the DeepSpeed config:\n" + "\n".join(f"  {p}" for p in problems)
    err = ConfigError(text)
    err.problems = list(problems)
    return err


def problems_of(err: ConfigError) -> list[str]:
    """The lines of a ConfigError: those `collected` kept, else its one message."""
    return list(getattr(err, "problems", None) or [str(err)])


def tensor_parallel_size(config: dict | str | os.PathLike) -> int:
    """The tensor-parallel size a config asks for, read before the rest: the ranks are laid
    out (and the data-parallel world the batch sizes count is known) only once it is. A block
    that does not validate gives 1 here; load_config then names what is wrong with it."""
    raw = read_config(config)
    block = raw.get("tensor_parallel") if isinstance(raw, dict) else None
    if not isinstance(block, dict):
        return 1
    try:
        return TensorParallelConfig.model_validate(_without_comments(block, "tensor_parallel", [])).size
    except (ValidationError, ValueError):
        return 1


def check_keys(config: dict) -> None:
    """Raise the ConfigError load_config would raise for the unknown keys (all of them)."""
    lines = unknown_keys(config)
    if lines:
        raise collected(lines)


def unknown_keys(config: dict) -> list[str]:
    """One line per unknown key of `config`, with a did-you-mean."""
    return [line for _, line in _unknown_keys(_without_comments(config, "", []), ZeroTrainConfig, ())]


def _without_comments(node: Any, path: str, found: list[str]) -> Any:
    """Keys starting with "_" are comments (DeepSpeed ignores them at the top level)."""
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            sub = f"{path}.{k}" if path else str(k)
            if isinstance(k, str) and k.startswith("_"):
                found.append(sub)
            else:
                out[k] = _without_comments(v, sub, found)
        return out
    if isinstance(node, list):
        return [_without_comments(v, path, found) for v in node]
    return node


def _unknown_keys(node: Any, model: type[BaseModel], loc: tuple) -> list[tuple[tuple, str]]:
    """Unknown keys first, before "auto" is looked at, so a misspelt "auto" key is named.
    (location, line) for each, in the file's order."""
    if not isinstance(node, dict):
        return []
    found = []
    for key, value in node.items():
        field = next((n for n in model.model_fields if key in spellings(n, model)), None)
        if field is None:
            hint = did_you_mean(str(key), valid_keys(model))
            found.append((loc + (key,), f"{_dotted(loc + (key,))}: unknown key{hint}"))
            continue
        inner, via_dict = _inner_model(model.model_fields[field].annotation)
        if inner is None:
            continue
        if via_dict and isinstance(value, dict):
            for name, sub in value.items():
                found += _unknown_keys(sub, inner, loc + (key, name))
        else:
            found += _unknown_keys(value, inner, loc + (key,))
    return found


def _without(node: Any, locs: list[tuple]) -> Any:
    """A copy of `node` without the keys at `locs` (the unknown ones, already named)."""
    if not locs:
        return node
    out = dict(node)
    for loc in locs:
        parent = out
        for part in loc[:-1]:
            parent[part] = dict(parent[part])
            parent = parent[part]
        parent.pop(loc[-1], None)
    return out


# --------------------------------------------------------------------------- error text


def file_problems(config: dict) -> list[str]:
    """Every unknown key and bad value of `config`, one line each, leaving aside what needs
    the run (the batch triad, the values "auto" stands for): what a caller that fails for
    another reason reports beside its own line, so one run names every mistake in the file."""
    data = _without_comments(config, "", [])
    unknown = _unknown_keys(data, ZeroTrainConfig, ())
    data = fill_auto(_without(data, [loc for loc, _ in unknown]), keep_unfilled=True, opaque=_OPAQUE)
    try:
        ZeroTrainConfig.model_validate(data)
        errors = []
    except ValidationError as exc:
        errors = [e for e in exc.errors() if e.get("input") != "auto"]
    return [line for _, line in unknown] + _explain_all(errors, _misspelt(unknown))


def _misspelt(unknown: list[tuple[tuple, str]]) -> set[tuple]:
    """The key each unknown one was probably meant to be (its did-you-mean), by location."""
    return {loc[:-1] + (m,) for loc, _ in unknown
            for m in difflib.get_close_matches(str(loc[-1]), _keys_at(loc[:-1]), n=1)}


def _explain_all(errors: list[dict], misspelt: set[tuple] = frozenset()) -> list[str]:
    """One line per key pydantic rejected (the first of its complaints: a union's members
    each complain about the same value), unknown keys first. A key missing only because it
    was misspelt (`misspelt`: the did-you-mean of each unknown key) is not named twice."""
    lines, seen = [], set()
    errors = sorted(errors, key=lambda e: e["type"] != "extra_forbidden")
    for error in errors:
        loc = tuple(error["loc"])
        if any(loc == s or s and loc[:len(s)] == s or loc and s[:len(loc)] == loc for s in seen):
            continue
        seen.add(loc)
        line = _explain(error)
        if "is missing" in line and line.split(" ", 1)[0] in {_dotted(m) for m in misspelt}:
            continue  # the misspelt key's did-you-mean already names it
        lines.append(line)
    return lines


def _keys_at(loc: tuple) -> list[str]:
    model = _model_at(loc)
    return valid_keys(model) if model is not None else []


def _explain(first: dict) -> str:
    """One line for one pydantic error."""
    loc = tuple(first["loc"])
    if first["type"] == "extra_forbidden":
        parent = _model_at(loc[:-1])
        hint = did_you_mean(str(loc[-1]), valid_keys(parent)) if parent is not None else ""
        return f"{_dotted(loc)}: unknown key{hint}"
    problem = (first.get("ctx") or {}).get("error")
    if isinstance(problem, FieldProblem):
        loc = loc + tuple(k for k in problem.key.split(".") if k)
        reason = str(problem)
    elif first["type"] == "missing":
        reason = 'is missing: add "enabled": true or false' if loc[-1] == "enabled" else "is missing"
    else:
        reason = _SHORT_REASONS.get(first["type"]) or _strip(first["msg"])
        if first["type"] != "value_error":  # our own messages already say what was given
            reason += f", got {show(first.get('input'))}"
    path = _dotted(loc)
    if not path:
        return reason
    return f"{path} {reason}" if reason.startswith("is ") else f"{path}: {reason}"


def _strip(msg: str) -> str:
    for prefix in ("Value error, ", "Input "):
        if msg.startswith(prefix):
            msg = msg[len(prefix):]
    return msg


def show(value: Any) -> str:
    """A value as the messages and `zerotrain config` show it: JSON, cut at 60 characters."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _dotted(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The config block class that `loc` points into, following dicts of blocks too."""
    model: type[BaseModel] | None = ZeroTrainConfig
    parts = list(loc)
    while parts and model is not None:
        key = parts.pop(0)
        field = next((n for n in model.model_fields if key in spellings(n, model)), None)
        if field is None:
            return None
        model, via_dict = _inner_model(model.model_fields[field].annotation)
        if via_dict and parts:
            parts.pop(0)  # the user's own dict key, e.g. a metric name
    return model


def _inner_model(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """Find the block class inside `X | None` or `dict[str, X]`; the flag says it was a dict."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    origin = typing.get_origin(annotation)
    for arg in typing.get_args(annotation):
        found, via_dict = _inner_model(arg)
        if found is not None:
            return found, via_dict or origin is dict
    return None, False
