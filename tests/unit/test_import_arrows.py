"""The "never" arrows of the architecture, as imports: what a layer must not import.

    cli, commands/, demo ──► trainer/ ──► initialize ──► parallel/, features/, optim/, ...
                                                      ──► engine/   zero/   config/   comm/

The layers on the right are libraries for the ones on the left, never the other way round:

- engine/ (the loop) names no feature and builds nothing: it is handed a strategy, features and
  an optimizer, so it imports neither features/, the trainer, the ZeRO stages (their pure
  memory arithmetic, zero/estimate.py, it may read) nor the pipeline (whose engine is built on
  it); of the parallelisms it reads only tensor parallelism's DTensor wrappers
  (`parallel/tensor/dtensor.py`), to save and load split tensors;
- zero/ (the stages) serves the engine and knows nothing of the trainer, the engine or features;
- comm/ is the bottom: it imports nothing of zerotrain but errors and the accelerator (which
  backend a device talks through);
- config/ imports nothing but errors and the config blocks that live beside their component
  (`parallel/pipeline/config.py`, ...), and such a block imports nothing but config/;
- features/ attach to the engine's events, and do not reach up into the trainer or the stages;
- only the commands, the demo and the package's front (`zerotrain/__init__.py`) use the trainer,
  and only the `zerotrain` command uses commands/;
- nothing inside the package imports it by its absolute name (`import zerotrain`,
  `from zerotrain.x import y`): a module reached that way runs the package's `__init__`
  (which imports the trainer) from below, the one way an upward arrow hides.

Modules are read with `ast`, so an import inside a function or under `if TYPE_CHECKING` counts.
Targets are dotted module paths inside the package ("parallel.pipeline.engine"); a rule naming
"parallel.pipeline" covers everything under it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "zerotrain"

# layer (top-level package or module of zerotrain) -> what it never imports
STAGES = {"zero.stage0", "zero.stage1", "zero.stage2", "zero.stage3", "zero.offload", "zero.strategy"}
NEVER = {
    "engine": {"features", "trainer", "commands", "cli", "demo", "initialize", "pipe", "parallel.pipeline",
               "models"} | STAGES,
    "zero": {"trainer", "commands", "cli", "demo", "initialize", "engine", "features", "pipe", "models"},
    "features": {"trainer", "commands", "cli", "demo", "initialize", "zero", "pipe"},
    "comm": {"*"},
    "config": {"*"},
}
ALWAYS_ALLOWED = {"errors"}  # the exception types every layer raises
ALLOWED = {"comm": {"helpers.accelerator"}}  # exceptions to a layer's "*"
USES_TRAINER = {"trainer", "commands", "demo", "__init__"}
USES_COMMANDS = {"commands", "cli", "demo"}


def _covers(rule: str, target: str) -> bool:
    return rule == "*" or target == rule or target.startswith(rule + ".")


def _is_component_config(target: str) -> bool:
    """A config block kept beside its component, as config/ imports it: a module named config
    outside config/ (a name imported from it counts as the module)."""
    parts = target.split(".")
    if len(parts) > 2 and parts[-2] == "config":
        parts = parts[:-1]
    return len(parts) > 1 and parts[-1] == "config" and parts[0] != "config"


def component_configs(files: dict[Path, str]) -> set[str]:
    """The modules outside config/ that config/ imports (their dotted paths)."""
    found = set()
    for rel, source in files.items():
        if rel.parts[0] == "config":
            for _, target, _ in imported_modules(source, rel):
                if _is_component_config(target):
                    parts = target.split(".")
                    found.add(".".join(parts[:-1] if parts[-1] != "config" else parts))
    return found


def imported_modules(source: str, rel: Path) -> list[tuple[int, str, bool]]:
    """(line, dotted module of zerotrain imported, whether by the absolute name) for every import
    of the package in `source`, the module at `rel` (relative to the package folder). For
    `from pkg import name` the name counts as a module under pkg (it may be one)."""
    here = list(rel.parts[:-1])
    found = []
    for node in ast.walk(ast.parse(source, str(rel))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "zerotrain":
                    found.append((node.lineno, ".".join(parts[1:]) or "__init__", True))
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                parts = (node.module or "").split(".")
                if parts[0] != "zerotrain":
                    continue
                base, absolute = parts[1:], True
            else:
                if node.level - 1 > len(here):
                    raise AssertionError(f"{rel}:{node.lineno}: relative import above the package")
                base = here[:len(here) - (node.level - 1)] + (node.module.split(".") if node.module else [])
                absolute = False
            found += [(node.lineno, ".".join(base + [alias.name]), absolute) for alias in node.names]
    return found


def arrow_breaks(source: str, rel: Path, configs: set[str] = frozenset()) -> list[str]:
    """The imports of the module at `rel` against the rules; `configs`: the component config
    blocks (component_configs), which import nothing but config/ and errors."""
    layer = rel.parts[0] if len(rel.parts) > 1 else rel.stem
    module = ".".join(rel.with_suffix("").parts)
    never = NEVER.get(layer, set())
    breaks = []
    for line, target, absolute in imported_modules(source, rel):
        top = target.split(".")[0]
        if absolute:
            breaks.append(f"{rel}:{line}: imports zerotrain by its absolute name (use a relative import)")
        if module in configs and top not in ("config", "errors"):
            breaks.append(f"{rel}:{line}: the config block {module} imports {target}")
        if top == layer or top in ALWAYS_ALLOWED:
            continue
        if layer == "config" and _is_component_config(target):
            continue  # a component's config block (or a name from it)
        if any(_covers(allowed, target) for allowed in ALLOWED.get(layer, ())):
            continue
        rule = next((r for r in never if _covers(r, target)), None)
        if rule is not None:
            breaks.append(f"{rel}:{line}: {layer} imports {target}")
        elif top == "trainer" and layer not in USES_TRAINER:
            breaks.append(f"{rel}:{line}: {layer} imports the trainer")
        elif top == "commands" and layer not in USES_COMMANDS:
            breaks.append(f"{rel}:{line}: {layer} imports commands/")
    return breaks


@pytest.mark.parametrize("rel, snippet", [
    ("engine/engine.py", "from ..features import curriculum"),
    ("engine/engine.py", "from ..trainer.loop.trainer import Trainer"),
    ("engine/engine.py", "def f():\n    from ..zero.stage3 import Stage3\n"),
    ("engine/engine.py", "from .. import features"),
    ("zero/stage2.py", "from ..trainer import args"),
    ("zero/stage3/gather.py", "from ...engine.engine import TrainingEngine"),
    ("comm/mesh.py", "from ..zero import layout"),
    ("config/schema.py", "from ..comm import Comm"),
    ("models/gpt.py", "from ..trainer.args import TrainArgs"),
    ("features/curriculum.py", "from ..commands import train"),
    ("trainer/loop/trainer.py", "import zerotrain"),
    ("trainer/loop/trainer.py", "from zerotrain.engine import engine"),
    ("optim/factory.py", "from zerotrain.errors import ConfigError"),
    ("engine/engine.py", "from ..parallel.pipeline.engine import PipelineEngine"),
    ("config/schema.py", "from ..parallel.pipeline.engine import PipelineEngine"),
    ("parallel/pipeline/config.py", "from ..topology import Grid"),
    ("comm/facade.py", "from ..helpers.logs import log_dist"),
    ("engine/engine.py", "from ..zero.strategy import ZeroStrategy"),
])
def test_detector_sees_a_broken_arrow(rel, snippet):
    assert arrow_breaks(snippet, Path(rel), {"parallel.pipeline.config"})


@pytest.mark.parametrize("rel, snippet", [
    ("engine/engine.py", "from ..comm import Comm\nfrom ..errors import ConfigError\nfrom .hooks import Feature"),
    ("zero/stage3/gather.py", "from ...comm import Comm\nfrom ..flat import FlatBuffer"),
    ("trainer/loop/trainer.py", "from ...engine.checkpointing import writes_shared_files"),
    ("commands/train.py", "from ..trainer.args import TrainArgs"),
    ("config/schema.py", "from .zero import ZeroConfig\nfrom ..errors import ConfigError"),
    ("engine/engine.py", "import torch\nfrom torch import nn\nimport zerotrain_extra"),
    ("engine/engine.py", "'''features and the trainer attach here'''"),
    ("engine/checkpointing.py", "from ..parallel.tensor.dtensor import split_record"),
    ("config/schema.py", "from ..parallel.pipeline.config import PipelineConfig"),
    ("config/loader.py", "from ..parallel.tensor import config"),
    ("parallel/pipeline/config.py", "from ...config.base import Block\nfrom ...errors import ConfigError"),
    ("comm/facade.py", "from ..helpers.accelerator import get_accelerator"),
    ("engine/summary.py", "from ..zero.estimate import human_bytes"),
])
def test_detector_allows_the_arrows_that_point_down(rel, snippet):
    assert arrow_breaks(snippet, Path(rel), {"parallel.pipeline.config"}) == []


def test_no_layer_imports_what_it_never_should():
    files = {path.relative_to(PACKAGE): path.read_text(encoding="utf-8") for path in sorted(PACKAGE.rglob("*.py"))}
    configs = component_configs(files)
    assert "parallel.pipeline.config" in configs
    breaks = []
    for rel, source in files.items():
        breaks += arrow_breaks(source, rel, configs)
    assert len(list(PACKAGE.rglob("*.py"))) > 50 and (PACKAGE / "engine").is_dir()
    assert not breaks, "imports against the architecture's arrows:\n" + "\n".join(breaks)
