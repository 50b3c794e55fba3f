"""zerotrain: ZeRO data-parallel training for language models, DeepSpeed-config compatible.

    engine, optimizer, loader, scheduler = zerotrain.initialize(model=m, config="ds.json")
    loss = engine(batch); engine.backward(loss); engine.step()
"""

import importlib
import sys

from .comm.facade import init_distributed
from .errors import CheckpointError, ConfigError, DataError, DistributedFaultError, NonFiniteStepsError
from .features import CurriculumScheduler, ProgressiveLayerDrop
from .initialize import initialize
from .precision import DynamicLossScaler
from .schedules import get_scheduler
from .zero.estimate import estimate_memory
from .features import layer_drop as layerdrop
from .helpers.accelerator import get_accelerator
from .helpers.args import add_config_arguments
from .helpers.refusals import install_finder, missing

# `zerotrain.layerdrop` (wrap, LayerDrop, keep_mask) is the public name of the one layer-drop
# module, features/layer_drop.py; registered so `import zerotrain.layerdrop` works too.
sys.modules[__name__ + ".layerdrop"] = layerdrop

__version__ = "0.1.0"
install_finder()  # `import zerotrain.moe` and other DeepSpeed modules zerotrain lacks: one line naming the way

__all__ = ["initialize", "get_scheduler", "DynamicLossScaler", "CurriculumScheduler", "ProgressiveLayerDrop",
           "ConfigError", "DataError", "CheckpointError", "NonFiniteStepsError", "DistributedFaultError", "estimate_memory", "__version__",
           "init_distributed", "add_config_arguments", "get_accelerator", "DeepSpeedEngine", "DeepSpeedConfig"]

# DeepSpeed's module names, loaded when first used (`zerotrain.checkpointing.checkpoint(...)`)
_SUBMODULES = ("accelerator", "checkpointing", "comm", "ops", "profiling", "runtime", "utils", "zero", "pipe")
_LAZY = {"DeepSpeedEngine": ".runtime.engine", "DeepSpeedConfig": ".runtime.config"}
_missing = missing(__name__, strict=False)


def _git(what: str) -> str:
    """The commit or branch of the git checkout this package's files are tracked in; "unknown"
    for an installed copy (a repository that merely contains it does not count)."""
    import subprocess
    from pathlib import Path

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=5)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None

    if git("ls-files", "--error-unmatch", "__init__.py") is None:
        return "unknown"
    return git("rev-parse", "--short", "HEAD") if what == "hash" else git("rev-parse", "--abbrev-ref", "HEAD") \
        or "unknown"


def __getattr__(name: str):
    # zerotrain.Trainer / TrainingArguments / TrainerCallback load the trainer package (and its
    # HF imports) only when asked for, so `import zerotrain` stays light for engine users.
    if name in ("Trainer", "TrainingArguments", "TrainerCallback"):
        from . import trainer

        return getattr(trainer, name)
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    if name in ("__git_hash__", "__git_branch__"):
        value = globals()[name] = _git(name[6:-2])
        return value
    return _missing(name)
