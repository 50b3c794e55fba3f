"""Foundations of the config tree: the strict block base class, number types that refuse
JSON booleans, the error that names an exact key, and the three classes every DeepSpeed key
belongs to.

    acts(default, why)        the engine uses the value
    no_effect(default, why)   accepted so the user's JSON keeps working; named in the notice
                              at initialize when present
    refused(default, why)     the default is what zerotrain does; any other value would
                              change what is trained (or needs a feature that is not built)
                              and is an error naming the key and the reason

The blocks live in schema.py, zero.py, data_efficiency.py and extras.py; a test walks all of
them and fails on a field without a class.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from pydantic import AliasChoices, BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, model_validator

ACTS, NO_EFFECT, REFUSED = "acts", "no effect", "refused"
EFFECTS = (ACTS, NO_EFFECT, REFUSED)


class FieldProblem(ValueError):
    """A complaint about `key` (dotted, relative to the block). Pydantic only knows the block
    a model validator runs on; the key lets the loader name the exact setting."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


def _no_bool(value: Any) -> Any:
    # JSON true/false would otherwise pass as 1/0 for numeric fields.
    if isinstance(value, bool):
        raise ValueError(f"should be a number, not {str(value).lower()}")
    return value


Int = Annotated[int, BeforeValidator(_no_bool)]
Float = Annotated[float, BeforeValidator(_no_bool)]


def _number(value: Any) -> Any:
    value = _no_bool(value)
    if not isinstance(value, (int, float)):
        raise ValueError(f"should be a number, got {value!r}")
    return value


# Keeps ints as ints and floats as floats (metric difficulties can be either).
Number = Annotated[Any, BeforeValidator(_number)]


# --------------------------------------------------------------------------- key classes


def _field(default: Any, effect: str, why: str, extra: dict, kw: dict) -> Any:
    if "default_factory" in kw:
        return Field(description=why, json_schema_extra={"effect": effect, **extra}, **kw)
    return Field(default, description=why, json_schema_extra={"effect": effect, **extra}, **kw)


def acts(default: Any, why: str, *, ours: str | None = None, stages: tuple[int, ...] | None = None, **kw) -> Any:
    """A key the engine uses. `ours`: zerotrain chose the default (None in the field means
    "zerotrain's default", resolved by the block). `stages`: ZeRO stages where it applies."""
    extra = {k: v for k, v in (("ours", ours), ("stages", stages)) if v is not None}
    return _field(default, ACTS, why, extra, kw)


def no_effect(default: Any, why: str, **kw) -> Any:
    """A key accepted so that DeepSpeed JSON keeps working; `why` says what zerotrain does instead."""
    return _field(default, NO_EFFECT, why, {}, kw)


def refused(default: Any, why: str, *, ok: Callable[[Any], bool] | None = None, fix: str | None = None, **kw) -> Any:
    """A key whose default is what zerotrain does; another value (or one `ok` rejects) is an
    error: "<why>; remove it<fix>" (fix defaults to " or set it to <default>")."""
    extra = {"ok": ok} if ok is not None else {}
    extra["fix"] = fix if fix is not None else ("" if ok is not None else f" or set it to {_json(default)}")
    return _field(default, REFUSED, why, extra, kw)


def field_class(info) -> dict:
    """{"effect": ..., "ours": ..., "stages": ..., "ok": ...} of a field (empty: unclassified)."""
    extra = info.json_schema_extra
    return extra if isinstance(extra, dict) else {}


def spellings(field_name: str, model: type[BaseModel]) -> list[str]:
    """All JSON keys that set one field: its name plus any alias spellings (every alias in the
    schema is an AliasChoices)."""
    info = model.model_fields[field_name]
    names = [field_name]
    alias = info.validation_alias
    if isinstance(alias, AliasChoices):
        names += [c for c in alias.choices if isinstance(c, str) and c not in names]
    return names


def valid_keys(model: type[BaseModel]) -> list[str]:
    return [key for name in model.model_fields for key in spellings(name, model)]


class Block(BaseModel):
    """Base for every config block: strict keys, names and aliases both accepted, refused
    values reported by key, and a record of which keys the user gave (`given`) and where the
    values zerotrain filled in came from (`settled`)."""

    # protected_namespaces=(): DeepSpeed keys such as model_type must not warn on older pydantic.
    model_config = ConfigDict(extra="forbid", populate_by_name=True, protected_namespaces=())

    _given: frozenset = PrivateAttr(default=frozenset())
    _settled: dict = PrivateAttr(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _one_spelling(cls, data: Any) -> Any:
        # With two spellings of one setting pydantic would call the second "unknown".
        if isinstance(data, dict):
            for name in cls.model_fields:
                given = [k for k in spellings(name, cls) if k in data]
                if len(given) > 1:
                    raise ValueError(f"{' and '.join(given)} set the same option; keep one")
        return data

    @model_validator(mode="wrap")
    @classmethod
    def _record_and_refuse(cls, data: Any, handler) -> Any:
        # Runs before the subclasses' own "after" validators, so what is recorded here is
        # exactly what the user wrote, not what a validator filled in later.
        self = handler(data)
        if isinstance(self, Block):
            self._given = frozenset(self.model_fields_set)
            for name, info in type(self).model_fields.items():  # in field order: the same error every run
                if name not in self._given:
                    continue
                spec = field_class(info)
                if spec.get("effect") != REFUSED:
                    continue
                value = getattr(self, name)
                ok = spec.get("ok")
                if not (ok(value) if ok is not None else value == info.get_default(call_default_factory=True)):
                    raise FieldProblem(name, f"{info.description}; remove it{spec['fix']}")
        return self

    @property
    def given(self) -> frozenset:
        """Field names the user's JSON set (any spelling), before any resolution."""
        return self._given

    @property
    def settled(self) -> dict[str, str]:
        """Field name -> where the value in force came from, for values zerotrain resolved."""
        return self._settled

    def settle(self, name: str, value: Any, source: str) -> None:
        """Write the value in force for `name` and say where it came from (not user-given)."""
        setattr(self, name, value)
        self._settled[name] = source


def _json(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return "null" if value is None else repr(value) if not isinstance(value, str) else f'"{value}"'
