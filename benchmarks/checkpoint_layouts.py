"""A checkpoint resumes on any layout: the matrix of layout changes, each resumed run's next
losses against those of the run that never stopped (on its own layout).

    python benchmarks/checkpoint_layouts.py                         # every part
    python benchmarks/checkpoint_layouts.py --parts stage_data offload --minutes 20

Parts (gloo worlds of 1, 2 and 4 CPU processes; small models; gradient clipping 1.0, AdamW):

    stage_data   ZeRO stage 0-3 x data-parallel size 1, 2, 4, every source to every target
                 (zerotrain's GPT, 2 layers, 4 heads, width 32)
    offload      optimizer offload none / cpu / nvme at stage 1-3 on 2 ranks, resumed with
                 every offload on 2 ranks and on 1 process
    tensor       data x tensor-parallel sizes (1x1, 2x1, 4x1, 1x2, 2x2, 1x4) at stage 1, every
                 source to every target (target stage 1; the vocabulary split where it divides)
    pipeline     a PipelineModule of 8 layers (tied embedding) as pipeline x tensor x data
                 (2x1x1, 2x2x1, 4x1x1, 1x2x2, 2x1x2, 1x1x1, 1x1x2, 1x1x4, 1x2x1) at stage 1,
                 every source to every target

Every source trains K steps, saves, and trains N more (the run that never stopped); every
target loads the checkpoint and trains the same N steps. A cell is the largest relative
difference of the N global losses (the mean over data-parallel ranks), or the first line of
the error. Writes docs/results/checkpoint_layouts/{results.md,results.json} (the JSON after
every cell, so a stopped run keeps what it measured). Runs the test suite's scenario code
(tests/distributed: the same models and batches the tests use).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests" / "distributed"))
sys.path.insert(0, str(ROOT / "src"))

OUT = ROOT / "docs" / "results" / "checkpoint_layouts"
K, N = 2, 2  # steps before the checkpoint, steps after it
GLOBAL, MICRO = 8, 2
PARTS = ("stage_data", "tensor", "offload", "pipeline")


# ---- what each rank runs (module level: spawned ranks unpickle them) ---------------------------
def gpt_run(cfg: dict, steps: int, save=None, load=None) -> list[float]:
    import tp_scenarios as ts

    return ts.train(cfg, steps, save=save, load=load)["losses"]


def pipe_run(cfg: dict, steps: int, layout: tuple, save=None, load=None) -> list[float]:
    import pipe_scenarios as ps
    from zerotrain.pipe import PipeModelDataParallelTopology

    p, t, d = layout
    topology = PipeModelDataParallelTopology(num_pp=p, num_mp=t, num_dp=d)
    return ps.pipeline_run(cfg, steps, save=save, load=load, topology=topology)["losses"]


# ---- the layouts -------------------------------------------------------------------------------
def gpt_config(stage: int, tensor: int = 1, device: str = "none", nvme: str = "") -> dict:
    import tp_scenarios as ts

    zero = {"stage": stage}
    if device != "none":
        zero["offload_optimizer"] = {"device": device, "nvme_path": nvme}
    return ts.config(GLOBAL, MICRO, stage, tensor=tensor, curriculum=False, zero_optimization=zero)


def pipe_config() -> dict:
    import pipe_scenarios as ps

    return ps.config(GLOBAL, MICRO, 1, curriculum=False, pld=False)


def cases(part: str, nvme: str) -> list[tuple[str, int, object]]:
    """(label, world size, run(steps, save, load) -> what the pool runs) of a part's layouts."""
    out = []
    if part == "stage_data":
        for stage in range(4):
            for d in (1, 2, 4):
                out.append((f"stage {stage} x {d}", d, (gpt_run, gpt_config(stage))))
    elif part == "offload":
        for stage in (1, 2, 3):
            for device in ("none", "cpu", "nvme"):
                for d in (2, 1):
                    out.append((f"stage {stage} {device} x {d}", d, (gpt_run, gpt_config(stage, device=device,
                                                                                     nvme=nvme))))
    elif part == "tensor":
        for d, t in ((1, 1), (2, 1), (4, 1), (1, 2), (2, 2), (1, 4)):
            out.append((f"d{d} t{t}", d * t, (gpt_run, gpt_config(1, tensor=t))))
    elif part == "pipeline":
        for p, t, d in ((2, 1, 1), (2, 2, 1), (4, 1, 1), (1, 2, 2), (2, 1, 2), (1, 1, 1), (1, 1, 2), (1, 1, 4),
                        (1, 2, 1)):  # pipelines first: a run cut short by --minutes still has them
            out.append((f"p{p} t{t} d{d}", p * t * d, (pipe_run, pipe_config(), (p, t, d))))
    return out


def sources_and_targets(part: str, nvme: str):
    """The offload part resumes each 2-rank source on every offload at its stage, on 2 ranks and
    1 (stage_data changes the stage); [(source, its targets)]."""
    all_cases = cases(part, nvme)
    if part != "offload":
        return [(c, all_cases) for c in all_cases]
    return [(c, [t for t in all_cases if t[0].split()[1] == c[0].split()[1]]) for c in all_cases if c[1] == 2]


