"""Mutation score of the pure modules (config, schedules, precision, features, the shard layout).

    python harness/mutation.py [layout schedules precision features config] [--fresh]
                                  [--max-children 1] [--survivors] [--report-only]
                                  [--rerun-survivors [--max-mutants N] [--match TEXT...]]
                                  [--quick | --only TEST...]

mutmut (3.x, pinned in the test extras) makes small edits to the code (`<` -> `<=`, `+` ->
`-`, a constant changed, a call argument dropped) and runs the tests that reach the edited
function; a mutant no test notices is a gap in the tests or an edit that changes nothing.
Each module runs on its own unit tests only (MODULES), in a scratch folder
build/mutation/<module>/ that holds links to src/ and tests/ and a pyproject.toml with the
module's [tool.mutmut] table (and docs/, whose key page a config test reads): mutmut copies src/
into mutants/ there and puts that copy first on sys.path, so the tests import the mutated
code, never the editable install. Results are kept between runs (mutmut only reruns what
changed); --fresh starts over, --rerun-survivors tests the survivors again (after new tests).

Cheaper runs, same verdicts: mutmut runs the tests that reach a mutated function and stops at
the first failure (-x); a conftest.py put in the copy orders those tests fastest first (by the
durations mutmut recorded), so a mutant dies on its cheapest killing test. --quick leaves out a
module's slow tests (SLOW: the hypothesis fuzz files, 85% of config's test time under mutmut):
a mutant killed then is killed, but its survivors are provisional until `--rerun-survivors`
(always the full set) has run them against every test. `--only TEST...` (with
--rerun-survivors, after new tests) keeps just the named test files the same way: a cheap way
to show that new tests kill the survivors they were written for.

Not part of `make test`: a whole run takes tens of minutes on 2 cores (`make mutation`).
mutmut leaves decorated functions (pydantic validators, properties) and class bodies (field
defaults) unmutated, so the score speaks for the plain functions and methods only.

Prints, per module, killed / total and the score; --survivors lists the surviving mutants
(see them with `cd build/mutation/<module> && mutmut show <name>`).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRATCH = ROOT / "build" / "mutation"

# module -> (files to mutate, the unit tests that cover them)
MODULES: dict[str, tuple[list[str], list[str]]] = {
    "layout": (["src/zerotrain/zero/layout.py"], ["tests/unit/zero/test_layout.py"]),
    "schedules": (["src/zerotrain/schedules/*"], ["tests/unit/schedules"]),
    "precision": (["src/zerotrain/precision/*"], ["tests/unit/precision"]),
    "features": (["src/zerotrain/features/*"], ["tests/unit/features"]),
    "config": (["src/zerotrain/config/*", "src/zerotrain/parallel/pipeline/config.py",
                "src/zerotrain/parallel/tensor/config.py"], ["tests/unit/config"]),
}

# Tests a --quick pass leaves out (their survivors then need a full --rerun-survivors)
SLOW: dict[str, list[str]] = {"config": ["tests/unit/config/test_config_fuzz.py"]}

# Copied into mutants/ (also_copy): the selected tests run fastest first, so that with -x a
# mutant dies on its cheapest killing test; a survivor runs them all either way.
ORDER_CONFTEST = '''"""Written by harness/mutation.py: run the selected tests fastest first."""
import json
from pathlib import Path


def pytest_collection_modifyitems(items):
    stats = Path("mutmut-stats.json")
    if stats.exists():
        took = json.loads(stats.read_text()).get("duration_by_test", {})
        items.sort(key=lambda item: took.get(item.nodeid, 0.0))
'''

# Functions that run only while their module is imported (the pydantic Field builders of the
# config classes): mutmut switches a mutant on at call time, after the import, so their mutants
# can never run. Counted apart ("import-time"), not as survivors, and left out of the score.
IMPORT_TIME = {"config": ("x_acts__", "x_no_effect__", "x_refused__", "x__field__", "x__stage3__", "x__json__")}

# mutmut's exit codes, folded into four outcomes
KILLED = {1, 3, 24, -24, 36, 152, 255}  # a failing test, or a timeout (the mutant loops)
SURVIVED = {0}
NO_TESTS = {5, 33}  # no selected test reaches the function


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


def prepare(name: str, fresh: bool) -> Path:
    """The module's scratch folder: links to src/ and tests/, and its own mutmut table."""
    files, tests = MODULES[name]
    where = SCRATCH / name
    if fresh and where.exists():
        shutil.rmtree(where)
    where.mkdir(parents=True, exist_ok=True)
    for link in ("src", "tests", "docs"):  # docs/: a config test compares docs/config-keys.md with the schema
        if not (where / link).exists():
            (where / link).symlink_to(ROOT / link)
    (where / "conftest.py").write_text(ORDER_CONFTEST)
    (where / "pyproject.toml").write_text(
        "[tool.mutmut]\n"
        'source_paths = ["src"]\n'
        'also_copy = ["docs", "conftest.py"]\n'
        f"only_mutate = {_toml_list(files)}\n"
        f"pytest_add_cli_args_test_selection = {_toml_list(tests)}\n"
        'pytest_add_cli_args = ["-p", "no:cacheprovider"]\n'
        "\n[tool.pytest.ini_options]\n"
        'addopts = "-ra"\n')
    return where


