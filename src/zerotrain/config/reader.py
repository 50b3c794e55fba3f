"""The one reader of DeepSpeed config sources, for `zerotrain.initialize(config=...)` and
`zerotrain train --deepspeed` alike.

    a dict                 copied (the caller's object is never changed)
    a path                 JSON; where strict JSON fails, hjson as DeepSpeed reads it
                           (comments, trailing commas, unquoted strings)
    a JSON string          text starting with "{" (the trainer's --deepspeed '{...}')
    a base64 string        of such text, as DeepSpeed's launcher passes it

A key given twice in one object is an error, as in DeepSpeed. Every failure is one
ConfigError line naming the file (and the line and column where the text is broken).
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import os
import re
from pathlib import Path
from typing import Any

from ..errors import ConfigError

# The deepest DeepSpeed setting is about 7 levels down; anything far deeper is a mistake or a
# dict that contains itself, and would otherwise end in a RecursionError somewhere below.
MAX_DEPTH = 32
_BASE64 = re.compile(r"^[A-Za-z0-9_\-+/=\s]+$")


def read_config(source: Any) -> dict:
    """A fresh dict of the config `source` describes."""
    if isinstance(source, dict):
        check_depth(source)  # before deepcopy, which would recurse as deep as the input
        return copy.deepcopy(source)
    if not isinstance(source, (str, os.PathLike)):
        raise ConfigError(f"config should be a dict or a path to a JSON file, got {type(source).__name__}")
    text = os.fspath(source)
    if isinstance(source, str) and text.lstrip().startswith("{"):
        return _parse(text, "config string")
    path = Path(text).expanduser()
    if isinstance(source, str) and not _exists(path) and "\n" not in text and _BASE64.match(text):
        decoded = _from_base64(text)
        if decoded is not None:
            return _parse(decoded, "base64 config")
    try:
        content = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise ConfigError(f"{path}: cannot read config: {reason}") from None
    return _parse(content, str(path))


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # a name too long to be a file's (ENAMETOOLONG): read_text then says so
        return False


def _from_base64(text: str) -> str | None:
    try:
        decoded = base64.urlsafe_b64decode(text.strip() + "=" * (-len(text.strip()) % 4)).decode("utf-8")
    except (binascii.Error, ValueError, UnicodeDecodeError):
        return None
    return decoded if decoded.lstrip().startswith("{") else None


def _parse(text: str, where: str) -> dict:
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as strict:
        data = _hjson(text, where, strict)
    except _DuplicateKey as exc:
        raise ConfigError(f"{where}: key {exc.args[0]!r} appears twice in one object; keep one") from None
    except RecursionError:
        raise ConfigError(f"{where}: invalid JSON: nested too deeply") from None
    except ValueError as exc:  # an integer with more digits than int() converts
        raise ConfigError(f"{where}: invalid JSON: {str(exc).split(':')[0]}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: the top level should be a JSON object, got {type(data).__name__}")
    check_depth(data)
    return data


def _hjson(text: str, where: str, strict: json.JSONDecodeError) -> Any:
    """DeepSpeed reads files with hjson: comments and trailing commas are fine there."""
    import hjson

    try:
        data = hjson.loads(text, object_pairs_hook=_no_duplicates)
    except _DuplicateKey as exc:
        raise ConfigError(f"{where}: key {exc.args[0]!r} appears twice in one object; keep one") from None
    except RecursionError:
        raise ConfigError(f"{where}: invalid JSON: nested too deeply") from None
    except (hjson.HjsonDecodeError, ValueError, IndexError, OverflowError):  # hjson: 1e310 -> int(inf)
        # hjson's own messages are vaguer than json's about where the text is broken
        raise ConfigError(f"{where}:{strict.lineno}:{strict.colno}: invalid JSON: {strict.msg}") from None
    return _plain(data)


def _plain(node: Any) -> Any:
    """hjson's OrderedDicts and Decimals as the dicts and numbers json.loads gives."""
    if isinstance(node, dict):
        return {k: _plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    return node


def check_depth(node: Any, key: Any = None, depth: int = 0) -> None:
    if depth > MAX_DEPTH:
        raise ConfigError(f"{key}: nested more than {MAX_DEPTH} levels deep (or contains itself); "
                          "no setting is that deep")
    if isinstance(node, dict):
        for k, value in node.items():
            check_depth(value, k if key is None else key, depth + 1)
    elif isinstance(node, (list, tuple, set, frozenset)):
        for value in node:
            check_depth(value, key, depth + 1)


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
