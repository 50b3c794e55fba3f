"""Crash-safe checkpoint folders shared by all ranks of a job.

Writes go to a hidden staging folder that becomes ``save_dir/<tag>`` by rename only once every
rank has finished and rank 0 has written a manifest of sizes and hashes; ``latest`` moves last.
So a crash at any point leaves ``latest`` naming a complete folder. The one window where the
named folder is briefly absent (replacing an existing tag) is covered by ``resolve_checkpoint``
falling back to the complete copy still on disk.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError, ConfigError

from .raw_files import externalize, internalize

MANIFEST = "manifest.json"
LATEST = "latest"
_FORMAT = "zerotrain-checkpoint"


def validate_tag(tag: str) -> str:
    """A tag must be one plain, visible folder name so it cannot escape or hide in save_dir."""
    bad = (not isinstance(tag, str) or tag in ("", ".", "..", LATEST) or tag.startswith(".")
           or tag != tag.strip() or not tag.isprintable() or any(c in tag for c in "/\\")
           or os.path.isabs(tag) or len(tag.encode("utf-8", "surrogatepass")) > 240)  # room for ".<tag>.staging"
    if bad:
        raise ConfigError(f"tag {tag!r} is not a plain folder name; use something like "
                          "global_step100")
    return tag


def _check_file_name(name: str) -> str:
    if (not isinstance(name, str) or name in ("", ".", "..", MANIFEST) or name.startswith(".")
            or name.endswith(".tmp") or any(c in name for c in "/\\\0")):
        raise ConfigError(f"checkpoint file name {name!r} must be a plain file name "
                          f"(not {MANIFEST}, not ending in .tmp)")
    return name


def _fsync_dir(path: Path) -> None:
    """Make a rename durable; some platforms cannot open directories, which is harmless."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _write_atomic(path: Path, write: Callable[[Any], None]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _remove(folder: Path) -> None:
    """Delete a folder manifest first: a kill partway through must not leave a half-deleted
    folder that still looks complete to resolve_checkpoint's fallback."""
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        (folder / MANIFEST).unlink()
    shutil.rmtree(folder, ignore_errors=True)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _recover(save_dir: Path, tag: str) -> None:
    """Finish a replacement that a crash cut between its two renames: then the only complete
    copy of the tag is .<tag>.staging (newer) or .<tag>.old, and a save must not clear it."""
    if (save_dir / tag).exists():
        return
    for copy in (save_dir / f".{tag}.staging", save_dir / f".{tag}.old"):
        if (copy / MANIFEST).is_file():
            os.rename(copy, save_dir / tag)
            _fsync_dir(save_dir)
            return


def _sweep(save_dir: Path, current: str) -> None:
    """Staging and .old folders that killed saves of other tags left behind: each one is
    either the tag's only complete copy (recovered) or garbage (removed), so disk use does
    not grow by a checkpoint per crash."""
    leftovers = {}
    for entry in save_dir.iterdir():
        for suffix in (".staging", ".old"):
            if entry.name.startswith(".") and entry.name.endswith(suffix) and entry.is_dir():
                tag = entry.name[1 : -len(suffix)]
                if tag != current:
                    leftovers.setdefault(tag, []).append(entry)
    for tag, entries in leftovers.items():
        _recover(save_dir, tag)
        for entry in entries:
            if entry.exists():
                _remove(entry)