def left_out(name: str, quick: bool, only: list[str] | None) -> list[str]:
    """The module's test files a --quick or --only run leaves out."""
    if only:
        found = sorted(str(t.relative_to(ROOT)) for d in MODULES[name][1] for t in
                       ((ROOT / d).rglob("test_*.py") if (ROOT / d).is_dir() else [ROOT / d]))
        return [t for t in found if t not in only]
    return SLOW.get(name, []) if quick else []


def run(name: str, max_children: int, max_mutants: int | None, rerun: bool, leave_out: list[str],
        match: list[str] | None, log) -> None:
    where = SCRATCH / name
    cmd = [sys.executable, "-c", "from mutmut.__main__ import cli; cli()", "run",
           "--max-children", str(max_children)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if leave_out:  # outside [tool.mutmut]: a change there would make mutmut forget every result
        env["PYTEST_ADDOPTS"] = " ".join(f"--deselect {t}" for t in leave_out)
    if rerun:  # named mutants are run again; the others' results stand
        names = [n for n in tally(where)[1] if not match or any(m in n for m in match)]
        if max_mutants is not None:
            names = sorted(random.Random(0).sample(names, min(max_mutants, len(names))))
        cmd = cmd + names
    subprocess.run(cmd, cwd=where, env=env, stdout=log, stderr=log)


def tally(where: Path) -> tuple[Counter, list[str]]:
    """Outcome counts and the surviving mutants' names, read from mutmut's .meta files."""
    counts: Counter = Counter()
    survivors: list[str] = []
    import_time = IMPORT_TIME.get(where.name, ())
    for meta in sorted((where / "mutants").rglob("*.meta")):
        for key, code in json.loads(meta.read_text())["exit_code_by_key"].items():
            if any(f".{f}" in key for f in import_time):
                counts["import-time"] += 1
            elif code is None:
                counts["not run"] += 1
            elif code in KILLED:
                counts["killed"] += 1
            elif code in SURVIVED:
                counts["survived"] += 1
                survivors.append(key)
            elif code in NO_TESTS:
                counts["no tests"] += 1
                survivors.append(key)
            else:
                counts[f"exit {code}"] += 1
                survivors.append(key)
    return counts, survivors


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("modules", nargs="*", help=f"of {', '.join(MODULES)} (default: all)")
    p.add_argument("--fresh", action="store_true", help="forget earlier results")
    p.add_argument("--max-children", type=int, default=1, help="parallel mutant runs (default 1)")
    p.add_argument("--max-mutants", type=int, help="with --rerun-survivors: a seeded sample of this many")
    p.add_argument("--survivors", action="store_true", help="list the surviving mutants")
    p.add_argument("--rerun-survivors", action="store_true", help="run the surviving mutants again")
    p.add_argument("--quick", action="store_true",
                   help="leave out the slow tests (SLOW); survivors need a full --rerun-survivors")
    p.add_argument("--match", nargs="+", metavar="TEXT",
                   help="with --rerun-survivors: only the survivors whose name holds one of these")
    p.add_argument("--only", nargs="+", metavar="TEST",
                   help="with --rerun-survivors: run only these test files (to show new tests kill)")
    p.add_argument("--report-only", action="store_true", help="tally earlier results, run nothing")
    args = p.parse_args()
    args.modules = args.modules or list(MODULES)
    unknown = [m for m in args.modules if m not in MODULES]
    if unknown:
        p.error(f"unknown module {unknown[0]!r}: choose from {', '.join(MODULES)}")
    if (args.only or args.match) and not args.rerun_survivors:
        p.error("--only and --match pick from the survivors of an earlier run: give --rerun-survivors too")
    if args.max_mutants is not None and not args.rerun_survivors:
        p.error("--max-mutants samples the survivors of an earlier run: give --rerun-survivors too")
    rows = []
    for name in args.modules:
        where = prepare(name, args.fresh and not args.report_only)
        if not args.report_only:
            with open(where / "run.log", "w") as log:
                run(name, args.max_children, args.max_mutants, args.rerun_survivors,
                    left_out(name, args.quick, args.only), args.match, log)
        counts, survivors = tally(where)
        tested = sum(counts.values()) - counts["not run"] - counts["import-time"]
        score = counts["killed"] / tested if tested else float("nan")
        rows.append((name, counts, tested, score))
        if args.survivors:
            for s in survivors:
                print(f"  {name}: {s}")
    print(f"{'module':<10} {'killed':>7} {'survived':>9} {'no tests':>9} {'tested':>7} {'score':>7}"
          f" {'not run':>8} {'import-time':>12}")
    for name, counts, tested, score in rows:
        print(f"{name:<10} {counts['killed']:>7} {counts['survived']:>9} {counts['no tests']:>9} "
              f"{tested:>7} {score:>7.1%} {counts['not run']:>8} {counts['import-time']:>12}")


if __name__ == "__main__":
    main()
