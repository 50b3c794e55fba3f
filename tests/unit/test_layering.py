"""Structure rules for src/zerotrain: one layer talks to torch.distributed (one folder each to its
DTensor and pipelining layers), the engine names no feature, the ZeRO stages meet one written
contract, modules stay small."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "zerotrain"
COMM = PACKAGE / "comm" / "collectives.py"
MAX_LINES = 420  # ~400, with room for a docstring's growth


def modules() -> list[Path]:
    found = sorted(PACKAGE.rglob("*.py"))
    assert COMM in found and len(found) > 10, f"unexpected package layout under {PACKAGE}"
    return found


def _is_dist(name: str | None) -> bool:
    return name is not None and (name == "torch.distributed" or name.startswith("torch.distributed."))


def distributed_imports(source: str, filename: str = "<src>") -> list[tuple[str, str]]:
    """(`line: text`, module) for each import of torch.distributed, in any spelling, anywhere
    in the file (module level, inside functions, under `if TYPE_CHECKING`), plus
    `torch.distributed.x` reached as an attribute of a plain `import torch`. The module is the
    most precise name the spelling gives: `from torch.distributed import pipelining` is
    torch.distributed.pipelining, `torch.distributed.is_initialized()` is torch.distributed."""
    tree = ast.parse(source, filename)
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            hits += [(f"{node.lineno}: import {a.name}", a.name) for a in node.names if _is_dist(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            if node.module == "torch.distributed":
                hits += [(f"{node.lineno}: from {node.module} import {a.name}", f"{node.module}.{a.name}")
                         for a in node.names]
            elif _is_dist(node.module):
                hits.append((f"{node.lineno}: from {node.module} import ...", node.module))
            elif node.module == "torch" and any(a.name == "distributed" for a in node.names):
                hits.append((f"{node.lineno}: from torch import distributed", "torch.distributed"))
        elif isinstance(node, ast.Attribute) and node.attr == "distributed" \
                and isinstance(node.value, ast.Name) and node.value.id == "torch":
            hits.append((f"{node.lineno}: torch.distributed", "torch.distributed"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and re.fullmatch(r"torch\.distributed(\.\w+)*", node.value):
            hits.append((f"{node.lineno}: '{node.value}' (dynamic import?)", node.value))
    return hits


def distributed_uses(source: str, filename: str = "<src>") -> list[str]:
    return [text for text, _ in distributed_imports(source, filename)]


@pytest.mark.parametrize("snippet", [
    "import torch.distributed",
    "import torch.distributed as dist",
    "import torch.distributed.rpc",
    "from torch.distributed import all_reduce",
    "from torch.distributed.fsdp import FullyShardedDataParallel",
    "from torch import distributed",
    "from torch import nn, distributed as d",
    "def f():\n    from torch.distributed.run import main\n",
    "import torch\nx = torch.distributed.is_initialized()",
    "import importlib\nm = importlib.import_module('torch.distributed')",
])
def test_detector_sees_every_spelling(snippet):
    assert distributed_uses(snippet)


@pytest.mark.parametrize("snippet", [
    "import torch",
    "from torch import nn",
    "import torch.distributions",
    "from torch.distributions import Normal",
    "from .comm import Comm",
    "'''talks to torch.distributed (see comm.py)'''",  # prose may name it
    "'''torch.distributed.run starts the ranks'''",
])
def test_detector_ignores_other_imports(snippet):
    assert distributed_uses(snippet) == []


# torch's DTensor and pipelining layers are wrapped beside the parallelism that uses them, each
# in its own folder and nowhere else; the rest of torch.distributed stays in comm/.
WRAPPED = {"torch.distributed.tensor": PACKAGE / "parallel" / "tensor",
           "torch.distributed.pipelining": PACKAGE / "parallel" / "pipeline"}


def misplaced(path: Path, module: str) -> bool:
    """Whether importing `module` (a torch.distributed name) breaks the layering in `path`."""
    for wrapped, home in WRAPPED.items():
        if module == wrapped or module.startswith(wrapped + "."):
            return home not in path.parents
    return path.parent != COMM.parent


@pytest.mark.parametrize("snippet, where, ok", [
    ("from torch.distributed.tensor import DTensor", "parallel/tensor/dtensor.py", True),
    ("import torch.distributed.pipelining as pp", "parallel/pipeline/schedules.py", True),
    ("from torch.distributed import pipelining as pp", "parallel/pipeline/schedules.py", True),
    ("import torch.distributed", "parallel/tensor/dtensor.py", False),
    ("import torch.distributed as dist", "parallel/pipeline/schedules.py", False),
    ("from torch.distributed import all_reduce", "parallel/tensor/dtensor.py", False),
    ("from torch.distributed.tensor import DTensor", "parallel/pipeline/engine.py", False),
    ("from torch.distributed.tensor import DTensor", "comm/mesh.py", False),
    ("import torch.distributed.pipelining", "zero/stage2.py", False),
    ("from torch.distributed.device_mesh import init_device_mesh", "comm/mesh.py", True),
])
def test_wrapped_layers_stay_home(snippet, where, ok):
    path = PACKAGE / where
    assert all(not misplaced(path, module) for _, module in distributed_imports(snippet)) == ok


def test_only_the_dist_package_imports_torch_distributed():
    """Collectives go through comm/collectives.py; the torchrun launcher (comm/launch.py) is the
    only other piece of the communication layer. torch's DTensor and pipelining layers are
    imported only in parallel/tensor/ and parallel/pipeline/ respectively."""
    offenders = {}
    for path in modules():
        hits = [text for text, module in distributed_imports(path.read_text(encoding="utf-8"), str(path))
                if misplaced(path, module)]
        if hits:
            offenders[str(path.relative_to(PACKAGE.parent))] = hits
    assert not offenders, ("torch.distributed is used outside zerotrain/comm/ (DTensor outside parallel/tensor/, "
                           f"pipelining outside parallel/pipeline/); route it through Comm: {offenders}")
    assert distributed_uses(COMM.read_text(encoding="utf-8"))  # and comm.py really is the one
    for wrapped, home in WRAPPED.items():  # and each wrapped layer really is used at its home
        assert any(m.startswith(wrapped) for p in home.rglob("*.py")
                   for _, m in distributed_imports(p.read_text(encoding="utf-8"))), f"{wrapped} not found in {home}"


def test_modules_stay_small():
    long = {str(p.relative_to(PACKAGE.parent)): n for p in modules()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines; split them: {long}"


# Words that name a feature (features/); the engine core must work without knowing any.
FEATURE_WORDS = re.compile(r"curriculum|layer_?drop|pld|theta|token_budget|seqlen|lora|(?<![a-z])ltd|randomltd", re.I)


def feature_names_in_code(source: str, filename: str = "<src>") -> list[str]:
    """Identifiers, attributes, arguments and non-docstring strings that name a feature
    (prose in docstrings and comments may mention them)."""
    tree = ast.parse(source, filename)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    hits = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, ast.Attribute):
            names = [node.attr]
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, ast.arg):
            names = [node.arg]
        elif isinstance(node, ast.alias):
            names = [node.name]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            names = [node.value]
        hits += [f"{getattr(node, 'lineno', '?')}: {n!r}" for n in names if FEATURE_WORDS.search(n)]
    return hits


@pytest.mark.parametrize("snippet", [
    "x = engine.get_pld_theta()", "def f(curriculum_seqlen): pass", "from ..features import layer_drop",
    "k = 'pld_theta'", "class LoraThing: pass",
])
def test_feature_detector_sees_code(snippet):
    assert feature_names_in_code(snippet)


def test_feature_detector_ignores_prose():
    assert feature_names_in_code('"""Features such as curriculum learning attach here."""\n# layer drop\nx = 1') == []


def test_the_engine_names_no_feature():
    offenders = {str(p.relative_to(PACKAGE.parent)): hits for p in sorted((PACKAGE / "engine").rglob("*.py"))
                 if (hits := feature_names_in_code(p.read_text(encoding="utf-8"), str(p)))}
    assert not offenders, f"engine/ names features; attach them through engine/hooks.py events instead: {offenders}"


def test_every_zero_stage_meets_the_written_contract():
    """Each stage subclasses ZeroStrategy directly (no stage-on-stage chain) and leaves no
    member of the contract abstract."""
    from zerotrain.zero import STRATEGIES, ZeroStrategy

    for stage, cls in STRATEGIES.items():
        assert cls.__bases__ == (ZeroStrategy,), f"stage {stage}: {cls.__name__} derives from {cls.__bases__}"
        assert not cls.__abstractmethods__, f"stage {stage} leaves {sorted(cls.__abstractmethods__)} abstract"
        assert cls.stage == stage
    source = "\n".join(p.read_text(encoding="utf-8") for p in (PACKAGE / "engine").rglob("*.py"))
    assert not re.search(r"(hasattr|getattr)\(\s*(self\.|engine\.)?strategy", source), \
        "engine/ probes the strategy; add the member to zero/strategy.py's contract instead"


def root_imports(source: str, filename: str = "<src>") -> list[str]:
    """`line: text` for each absolute import of the zerotrain package itself (`import zerotrain`,
    `from zerotrain import x`): a module inside the package reaching back up through its root."""
    hits = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            hits += [f"{node.lineno}: import {a.name}" for a in node.names if a.name == "zerotrain"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "zerotrain":
            hits.append(f"{node.lineno}: from zerotrain import ...")
    return hits


def test_no_module_imports_the_package_root():
    assert root_imports("import zerotrain\nfrom zerotrain import initialize\nfrom . import x\n") == \
        ["1: import zerotrain", "2: from zerotrain import ..."]
    found = {str(p.relative_to(PACKAGE)): hits for p in modules()
             if (hits := root_imports(p.read_text(encoding="utf-8"), str(p)))}
    assert found == {}, f"use relative imports inside the package: {found}"
