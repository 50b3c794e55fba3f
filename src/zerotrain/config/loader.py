"""Turn a DeepSpeed-style JSON config into a validated `ZeroTrainConfig`.

Order of work: read (reader.py, the one reader) -> set comment keys aside -> unknown keys
(a typo is reported as one, with a did-you-mean, even when its value is "auto") -> fill
"auto" (auto.py, the one filler) -> pydantic -> batch triad (needs the world size). Every
failure is one `ConfigError` line that names the dotted key, so users never see a pydantic
traceback.
"""

from __future__ import annotations

import json
import os
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

from ..errors import ConfigError, did_you_mean
from .auto import fill_auto
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
_TRIAD = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
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
    _check_keys(data, ZeroTrainConfig, ())
    autos: dict[str, str] = {}
    data = fill_auto(data, auto_values, sources=autos, opaque=_OPAQUE)  # new containers; raw stays as given
    try:
        cfg = ZeroTrainConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_explain(exc)) from None
    triad = resolve_batch_sizes(cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu,
                                cfg.gradient_accumulation_steps, world_size)
    for name, value in zip(_TRIAD, triad):
        if name in cfg.given:
            setattr(cfg, name, value)
        else:
            cfg.settle(name, value, f"derived: train_batch_size = micro batch x accumulation x world size {world_size}")
    cfg._raw, cfg._comments, cfg._autos = raw, comments, autos
    return cfg


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
    """Raise the ConfigError load_config would raise for the first unknown key."""
    _check_keys(_without_comments(config, "", []), ZeroTrainConfig, ())


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


def _check_keys(node: Any, model: type[BaseModel], loc: tuple) -> None:
    """Unknown keys first, before "auto" is looked at, so a misspelt "auto" key is named."""
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        field = next((n for n in model.model_fields if key in spellings(n, model)), None)
        if field is None:
            raise ConfigError(f"{_dotted(loc + (key,))}: unknown key{did_you_mean(str(key), valid_keys(model))}")
        inner, via_dict = _inner_model(model.model_fields[field].annotation)
        if inner is None:
            continue
        if via_dict and isinstance(value, dict):
            for name, sub in value.items():
                _check_keys(sub, inner, loc + (key, name))
        else:
            _check_keys(value, inner, loc + (key,))


# --------------------------------------------------------------------------- batch triad


def resolve_batch_sizes(tb: int | None, mb: int | None, ga: int | None, world_size: int) -> tuple[int, int, int]:
    """Fill the missing batch numbers (spec section 5) and check TB == MB x GA x world size."""
    for name, value in (("train_batch_size", tb), ("train_micro_batch_size_per_gpu", mb),
                        ("gradient_accumulation_steps", ga)):
        if value is not None and value <= 0:
            raise ConfigError(f"{name}: should be a positive integer, got {value}")
    ws = world_size
    if tb is None and mb is None:
        raise ConfigError("train_batch_size or train_micro_batch_size_per_gpu is needed; give one of them")
    if tb is not None and mb is not None and ga is None:
        ga = (tb // mb) // ws
    elif tb is not None and ga is not None and mb is None:
        mb = (tb // ws) // ga
    elif mb is not None and ga is not None and tb is None:
        tb = mb * ga * ws
    elif mb is None:
        ga, mb = 1, tb // ws
    elif tb is None:
        tb, ga = mb * ws, 1
    if mb <= 0 or ga <= 0:
        name, value = ("train_micro_batch_size_per_gpu", mb) if mb <= 0 else ("gradient_accumulation_steps", ga)
        raise ConfigError(
            f"{name} works out to {value} from train_batch_size {tb}, world size {ws}"
            f" and the other batch settings; raise train_batch_size or set {name} yourself")
    if tb != mb * ga * ws:
        raise ConfigError(
            f"batch sizes disagree: train_batch_size {tb} != train_micro_batch_size_per_gpu {mb}"
            f" x gradient_accumulation_steps {ga} x world size {ws} = {mb * ga * ws}")
    return tb, mb, ga


# --------------------------------------------------------------------------- error text


def _explain(exc: ValidationError) -> str:
    """One line for the most useful pydantic error; unknown keys first (they cause the rest)."""
    errors = exc.errors()
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
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