def call(pools: dict, world: int, spec, steps: int, save=None, load=None) -> list[float]:
    fn, cfg, *rest = spec
    ranks = pools[world].run(fn, cfg, steps, *rest, save=save, load=load, timeout=600)
    if fn is pipe_run:  # every rank returns the global batch's mean loss
        return ranks[0]
    return [sum(step) / len(step) for step in zip(*ranks)]  # tensor ranks of a data index agree


def relative(a: list[float], b: list[float]) -> float:
    if len(a) != len(b):  # a resume that did not continue from the saved step
        raise AssertionError(f"{len(a)} steps after loading, {len(b)} expected")
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


# ---- the report ---------------------------------------------------------------------------------
def cell(value) -> str:
    if isinstance(value, str):
        return "error: " + value[:60].replace("|", "/")
    return "0" if value == 0 else f"{value:.1e}"


def tables(results: dict) -> str:
    lines = []
    for part, rec in results["parts"].items():
        rows = rec["rows"]
        targets = list(dict.fromkeys(t for row in rows.values() for t in row))
        lines += [f"### {part}", "", f"`{rec['command']}`: wall {rec['wall_s']:.0f} s, "
                  + ("complete." if rec["complete"] else "stopped at its time limit (rows not run are marked)."), "",
                  "| saved \\ resumed | " + " | ".join(targets) + " |", "|---" * (len(targets) + 1) + "|"]
        for source in rec["sources"]:  # a cell this part does not plan (offload: another stage) is "-"
            row = rows.get(source)
            lines.append(f"| {source} | " + " | ".join("not run" if row is None else cell(row[t]) if t in row else "-"
                                                       for t in targets) + " |")
        numbers = [v for row in rows.values() for v in row.values() if not isinstance(v, str)]
        failed = sum(isinstance(v, str) for row in rows.values() for v in row.values())
        lines += ["", f"{len(numbers)} cells measured, largest difference {max(numbers, default=0):.1e}; "
                      f"{failed} errors.", ""]
    return "\n".join(lines)


def write(results: dict) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "results.json").write_text(json.dumps(results, indent=1))
    head = ["# Checkpoint layout changes", "",
            "Each cell: the largest relative difference between the resumed run's next "
            f"{N} losses and those of the run that never stopped ({K} steps saved, clipping 1.0, AdamW, fp32). "
            "Rows: the layout that saved; columns: the layout that resumed. Made by "
            "`benchmarks/checkpoint_layouts.py` (its docstring describes the parts).", "",
            f"Machine: {results['machine']}.", ""]
    (OUT / "results.md").write_text("\n".join(head) + tables(results) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--minutes", type=float, default=30.0, help="stop starting sources after this long")
    parser.add_argument("--keep", action="store_true", help="keep the other parts already in results.json")
    args = parser.parse_args()
    from world import WorldPool

    start = time.time()
    command = "python benchmarks/" + " ".join([Path(sys.argv[0]).name] + sys.argv[1:])
    results = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs (shared)", "K": K, "N": N, "parts": {}}
    if args.keep and (OUT / "results.json").is_file():
        results["parts"] = {k: v for k, v in json.loads((OUT / "results.json").read_text())["parts"].items()
                            if k not in args.parts}
    work = Path(tempfile.mkdtemp(prefix="ckpt-layouts-"))
    nvme = work / "swap"
    nvme.mkdir()
    pools = {n: WorldPool(n) for n in (1, 2, 4)}
    done = 0  # sources measured
    try:
        for part in args.parts:
            plan = sources_and_targets(part, str(nvme))
            rec = results["parts"][part] = {"command": command, "wall_s": 0.0, "complete": False,
                                            "sources": [c[0] for c, _ in plan], "rows": {}}
            began = time.time()
            for (label, world, spec), targets in plan:
                if done and time.time() - start > args.minutes * 60:
                    break
                ckpt = work / "ckpt"
                shutil.rmtree(ckpt, ignore_errors=True)
                row = rec["rows"].setdefault(label, {})
                try:
                    full = call(pools, world, spec, K + N, save=(str(ckpt), K))
                except AssertionError as e:  # the source layout itself does not run
                    row.update({t: str(e).strip().splitlines()[-1] for t, *_ in targets})
                    continue
                for target, t_world, t_spec in targets:
                    try:
                        got = call(pools, t_world, t_spec, K + N, load=str(ckpt))
                        row[target] = relative(got, full[K:])
                    except AssertionError as e:
                        row[target] = str(e).strip().splitlines()[-1]
                    rec["wall_s"] = time.time() - began
                    write(results)
                done += 1
                print(f"{part} {label}: " + ", ".join(f"{t}={cell(v)}" for t, v in row.items()), flush=True)
            rec["complete"] = len(rec["rows"]) == len(rec["sources"])
            rec["wall_s"] = time.time() - began
            write(results)
    finally:
        for pool in pools.values():
            pool.close()
        shutil.rmtree(work, ignore_errors=True)
    print(tables(results))


if __name__ == "__main__":
    main()