class CheckpointWriter:
    """Context manager: every rank calls ``save``; the folder appears only if all succeed, and
    ``latest`` moves only once every writer's folder is published. ``is_main`` marks the rank
    that creates and publishes the folder: rank 0, or with node-local storage local rank 0 of
    each node, each in its own save_dir."""

    def __init__(self, save_dir: str | os.PathLike, tag: str, is_main: bool,
                 barrier: Callable[[], None], save_latest: bool = True) -> None:
        self.save_dir = Path(save_dir)
        self.save_latest = save_latest
        self.tag = validate_tag(tag)
        self.is_main = is_main
        self.barrier = barrier
        self.path = self.save_dir / self.tag
        self.staging = self.save_dir / f".{self.tag}.staging"
        self._old = self.save_dir / f".{self.tag}.old"

    def __enter__(self) -> CheckpointWriter:
        if self.is_main:
            self.save_dir.mkdir(parents=True, exist_ok=True)
            _sweep(self.save_dir, self.tag)
            _recover(self.save_dir, self.tag)
            _remove(self.staging)
            self.staging.mkdir()
        self.barrier()
        return self

    def save(self, name: str, obj: Any) -> Path:
        """torch.save of `obj`; swap files inside it are copied beside it (raw_files.py)."""
        target = self.staging / _check_file_name(name)
        obj = externalize(obj, self.staging, name[:-3] if name.endswith(".pt") else name)
        _write_atomic(target, lambda f: torch.save(obj, f))
        return target

    def __exit__(self, exc_type, exc, tb) -> None:
        # On failure do nothing: latest and the old folder stay as they were. No barrier
        # either, so a failing rank does not wait on ranks that may never arrive.
        if exc_type is not None:
            return
        self.barrier()
        if self.is_main:
            self._publish()
        self.barrier()  # every writer (one per node with node-local storage) has published the folder
        if self.is_main and self.save_latest:
            _write_atomic(self.save_dir / LATEST, lambda f: f.write(self.tag.encode()))
        self.barrier()

    def _publish(self) -> None:
        files = {}
        for entry in sorted(self.staging.iterdir()):
            if entry.name.endswith(".tmp") or not entry.is_file():
                continue  # a save interrupted before its rename: never part of the checkpoint
            _fsync_file(entry)  # files written straight into the folder (save_checkpoint's extra_files)
            files[entry.name] = {"size": entry.stat().st_size, "sha256": _sha256(entry)}
        manifest = {"format": _FORMAT, "version": 1, "tag": self.tag, "files": files}
        _write_atomic(self.staging / MANIFEST,
                      lambda f: f.write(json.dumps(manifest, indent=1).encode()))
        # Swap: the complete copy of this tag is always one of <tag>, .<tag>.old or the
        # manifest-bearing staging folder, never none of them.
        if self.path.exists():
            _remove(self._old)
            os.rename(self.path, self._old)
        os.rename(self.staging, self.path)
        _fsync_dir(self.save_dir)
        _remove(self._old)


def _available_tags(load_dir: Path) -> list[str]:
    return sorted(p.name for p in load_dir.iterdir()
                  if p.is_dir() and not p.name.startswith(".") and (p / MANIFEST).is_file())


def resolve_checkpoint(load_dir: str | os.PathLike, tag: str | None = None,
                       missing_ok: bool = False) -> Path | None:
    """Folder to load: ``tag`` if given, else the one ``latest`` names.

    ``missing_ok`` returns None when no tag is given and there is nothing to resume from yet
    (no folder or no ``latest``), so a first run and a resumed run can share one command line.
    """
    load_dir = Path(load_dir)
    if missing_ok and tag is None and not (load_dir / LATEST).is_file():
        return None
    if not load_dir.is_dir():
        raise CheckpointError(f"checkpoint folder {load_dir} does not exist; pass the save_dir "
                              "the checkpoints were written to")
    if tag is None:
        latest = load_dir / LATEST
        if not latest.is_file():
            tags = _available_tags(load_dir)
            raise CheckpointError(f"{latest} does not exist, so there is no default checkpoint; "
                                  f"pass a tag (available: {', '.join(tags) or 'none'})")
        try:
            tag = latest.read_bytes().decode("utf-8").strip()
            validate_tag(tag)
        except (UnicodeDecodeError, ConfigError) as err:
            raise CheckpointError(f"{latest} is corrupted ({type(err).__name__}); pass a tag, or "
                                  "fallback_to_complete=True") from None
    validate_tag(tag)
    folder = load_dir / tag
    if folder.is_dir():
        return folder
    # Interrupted replacement of an existing tag: prefer the finished new copy, then the old.
    for fallback in (load_dir / f".{tag}.staging", load_dir / f".{tag}.old"):
        if (fallback / MANIFEST).is_file():
            return fallback
    tags = _available_tags(load_dir)
    raise CheckpointError(f"checkpoint {folder} does not exist; available tags in {load_dir}: "
                          f"{', '.join(tags) or 'none'}")


