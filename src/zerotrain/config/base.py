"""Foundations of the config tree: the strict block base class, number types that refuse
JSON booleans, and the error that names an exact key. The blocks live in schema.py."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AliasChoices, BaseModel, BeforeValidator, ConfigDict, model_validator


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

def spellings(field_name: str, model: type[BaseModel]) -> list[str]:
    """All JSON keys that set one field: its name plus any alias spellings."""
    info = model.model_fields[field_name]
    names = [field_name]
    alias = info.validation_alias
    if isinstance(alias, AliasChoices):
        names += [c for c in alias.choices if isinstance(c, str) and c not in names]
    elif isinstance(alias, str) and alias not in names:
        names.append(alias)
    return names


def valid_keys(model: type[BaseModel]) -> list[str]:
    return [key for name in model.model_fields for key in spellings(name, model)]


class Block(BaseModel):
    """Base for every config block: strict keys, names and aliases both accepted."""

    # protected_namespaces=(): DeepSpeed keys such as model_type must not warn on older pydantic.
    model_config = ConfigDict(extra="forbid", populate_by_name=True, protected_namespaces=())

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
