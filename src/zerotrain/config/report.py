"""What a loaded config holds and where each value came from: the rows `zerotrain config`
prints, and the one notice line initialize logs for keys that have no effect.

    user                     the JSON set it
    auto: ...                it said "auto" (filled by the trainer, or the default applies)
    DeepSpeed default        absent; zerotrain uses DeepSpeed's default
    zerotrain default: why   absent; zerotrain chose the value (and says why)
    user, no effect: why     accepted so the JSON keeps working; nothing reads it
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .auto import TRAINER_FILLS
from .base import ACTS, NO_EFFECT, REFUSED, Block, field_class, spellings
from .loader import _inner_model, show
from .schema import ZeroTrainConfig
from .zero import MODEL_DERIVED, ZeroConfig


@dataclass(frozen=True)
class Entry:
    path: str
    block: Block
    name: str

    @property
    def info(self):
        return type(self.block).model_fields[self.name]

    @property
    def spec(self) -> dict:
        return field_class(self.info)

    @property
    def value(self) -> Any:
        return getattr(self.block, self.name)

    @property
    def given(self) -> bool:
        return self.name in self.block.given


def entries(block: Block, prefix: str = "", blocks: bool = False) -> Iterator[Entry]:
    """Every field of every block present, depth first; with `blocks`, the fields that hold a
    block too, before its own fields."""
    for name in type(block).model_fields:
        entry = Entry(f"{prefix}{name}", block, name)
        value = entry.value
        if isinstance(value, Block):
            if blocks:
                yield entry
            yield from entries(value, f"{entry.path}.", blocks)
        elif isinstance(value, dict) and value and all(isinstance(v, Block) for v in value.values()):
            for key, sub in value.items():
                yield from entries(sub, f"{entry.path}.{key}.", blocks)
        else:
            yield entry


def _off_stage(entry: Entry) -> int | None:
    stages = entry.spec.get("stages")
    if isinstance(entry.block, ZeroConfig) and stages and entry.block.stage not in stages:
        return entry.block.stage
    return None


def _accepted_without_effect(entry: Entry) -> bool:
    if not entry.given:
        return False
    effect = entry.spec.get("effect")
    if effect == NO_EFFECT:
        return True
    # a refused key that passed its check with a non-default value (a block switched off):
    # accepted, and nothing reads it
    return effect == REFUSED and entry.value != entry.info.get_default(call_default_factory=True)


def no_effect_keys(cfg) -> list[str]:
    """Every key present that changes nothing here, for the notice at initialize."""
    found = list(cfg.comment_keys)
    if cfg.pipeline is None and isinstance(cfg.raw.get("pipeline"), dict):
        found.append("pipeline (\"enabled\": false)")  # switched off: dropped by the schema
    if cfg.tensor_parallel.size == 1 and isinstance(cfg.raw.get("tensor_parallel"), dict):
        found.append("tensor_parallel (off: autotp_size 0 or 1, or \"enabled\": false)")
    if cfg.optimizer is not None and "max_grad_norm" in cfg.optimizer.params:
        found.append("optimizer.params.max_grad_norm (gradient_clipping clips)")
    for entry in entries(cfg, blocks=True):
        if _accepted_without_effect(entry):
            found.append(entry.path)
        elif entry.given and _off_stage(entry) is not None:
            found.append(f"{entry.path} (stage {entry.block.stage})")
    return found


def notice(cfg) -> str | None:
    keys = no_effect_keys(cfg)
    if not keys:
        return None
    return ("config keys accepted with no effect in zerotrain (`zerotrain config FILE` says why): "
            + ", ".join(keys))


def _auto_of(cfg, entry: Entry) -> tuple[str | None, str | None]:
    """(how its "auto" was resolved, the JSON spelling it had), under any spelling of the key."""
    prefix = entry.path[: len(entry.path) - len(entry.name)]
    for spelling in spellings(entry.name, type(entry.block)):
        found = cfg.auto_sources.get(prefix + spelling)
        if found is not None:
            return found, prefix + spelling
    return None, None


def _source(cfg, entry: Entry) -> str:
    spec = entry.spec
    auto, spelled = _auto_of(cfg, entry)
    if auto == "auto: filled in":
        return f"auto: the trainer fills it from {TRAINER_FILLS.get(spelled, 'its options')}"
    if entry.name in entry.block.settled:
        text = entry.block.settled[entry.name]
    elif entry.given and auto is None:
        if _accepted_without_effect(entry):
            why = entry.info.description
            if spec.get("effect") == REFUSED:  # accepted because it is off: the first clause says what is not built
                why = why.split(";")[0]
            return f"user, no effect: {why}"
        text = "user"
    elif entry.value is None and isinstance(entry.block, ZeroConfig) and entry.name in MODEL_DERIVED:
        text = f"zerotrain default: {spec['ours']}, measured at initialize"
    elif spec.get("ours"):
        text = f"zerotrain default: {spec['ours']}"
    else:
        text = "DeepSpeed default"
    if auto is not None:
        text = f"auto -> {text}"
        if spelled in TRAINER_FILLS:
            text += f"; zerotrain train and zerotrain.Trainer fill {TRAINER_FILLS[spelled]}"
    stage = _off_stage(entry)
    return text + (f" (no effect at stage {stage})" if stage is not None else "")


def rows(cfg) -> list[tuple[str, str, str]]:
    """(key, value, source) for every value the engine uses and every key the user gave."""
    out = [(key, "", "user, no effect: a comment") for key in cfg.comment_keys]
    for entry in entries(cfg):
        effect = entry.spec.get("effect")
        if effect != ACTS and not entry.given and _auto_of(cfg, entry)[0] is None:
            continue
        if entry.name == "params" and isinstance(entry.value, dict) and entry.value:
            for key, value in entry.value.items():  # free-form keyword arguments: one row each
                path = f"{entry.path}.{key}"
                auto = cfg.auto_sources.get(path)
                source = f"auto: the trainer fills it from {TRAINER_FILLS[path]}" \
                    if auto and path in TRAINER_FILLS else "user"
                if path == "optimizer.params.max_grad_norm":  # loaded only beside gradient_clipping
                    source = "user, no effect: gradient_clipping clips"
                out.append((path, show(value), source))
            continue
        out.append((entry.path, show(entry.value), _source(cfg, entry)))
    return out


def key_table(model=None, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, class, why) for every key of the schema, blocks opened up: docs/config-keys.md's
    table, and what the test that no key is unclassified walks."""
    model = model or ZeroTrainConfig
    out = []
    for name, info in model.model_fields.items():
        inner, via_dict = _inner_model(info.annotation)
        path = f"{prefix}{name}"
        if inner is not None:
            out += key_table(inner, f"{path}.<name>." if via_dict else f"{path}.")
            continue
        spec = field_class(info)
        out.append((path, spec.get("effect", "UNCLASSIFIED"), spec.get("ours") or info.description or ""))
    return out
