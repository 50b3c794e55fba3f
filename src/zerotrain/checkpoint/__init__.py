"""Checkpoint folders: atomic multi-rank writes, manifests, safe loading."""

from .store import (
    CheckpointWriter,
    list_complete_tags,
    load_file,
    resolve_checkpoint,
    validate_tag,
    verify_checkpoint,
)

__all__ = ["CheckpointWriter", "list_complete_tags", "load_file", "resolve_checkpoint",
           "validate_tag", "verify_checkpoint"]
