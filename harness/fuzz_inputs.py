"""Hostile input at scale: thousands of hypothesis cases per input the user controls.

    python harness/fuzz_inputs.py [--cases 5000] [--seed N] [--limit 5] [--only reader]

Targets: the config loader (Python dicts, plausible blocks with wrong values, files as
bytes / text, JSON of a dict), every data reader (each file suffix, a folder of files, a
saved dataset with one file damaged) and checkpoint loading (a real checkpoint written by an
engine, then one file truncated, bit-flipped, overwritten, replaced, deleted or swapped for
a pickle whose __reduce__ would create a marker file; once with the manifest as saved, once
rewritten to match so the damage reaches the unpickler).

Per case the only allowed failures are ConfigError / DataError / CheckpointError with a
one-line message. Each case runs under a SIGALRM time limit, so a hang is counted instead of
waited on; faulthandler ends the run with every thread's traceback if a case is stuck in C
code past six times that limit. Strategies and checks are tests/fuzzing.py, shared with the
CI fuzz tests. Exit status 1 when any count that must be 0 is not.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import logging
import os
import random
import reprlib
import signal
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
for _name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
    os.environ.pop(_name, None)  # the engine would try to join a world
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import fuzzing  # noqa: E402  (tests/fuzzing.py)
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import seed as hypothesis_seed  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

BAD = ("other", "hangs", "multi-line", "violations")  # counts that must be 0
KINDS = ("cases", "accepted", "expected") + BAD
SHOWN = 5  # distinct problems printed per bad kind and target, one example each
_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 160
_repr.maxlevel, _repr.maxdict, _repr.maxlist = 4, 6, 6


class Hang(BaseException):
    """Raised by SIGALRM. A BaseException, so `except Exception` in the code under test
    (the readers wrap library calls that way) cannot turn a hang into an expected error."""


def _alarm(signum, frame):
    raise Hang()


class Tally:
    def __init__(self, name: str):
        self.name = name
        self.counts = dict.fromkeys(KINDS, 0)
        # (kind, signature) -> [how many, first input, its detail]; the signature is the
        # exception type and the line that raised it, so one bug is shown once.
        self.problems: dict[tuple[str, str], list] = {}
        self.wall = 0.0

    def record(self, kind: str, example, detail: str, signature: str) -> None:
        self.counts[kind] += 1
        key = (kind, signature)
        if key in self.problems:
            self.problems[key][0] += 1
        elif sum(k == kind for k, _ in self.problems) < SHOWN:
            self.problems[key] = [1, _repr.repr(example), detail]


def _signature(err: BaseException) -> str:
    frames = traceback.extract_tb(err.__traceback__)
    frame = frames[-2] if isinstance(err, Hang) and len(frames) > 1 else frames[-1]  # not _alarm's own
    return f"{type(err).__name__} at {frame.filename}:{frame.lineno}"


def run_case(tally: Tally, check, args: tuple, limit: float) -> None:
    tally.counts["cases"] += 1
    signal.setitimer(signal.ITIMER_REAL, limit)
    faulthandler.dump_traceback_later(limit * 6, exit=True)
    try:
        try:
            err = check(*args)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            faulthandler.cancel_dump_traceback_later()
    except Hang as hang:
        tally.record("hangs", args, f"still running after {limit:g} s:\n{traceback.format_exc(limit=-8)}",
                     _signature(hang))
        return
    except fuzzing.Violation as broken:
        tally.record("violations", args, str(broken), str(broken).split(":")[0])
        return
    except Exception as other:
        tally.record("other", args, traceback.format_exc(limit=-8), _signature(other))
        return
    if err is None:
        tally.counts["accepted"] += 1
        return
    tally.counts["expected"] += 1
    if not fuzzing.one_line(err):
        tally.record("multi-line", args, f"{type(err).__name__}: {str(err)!r}", _signature(err))


def fuzz(name: str, strategy, check, cases: int, seed: int, limit: float) -> Tally:
    """Run `check(*example)` on `cases` examples of `strategy` (a tuple strategy). Nothing is
    raised back into hypothesis, so it neither stops at the first problem nor shrinks."""
    tally = Tally(name)

    @hypothesis_seed(seed)
    @settings(max_examples=cases, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def one(example):
        run_case(tally, check, example, limit)

    start = time.perf_counter()
    one()
    tally.wall = time.perf_counter() - start
    return tally


# ---- fixtures the targets damage -------------------------------------------------------------
def save_checkpoint(save_dir: Path):
    """A real checkpoint: a small MLP trained two steps with AdamW (model, optimizer, RNG)."""
    import torch

    import zerotrain

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    engine, *_ = zerotrain.initialize(model=model, config={
        "train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}})
    for _ in range(2):
        x, y = torch.randn(2, 6), torch.randn(2, 3)
        engine.backward(((engine(x) - y) ** 2).mean())
        engine.step()
    engine.save_checkpoint(save_dir)
    return engine


def save_dataset(folder: Path) -> list[str]:
    import datasets

    datasets.Dataset.from_dict({"text": ["a line", "another", ""], "label": [0, 1, 0]}).save_to_disk(str(folder))
    return sorted(p.name for p in folder.iterdir())


def payload_runs_code(marker: Path) -> bool:
    """Control: the unsafe pickles really do create the marker when loaded without weights_only,
    so a marker that never appears during fuzzing means something."""
    import io
    import pickle

    import torch

    pickle.loads(fuzzing.unsafe_pickle("pickle", marker))
    bare = marker.exists()
    marker.unlink(missing_ok=True)
    torch.load(io.BytesIO(fuzzing.unsafe_pickle("nested", marker)), weights_only=False)
    nested = marker.exists()
    marker.unlink(missing_ok=True)
    return bare and nested


def targets(tmp: Path):
    """(name, strategy of argument tuples, check) for every input the user controls."""
    worlds = st.integers(1, 4)
    yield "config dict", st.tuples(st.one_of(fuzzing.configs, fuzzing.python_configs), worlds), fuzzing.config_case
    yield "config plausible", st.tuples(fuzzing.plausible, worlds), fuzzing.config_case
    config_file = tmp / "ds.json"
    yield ("config file", st.tuples(fuzzing.config_file_contents),
           lambda content: fuzzing.config_file_case(config_file, content))
    yield ("config file (JSON dict)", st.tuples(fuzzing.configs),
           lambda config: fuzzing.config_file_case(config_file, json.dumps(config, allow_nan=True)))
    for suffix in fuzzing.READER_SUFFIXES:
        path = tmp / f"train{suffix}"
        yield (f"reader {suffix}", st.tuples(fuzzing.contents),
               lambda content, path=path: fuzzing.reader_case(path, content))
    yield ("reader folder", st.tuples(fuzzing.folders),
           lambda files: fuzzing.folder_case(tmp / "folder", files))
    names = save_dataset(tmp / "saved")
    yield ("reader saved dataset", st.tuples(st.sampled_from(names), fuzzing.damages),
           lambda name, how: fuzzing.saved_dataset_case(tmp / "saved", tmp / "saved_work", name, how))
    engine = save_checkpoint(tmp / "ckpt")
    marker = tmp / "code_ran"
    yield ("checkpoint", st.tuples(st.sampled_from(fuzzing.CHECKPOINT_FILES + ["manifest.json", "latest"]),
                                   fuzzing.checkpoint_damages),
           lambda name, how: fuzzing.checkpoint_case(engine.load_checkpoint, tmp / "ckpt", tmp / "ckpt_work", name,
                                                     how, marker))
    yield ("checkpoint, re-hashed", st.tuples(st.sampled_from(fuzzing.CHECKPOINT_FILES), fuzzing.checkpoint_damages),
           lambda name, how: fuzzing.checkpoint_case(engine.load_checkpoint, tmp / "ckpt", tmp / "ckpt_work", name,
                                                     how, marker, rehash=True))


def table(tallies: list[Tally]) -> str:
    """Markdown table, one row per target and a total."""
    head = ["target", "cases", "accepted", "expected errors", "other exceptions", "hangs", "multi-line",
            "violations", "wall s"]
    rows = [[t.name, *(str(t.counts[k]) for k in KINDS), f"{t.wall:.1f}"] for t in tallies]
    rows.append(["total", *(str(sum(t.counts[k] for t in tallies)) for k in KINDS),
                 f"{sum(t.wall for t in tallies):.1f}"])
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]

    def line(cells: list[str]) -> str:
        padded = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))]
        return "| " + " | ".join(padded) + " |"

    return "\n".join([line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in rows])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=5000, help="hypothesis examples per target")
    parser.add_argument("--seed", type=int, default=None, help="hypothesis seed (default: random, printed)")
    parser.add_argument("--limit", type=float, default=5.0, help="seconds one case may run before it counts as a hang")
    parser.add_argument("--only", default="", help="run the targets whose name contains this")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(2**32)

    import datasets
    import torch

    torch.set_num_threads(1)
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    logging.getLogger("zerotrain").setLevel(logging.ERROR)  # fallback warnings on damaged checkpoints
    warnings.simplefilter("ignore")
    signal.signal(signal.SIGALRM, _alarm)

    tallies = []
    with tempfile.TemporaryDirectory(prefix="zerotrain-fuzz-") as tmp_text:
        tmp = Path(tmp_text)
        if not payload_runs_code(tmp / "control"):
            print("control failed: the unsafe pickle does not run code even with plain pickle", file=sys.stderr)
            return 2
        print(f"seed {seed}, {args.cases} cases per target, {args.limit:g} s per case; "
              "control: the unsafe pickles create their marker under plain pickle", flush=True)
        for name, strategy, check in targets(tmp):
            if args.only not in name:
                continue
            tally = fuzz(name, strategy, check, args.cases, seed, args.limit)
            tallies.append(tally)
            print(f"  {name}: {tally.counts['cases']} cases in {tally.wall:.1f} s", file=sys.stderr, flush=True)
            for (kind, signature), (count, example, detail) in tally.problems.items():
                print(f"\n--- {name}: {kind}, {count} cases: {signature}\nfirst input: {example}\n"
                      f"{detail.rstrip()}\n", flush=True)
    print(table(tallies))
    bad = {k: sum(t.counts[k] for t in tallies) for k in BAD}
    if any(bad.values()):
        print("FAIL: " + ", ".join(f"{n} {k}" for k, n in bad.items() if n) + f" (rerun with --seed {seed})")
        return 1
    print("OK: only one-line ConfigError / DataError / CheckpointError, no hangs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