def _read_manifest(path: Path) -> dict:
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
        files = manifest["files"]
        if manifest.get("format") != _FORMAT or not isinstance(files, dict):
            raise ValueError("not a zerotrain manifest")
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no {MANIFEST}; the checkpoint is incomplete or was not "
                              "written by zerotrain") from None
    except (ValueError, KeyError, TypeError, RecursionError) as err:
        detail = " ".join(str(err).split())[:120] or type(err).__name__
        raise CheckpointError(f"{path / MANIFEST} is unreadable ({detail}); the checkpoint is "
                              "corrupted") from None
    return files


def verify_checkpoint(path: str | os.PathLike) -> None:
    """Check every file against the manifest; raise naming the first file that differs."""
    path = Path(path)
    for name, entry in _read_manifest(path).items():
        label = f"{path.name}/{name}"
        try:
            _check_file_name(name)
            size, digest = int(entry["size"]), str(entry["sha256"])
        except (ConfigError, KeyError, TypeError, ValueError, OverflowError):
            raise CheckpointError(f"{path / MANIFEST}: bad entry for {name!r}; the checkpoint "
                                  "is corrupted") from None
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"{label}: missing but listed in the manifest; the checkpoint "
                                  "is incomplete")
        actual = file.stat().st_size
        if actual != size:
            raise CheckpointError(f"{label}: size {actual} != {size} in manifest; the checkpoint "
                                  "is truncated or corrupted")
        if _sha256(file) != digest:
            raise CheckpointError(f"{label}: sha256 differs from the manifest; the file is "
                                  "corrupted")


def load_file(path: str | os.PathLike, name: str, mmap: bool = False) -> Any:
    """Load tensors and plain data only; never run code stored in a checkpoint. With `mmap`
    the tensors stay in the file and only the bytes read are paged in (resharding)."""
    file = Path(path) / _check_file_name(name)
    label = f"{Path(path).name}/{name}"
    if not file.is_file():
        raise CheckpointError(f"{label}: missing from the checkpoint at {path}")
    try:
        return internalize(torch.load(file, map_location="cpu", weights_only=True, mmap=mmap), Path(path))
    except pickle.UnpicklingError as err:
        if "Weights only load failed" in str(err):
            raise CheckpointError(
                f"{label}: refused to load; the file contains non-tensor code objects that "
                "could run code on load. Only load checkpoints you trust, re-saved with "
                "tensors and plain data") from None
        raise CheckpointError(f"{label}: cannot be read ({err}); the file is corrupted") from None
    except Exception as err:  # torch raises many types for damaged archives
        raise CheckpointError(f"{label}: cannot be read ({type(err).__name__}: "
                              f"{str(err).splitlines()[0] if str(err) else ''}); "
                              "the file is truncated or corrupted") from None


def list_complete_tags(save_dir: str | os.PathLike) -> list[str]:
    """Tags whose folders verify, newest first, for falling back past a damaged checkpoint."""
    save_dir = Path(save_dir)
    if not save_dir.is_dir():
        return []
    found = []
    for tag in _available_tags(save_dir):
        folder = save_dir / tag
        with contextlib.suppress(CheckpointError):
            verify_checkpoint(folder)
            found.append((os.stat(folder / MANIFEST).st_mtime_ns, tag))
    return [tag for _, tag in sorted(found, reverse=True)]
