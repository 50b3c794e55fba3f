"""Turn a DeepSpeed-style JSON config into a validated `ZeroTrainConfig`.

Order of work: read -> reject DeepSpeed features we do not implement -> fill "auto" ->
pydantic -> batch triad (needs the world size). Every failure is one `ConfigError` line
that names the dotted key, so users never see a pydantic traceback.
"""

from __future__ import annotations

import copy
import json
import os
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from ..errors import ConfigError, did_you_mean
from .schema import FieldProblem, ZeroTrainConfig, spellings, valid_keys

# Top-level DeepSpeed keys with features zerotrain does not have. Saying so beats
# "unknown key": the user did nothing wrong, the feature is just missing here.
UNSUPPORTED_KEYS = frozenset({
    "activation_checkpointing", "flops_profiler", "tensorboard", "wandb", "csv_monitor",
    "comet", "aio", "amp", "communication_data_type", "sparse_attention",
    "compression_training", "autotuning", "elasticity", "checkpoint", "data_types",
    "dump_state", "memory_breakdown", "sparse_gradients", "monitor_config", "nebula",
    "hybrid_engine", "eigenvalue", "quantize_training", "seq_parallel_communication_data_type",
})
_UNSUPPORTED_PREFIX = "zero_quantized_"
# keys whose "auto" is a setting of its own (DeepSpeed's default), not a value for the Trainer to fill
_AUTO_IS_A_VALUE = frozenset({"pipeline.stages"})

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


def load_config(
    config: dict | str | os.PathLike,
    world_size: int = 1,
    auto_values: dict[str, object] | None = None,
) -> ZeroTrainConfig:
    """Validate `config` (a dict or a JSON file path) for a data-parallel world of `world_size`."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(f"world_size should be a positive integer, got {world_size!r}")
    raw = _read(config)
    _reject_unsupported(raw)
    data = _fill_auto(raw, auto_values or {}, "")  # builds new containers; raw stays as given
    try:
        cfg = ZeroTrainConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_explain(exc)) from None
    cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps = resolve_batch_sizes(
        cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps, world_size)
    cfg._raw = raw
    return cfg


# --------------------------------------------------------------------------- reading


def _read(config: Any) -> dict:
    if isinstance(config, dict):
        _check_depth(config)  # before deepcopy, which would recurse as deep as the input
        return copy.deepcopy(config)
    if not isinstance(config, (str, os.PathLike)):
        raise ConfigError(f"config should be a dict or a path to a JSON file, got {type(config).__name__}")
    path = Path(config)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise ConfigError(f"{path}: cannot read config: {reason}") from None
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}") from None
    except _DuplicateKey as exc:
        raise ConfigError(f"{path}: key {exc.args[0]!r} appears twice in one object; keep one") from None
    except RecursionError:
        raise ConfigError(f"{path}: invalid JSON: nested too deeply") from None
    except ValueError as exc:  # an integer with more digits than int() converts
        raise ConfigError(f"{path}: invalid JSON: {str(exc).split(':')[0]}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level should be a JSON object, got {type(data).__name__}")
    _check_depth(data)
    return data


# The deepest DeepSpeed setting is about 7 levels down; anything far deeper is a mistake or a
# dict that contains itself, and would otherwise end in a RecursionError somewhere below.
_MAX_DEPTH = 32


def _check_depth(node: Any, key: Any = None, depth: int = 0) -> None:
    if depth > _MAX_DEPTH:
        raise ConfigError(f"{key}: nested more than {_MAX_DEPTH} levels deep (or contains itself); "
                          "no setting is that deep")
    if isinstance(node, dict):
        for k, value in node.items():
            _check_depth(value, k if key is None else key, depth + 1)
    elif isinstance(node, (list, tuple, set, frozenset)):
        for value in node:
            _check_depth(value, key, depth + 1)


class _DuplicateKey(Exception):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    # json.loads keeps the last duplicate silently; a config should say one thing.
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _reject_unsupported(raw: dict) -> None:
    for key in raw:
        if isinstance(key, str) and (key in UNSUPPORTED_KEYS or key.startswith(_UNSUPPORTED_PREFIX)):
            raise ConfigError(f"{key}: DeepSpeed option not supported by zerotrain; remove it from the config")


def _fill_auto(node: Any, values: dict[str, object], path: str) -> Any:
    """Replace every "auto" by the value the Trainer supplied for its dotted path."""
    if isinstance(node, dict):
        return {k: _fill_auto(v, values, f"{path}.{k}" if path else str(k)) for k, v in node.items()}
    if isinstance(node, list):
        return [_fill_auto(v, values, f"{path}[{i}]") for i, v in enumerate(node)]
    if isinstance(node, str) and node == "auto":
        if path in _AUTO_IS_A_VALUE and path not in values:
            return node
        if path not in values:
            raise ConfigError(f"{path} is 'auto', which only the Trainer fills in; give a number")
        return copy.deepcopy(values[path])
    return node


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
            reason += f", got {_show(first.get('input'))}"
    path = _dotted(loc)
    if not path:
        return reason
    return f"{path} {reason}" if reason.startswith("is ") else f"{path}: {reason}"


def _strip(msg: str) -> str:
    for prefix in ("Value error, ", "Input "):
        if msg.startswith(prefix):
            msg = msg[len(prefix):]
    return msg


def _show(value: Any) -> str:
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
