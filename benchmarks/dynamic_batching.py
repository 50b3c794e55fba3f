"""Dynamic batching against DeepSpeed's own `batch_by_seqlens`: the same packs and steps, and
the time to plan an epoch.

    python benchmarks/dynamic_batching.py [--ds-venv benchmarks/.ds-venv] [--out docs/results/dynamic_batching]

Equality: random lengths (1-64, 120 samples, 5 seeds) x max_tokens {128, 512} x
train_batch_size {1, 4, 8} x order {dataloader, seqlen, random} x equal micro-batches (the
pipeline mode) on/off x (min, max) batch size {(1, none), (2, 6)}. DeepSpeed's loop never packs
the last sample of its order, so for the dataloader and seqlen orders DeepSpeed gets one extra
sample appended that sorts last (length max_tokens, the largest id) and must then give exactly
zerotrain's packs, step sizes and longest lengths for the real samples. For the random order
(the extra sample would change the shuffle; 240 samples there) the steps before DeepSpeed's
last one must agree; the table counts the steps compared.

Time: one epoch's plan of 1,000 and 2,000 samples by both, and of 1,000,000 samples by
zerotrain (DeepSpeed's loop tries every end for every pack and sums each candidate whole, so it
grows with the cube of the samples).
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from zerotrain.data.dynamic_batching import batch_by_seqlens  # noqa: E402

DS_CHILD = """
import json, sys, time, logging
logging.disable(logging.WARNING)
from deepspeed.runtime.data_pipeline.data_sampling.variable_batch_size_and_lr import batch_by_seqlens
out = []
for case in json.load(sys.stdin):
    start = time.perf_counter()
    ids, sizes, longest = batch_by_seqlens(case.pop("seqlens"), **case)
    out.append({"ids": ids, "sizes": sizes, "longest": longest, "seconds": time.perf_counter() - start})
json.dump(out, sys.stdout)
"""


def deepspeed(cases: list[dict], python: Path) -> list[dict]:
    r = subprocess.run([str(python), "-c", DS_CHILD], input=json.dumps(cases), capture_output=True, text=True,
                       env={"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    if r.returncode:
        raise SystemExit(f"DeepSpeed's side failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout)


def ours(case: dict) -> dict:
    case = dict(case)
    start = time.perf_counter()
    ids, sizes, longest = batch_by_seqlens(case.pop("seqlens"), **case)
    return {"ids": [[b, list(map(int, p))] for b, p in ids], "sizes": sizes, "longest": longest,
            "seconds": time.perf_counter() - start}


def equality_cases() -> list[dict]:
    cases = []
    for seed, tokens, E, order, equal, (lo, hi) in itertools.product(
            range(5), (128, 512), (1, 4, 8), ("dataloader", "seqlen", "random"), (False, True), ((1, None), (2, 6))):
        lengths = np.random.default_rng(seed).integers(1, 65, 240 if order == "random" else 120).tolist()
        cases.append({"seqlens": lengths, "max_tokens": tokens, "effective_batch_size": E, "min_batch_size": lo,
                      "max_batch_size": hi, "sequence_picking_order": order,
                      "required_microbatches_of_same_size": equal, "seed": seed})
    return cases


def agree(case: dict, mine: dict, theirs: dict) -> tuple[bool, int]:
    """(equal, steps compared)."""
    if case["sequence_picking_order"] != "random":
        return mine == {**theirs, "seconds": mine["seconds"]}, len(mine["sizes"])
    E = case["effective_batch_size"]
    steps = max(min(len(mine["sizes"]), len(theirs["sizes"])) - 1, 0)
    return (mine["ids"][:steps * E] == theirs["ids"][:steps * E]
            and mine["sizes"][:steps] == theirs["sizes"][:steps]), steps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ds-venv", type=Path, default=HERE / ".ds-venv")
    ap.add_argument("--out", type=Path, default=HERE.parent / "docs" / "results" / "dynamic_batching")
    args = ap.parse_args()
    python = args.ds_venv / "bin" / "python"

    cases = equality_cases()
    sent = []
    for case in cases:  # DeepSpeed's input: one extra, last sample for the ordered cases
        extra = dict(case, seqlens=case["seqlens"] + [case["max_tokens"]])
        sent.append(extra if case["sequence_picking_order"] != "random" else dict(case))
    theirs = deepspeed([dict(c) for c in sent], python)
    rows, same = {}, 0
    for case, t in zip(cases, theirs):
        mine = ours(case)
        ok, steps = agree(case, mine, {**t, "ids": [[b, p] for b, p in t["ids"]]})
        key = case["sequence_picking_order"] + (" equal" if case["required_microbatches_of_same_size"] else "")
        rows.setdefault(key, [0, 0, 0])
        rows[key][0] += ok
        rows[key][1] += 1
        rows[key][2] += steps
        same += ok

    timing = []
    for n in (1_000, 2_000):
        lengths = np.random.default_rng(1).integers(1, 513, n).tolist()
        case = {"seqlens": lengths, "max_tokens": 4096, "effective_batch_size": 8}
        timing.append({"samples": n, "deepspeed_s": deepspeed([dict(case)], python)[0]["seconds"],
                       "zerotrain_s": ours(case)["seconds"]})
    lengths = np.random.default_rng(1).integers(1, 513, 1_000_000)
    for equal in (False, True):
        case = {"seqlens": lengths, "max_tokens": 4096, "effective_batch_size": 8,
                "required_microbatches_of_same_size": equal}
        timing.append({"samples": 1_000_000, "equal": equal, "deepspeed_s": None, "zerotrain_s": ours(case)["seconds"]})

    args.out.mkdir(parents=True, exist_ok=True)
    result = {"cases": len(cases), "identical": same, "by_order": rows, "timing": timing}
    (args.out / "results.json").write_text(json.dumps(result, indent=1))
    lines = ["Made by `python benchmarks/dynamic_batching.py` (DeepSpeed 0.19.8 in its venv; one thread, on a",
             "shared 2-core machine: the times are one run each).", "",
             "| order | cases | equal to DeepSpeed | steps compared |", "| --- | --- | --- | --- |"]
    lines += [f"| {k} | {v[1]} | {v[0]} | {v[2]} |" for k, v in rows.items()]
    lines += ["", "| samples | mode | DeepSpeed (s) | zerotrain (s) |", "| --- | --- | --- | --- |"]
    for t in timing:
        mode = "equal micro-batches" if t.get("equal") else "any"
        ds = f"{t['deepspeed_s']:.2f}" if t["deepspeed_s"] is not None else "not run (cubic)"
        lines.append(f"| {t['samples']:,} | {mode} | {ds} | {t['zerotrain_s']:.2f} |")
    table = "\n".join(lines) + "\n"
    (args.out / "table.md").write_text(table)
    print(table)
    if same != len(cases):
        raise SystemExit(f"{len(cases) - same} cases differ from DeepSpeed")


if __name__ == "__main__":
    main()
