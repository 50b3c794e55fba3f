"""User-facing error types: one clear line that names what is wrong and how to fix it."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ConfigError(ValueError):
    """A configuration value, key or file is wrong. The message is meant to be shown as is."""


class DataError(ValueError):
    """A data file or dataset cannot be used. The message names the file and the fix."""


class ModelInterfaceError(TypeError):
    """The model's forward cannot take what an enabled feature must pass it (found at
    initialize, not at the first step). A TypeError, as calling it would have raised."""


class GatheredModificationWarning(UserWarning):
    """A parameter was changed in place inside GatheredParameters(modifier_rank=None), where
    changes are not kept: the warning names the parameters whose changes were discarded."""


class NotBuiltError(ImportError):
    """A DeepSpeed name zerotrain does not provide, met in an import or an attribute look-up.
    The message names it and the zerotrain way. An ImportError, so `from zerotrain.x import y`
    shows the message instead of Python's generic "cannot import name"."""


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete, corrupted or unsafe to load."""


class DiskFullError(OSError):
    """An offload or checkpoint file could not be written: its disk filled up during the run
    (the start-up check saw enough room, something else took it)."""


class NonFiniteStepsError(RuntimeError):
    """Too many optimizer steps in a row had non-finite gradients. The parameters and optimizer
    state are still those of `last_good_step` (skipped steps change neither), so saving a
    checkpoint after catching this saves the last good state."""

    def __init__(self, message: str, last_good_step: int):
        super().__init__(message)
        self.last_good_step = last_good_step


class DistributedFaultError(RuntimeError):
    """A collective failed because another rank died or hung; `ranks` names the culprits
    (empty when they could not be told)."""

    def __init__(self, message: str, ranks: list[int]):
        super().__init__(message)
        self.ranks = ranks


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM reached the run: every rank stopped at the same optimizer step. The
    message names the checkpoint to resume from and the command that does; `exit_code` is the
    shell's 128 + signal number (130 for SIGINT, 143 for SIGTERM)."""

    def __init__(self, message: str, signum: int, checkpoint: str | None = None):
        super().__init__(message)
        self.signum, self.checkpoint = signum, checkpoint

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """Suffix like ', did you mean stage?' or '' when nothing is close."""
    match = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f", did you mean {match[0]}?" if match else ""
