"""The longest sequence a ~20M-parameter LLaMA-shaped model trains within a peak-RSS budget
per rank, with 1, 2 and 4 sequence-parallel ranks (Ulysses), ALST's memory pieces on and off,
zerotrain and DeepSpeed 0.19.8's ALST.

    python benchmarks/long_context.py --bisect --budget-gib 0.9     # a search by trials (about an hour)
    python benchmarks/long_context.py                               # the line through two lengths, 3 GiB
    python benchmarks/long_context.py --quick --out /tmp/lc         # a tiny model, seconds (the test's mode)

The model is transformers' LlamaForCausalLM built from a LlamaConfig here (no download): 4
layers, hidden 512, 8 heads (4 key/value), MLP 1376, vocabulary 8192 untied: 20.2M
parameters. Each trial is a fresh torchrun world of S processes (one thread each) training
--memory-steps steps (forward, backward, AdamW step; ZeRO stage 1 over the S ranks) on one
sequence of the length tried, 2 by default: AdamW's states (8 bytes a parameter, split over
the S ranks) are made by the first step, so only the second step's forward and backward run
beside them, as every later step of a real run does; each rank reads its peak RSS (VmHWM, /proc/self/status), and a watcher
thread ends the trial as soon as any rank passes the budget, noting the phase (set-up,
forward/backward or the optimizer step). A trial that runs past --trial-timeout is killed
with all its ranks.

--bisect searches the longest length by trials: at S = 1 doubling from --start until one
fails, at S > 1 from the previous size's longest scaled by the sizes' ratio (up or down by
1.25x), then halving the bracket until it is within --resolution (1/8) of the longest. A
rank's peak through forward and backward is close to a line in its share of the sequence,
fixed + slope x T / S, with the tiled pieces on and attention that keeps no (T x T) scores
(torch's CPU flash kernel); the line through each search's two longest trials gives the
secondary figure, where it crosses --line-budget-gib (3 GiB). Trials far out are slow here
(attention is quadratic: 8K positions at S = 1 take 7 minutes on this 2-core machine), which
is why the searched budget is small. Without --bisect the line is measured at two lengths per
rank (--locals) instead, at --budget-gib.

"pieces on" is ALST's set: TiledMLP over tiles of 512 positions, the loss over tiles of 1024
positions (TiledFusedLogitsLoss: the logits never whole), every decoder layer checkpointed
(recomputed in backward). Checkpoint offload to host memory changes nothing on a CPU (the
inputs are in host memory already), so it is not a separate row here.

Every trial runs with glibc's MALLOC_MMAP_THRESHOLD_=131072 (--mmap-threshold): allocations
from 128 KiB up are mapped on their own and returned to the system when freed. Under glibc's
default the threshold grows to the largest block freed (up to 32 MiB), so later activation
buffers come from the heap and stay resident after use: at S = 2, 3072 tokens, pieces on,
the peak was 1012 MiB per rank with the default against 684 MiB with the threshold fixed,
which would measure the allocator, not the training.

Step time: at --rate-len, pieces on, S = 1 and S = 2 alternating for --rate-pairs pairs (the
machine's load drifts), two steps each, the second step's time; the ratio of the medians.
DeepSpeed's ALST runs the same trials in its own venv (--ds-venv) with transformers (and the
same torch version) from this one on the path: the step times at S = 1 and 2, and with
--bisect its longest lengths. Results: <out>/results.json, results.md, longest.png, raw/.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import common  # noqa: E402

FULL = dict(vocab_size=8192, hidden_size=512, intermediate_size=1376, num_hidden_layers=4, num_attention_heads=8,
            num_key_value_heads=4)
QUICK = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2)
MLP_TILE, LOSS_TILE = 512, 1024  # positions per tile


# ---- worker: one trial on every rank of a torchrun job ---------------------------------------

fb_peaks: list[int] = []  # the peak after each backward, before the optimizer step
phase = ["init"]  # where the rank is: init, forward/backward, step (read by the watcher)


def _watch(budget_kib: int, out: Path, rank: int) -> None:
    """End the job the moment this rank's peak RSS passes the budget, saying in which phase."""
    while True:
        peak = common.status_kib("VmHWM")
        if peak > budget_kib:
            out.with_suffix(f".over{rank}").write_text(f"{peak} {phase[0]}")
            os._exit(3)
        time.sleep(0.02)


def _model(framework: str, shape: dict, pieces: bool, local: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(max_position_embeddings=1 << 22, tie_word_embeddings=False, **shape)
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg)
    if pieces:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        mlp, loss = max(1, math.ceil(local / MLP_TILE)), max(1, math.ceil(local / LOSS_TILE))
        if framework == "zerotrain":
            from zerotrain.parallel.sequence.tiled import tile_model

            tile_model(model, mlp, loss)
        else:
            _deepspeed_tiles(model, mlp)
    return model


def _deepspeed_tiles(model, shards: int) -> None:
    """DeepSpeed's way: each MLP's forward through its TiledMLP (the loss is tiled in the loop)."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledMLP

    for m in model.modules():
        if type(m).__name__.endswith("MLP"):
            plain = type(m).forward
            m.forward = lambda x, m=m, plain=plain: TiledMLP.apply(plain, m, x, shards, list(m.parameters()))


def worker(a) -> None:
    import torch

    torch.set_num_threads(1)
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    out = Path(a.out)
    threading.Thread(target=_watch, args=(int(a.budget_gib * 2**20), out, rank), daemon=True).start()
    shape = QUICK if a.quick else FULL
    local = a.length // size
    config = {"train_batch_size": 1, "train_micro_batch_size_per_gpu": 1, "sequence_parallel_size": size,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}, "zero_optimization": {"stage": a.zero}}
    if a.worker == "zerotrain":
        import zerotrain

        model = _model("zerotrain", shape, a.pieces, local)
        engine, *_ = zerotrain.initialize(model=model, config=config)

        def step(ids):
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            return loss

        optimizer_step = engine.step
    else:
        step, optimizer_step = _deepspeed_step(a, shape, local, config)
    init_kib = common.status_kib("VmHWM")
    g = torch.Generator().manual_seed(0)
    times, cpu, losses = [], [], []
    for _ in range(a.steps):
        ids = torch.randint(0, shape["vocab_size"], (1, a.length), generator=g)
        start, cpu_start = time.perf_counter(), time.process_time()
        phase[0] = "forward/backward"
        loss = step(ids)
        fb_peaks.append(common.status_kib("VmHWM"))
        phase[0] = "step"
        optimizer_step()
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - cpu_start)  # this rank's CPU seconds: the machine's load left out
        losses.append(loss.item())
    mine = {"peak_kib": common.status_kib("VmHWM"), "init_peak_kib": init_kib, "fb_peak_kib": fb_peaks[0],
            "cpu_s": cpu}
    every = [mine]
    if size > 1:  # the benchmark's own report, gathered once at the end
        import torch.distributed as dist

        every = [None] * size
        dist.all_gather_object(every, mine)
    if rank == 0:
        out.write_text(json.dumps({**{k: [r[k] for r in every] for k in mine}, "times": times, "losses": losses,
                                   "torch": torch.__version__}))


def _deepspeed_step(a, shape: dict, local: int, config: dict):
    """DeepSpeed's ALST as its tutorial wires it: register_with_transformers, the mpu into
    initialize, the loader adapter's pieces, TiledMLP and TiledFusedLogitsLoss. At S = 1
    register_with_transformers returns no mpu (DeepSpeed's own rule): the plain model, with the
    same tiled pieces and the labels shifted here."""
    import deepspeed
    import torch
    import torch.nn.functional as F
    from deepspeed.runtime.sequence_parallel.ulysses_sp import (TiledFusedLogitsLoss, UlyssesSPAttentionHF,
                                                                UlyssesSPDataLoaderAdapter)

    deepspeed.init_distributed(dist_backend="gloo")
    size = int(os.environ["WORLD_SIZE"])
    model = _model("deepspeed", shape, a.pieces, local)
    mpu = UlyssesSPAttentionHF.register_with_transformers(model_name_or_path=model, core_attn_implementation="sdpa",
                                                          sequence_parallel_size=size, micro_batch_size=1,
                                                          seq_length=a.length, seq_length_is_variable=True)
    # torch's AdamW as the client optimizer (DeepSpeed's ZeRO 1 wraps it): the same kernel as
    # zerotrain's, and no JIT-built op (DeepSpeed's CPU Adam compiles for minutes here)
    opt = torch.optim.AdamW(model.parameters(), **config.pop("optimizer")["params"])
    engine, *_ = deepspeed.initialize(model=model, config=config, mpu=mpu, optimizer=opt)
    group = mpu and mpu.get_sequence_parallel_group()

    def piece_of(ids):
        batch = {"input_ids": ids, "labels": ids, "position_ids": torch.arange(ids.shape[1]).unsqueeze(0)}
        if mpu is None:
            return {"input_ids": ids, "position_ids": batch["position_ids"]}, F.pad(ids[:, 1:], (0, 1), value=-100)
        adapter = UlyssesSPDataLoaderAdapter([batch], sp_rank=mpu.get_sequence_parallel_rank(), sp_group=group,
                                             sp_world_size=size, device=torch.device("cpu"))
        piece = next(iter(adapter))
        piece.pop("labels", None)
        return piece, piece.pop("shift_labels")

    def step(ids):
        piece, targets = piece_of(ids)
        hidden = engine.module.model(**piece).last_hidden_state
        if a.pieces:
            def loss_fn(head, x, y):
                return F.cross_entropy(head(x).float(), y, ignore_index=-100, reduction="sum")

            shards = max(1, math.ceil(hidden.shape[1] / LOSS_TILE))
            total = TiledFusedLogitsLoss.apply(loss_fn, engine.module.lm_head, hidden, targets, None, shards,
                                               [engine.module.lm_head.weight], "sum")
        else:
            total = F.cross_entropy(engine.module.lm_head(hidden).flatten(0, 1).float(), targets.flatten(),
                                    ignore_index=-100, reduction="sum")
        count = (targets != -100).sum().float()
        stats = torch.stack((total.detach(), count))
        torch.distributed.all_reduce(stats, group=group)
        loss = total * size / stats[1]  # the data x sequence gradient mean divides by size again
        engine.backward(loss)
        return stats[0] / stats[1]

    return step, engine.step


# ---- driver ------------------------------------------------------------------------------

def trial(a, framework: str, size: int, length: int, pieces: bool, steps: int = 1, budget: float | None = None) -> dict:
    """One torchrun job; {"ok": ..., "peak_mib": ..., ...} or the reason it failed ("over
    budget" with the phase the rank was in: init, forward/backward or step)."""
    budget = a.budget_gib if budget is None else budget
    out = a.log_dir / f"{framework}-s{size}-{length}-{int(pieces)}-{time.monotonic_ns()}.json"
    py = common.DS_VENV / "bin" / "python" if framework == "deepspeed" else Path(sys.executable)
    cmd = [py, "-m", "torch.distributed.run", "--nproc_per_node", size, "--master_port", common.free_port(),
           __file__, "--worker", framework, "--length", length, "--budget-gib", budget, "--zero", a.zero,
           "--steps", steps, "--out", out] + (["--pieces"] if pieces else []) + (["--quick"] if a.quick else [])
    env = common.venv_env(common.DS_VENV if framework == "deepspeed" else Path(sys.prefix))
    paths = [str(common.SRC) if framework == "zerotrain" else _overlay()]
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")])
    if a.mmap_threshold:  # see the module docstring: the peak is then the live memory's
        env["MALLOC_MMAP_THRESHOLD_"] = str(a.mmap_threshold)
    start = time.perf_counter()
    log = out.with_suffix(".log")
    code = common.run_job(cmd, env, log, a.trial_timeout)
    wall = time.perf_counter() - start
    over = sorted(a.log_dir.glob(out.name.replace(".json", ".over*")))
    if over:
        peak, where = over[0].read_text().split(" ", 1)
        return {"ok": False, "why": "over budget", "phase": where, "peak_mib": int(peak) / 1024, "wall_s": wall}
    if code is None:
        return {"ok": False, "why": f"timed out after {a.trial_timeout} s", "wall_s": wall}
    if code != 0 or not out.exists():
        return {"ok": False, "why": _exception_line(log.read_text(errors="replace")), "wall_s": wall}
    log.unlink()
    res = json.loads(out.read_text())
    return {"ok": True, "peak_mib": max(res["peak_kib"]) / 1024, "init_mib": max(res["init_peak_kib"]) / 1024,
            "fb_peak_mib": max(res["fb_peak_kib"]) / 1024, "times": res["times"], "losses": res["losses"],
            "cpu_s": [max(steps) for steps in zip(*res["cpu_s"])],  # per step, the busiest rank's
            "torch": res["torch"], "wall_s": wall}


_overlays: list[str] = []


def _overlay() -> str:
    """A folder of links to the packages of this venv that DeepSpeed's lacks (transformers and
    what it imports), for DeepSpeed's trials: they then import DeepSpeed's own torch, numpy and
    the rest, and its JIT-built ops match the torch they were built against (with this venv's
    site-packages ahead, every trial rebuilt them, minutes each)."""
    if not _overlays:
        import tempfile

        import transformers

        mine = Path(transformers.__file__).parents[1]
        theirs = next(common.DS_VENV.glob("lib/python*/site-packages"))
        folder = Path(tempfile.mkdtemp(prefix="long_context-hf-"))
        for entry in mine.iterdir():
            if not (theirs / entry.name).exists():
                (folder / entry.name).symlink_to(entry)
        _overlays.append(str(folder))
    return _overlays[0]


def _exception_line(text: str) -> str:
    """The exception a rank raised (the line that ends its first traceback)."""
    lines = text.splitlines()
    at = next((i for i, ln in enumerate(lines) if ln.startswith("Traceback") or "]: Traceback" in ln), None)
    if at is not None:
        ends = [ln.split("]: ", 1)[-1] for ln in lines[at + 1:]]
        ends = [ln for ln in ends if ln and not ln[0].isspace() and not ln.startswith("Traceback")]
        if ends:
            return ends[0].strip()[:400]
    return text.strip()[-300:]


def _say_trial(framework: str, size: int, pieces: bool, length: int, res: dict) -> None:
    what = "ok" if res["ok"] else res["why"] + (f" in {res['phase']}" if "phase" in res else "")
    common.say(f"  {framework} S={size} pieces={'on' if pieces else 'off'} T={length}: {what}, "
               f"peak {res.get('peak_mib', float('nan')):.0f} MiB ({res['wall_s']:.0f} s)")


def search(a, framework: str, size: int, pieces: bool, start: int, factor: float) -> dict:
    """The longest length within the budget by trials: from `start` (for S > 1 the longest at the
    previous S scaled by the sizes' ratio) up or down by `factor` until a success and a failure
    bracket it, then halving the bracket until it is within --resolution of the success. Stops
    early when the optimizer step or the set-up alone passes the budget (no length fits)."""
    unit = 64 * size
    tried, good, bad = [], None, None

    def snap(x: float) -> int:
        return max(unit, int(x) // unit * unit)

    length = snap(start)
    while length <= a.max_len:
        res = trial(a, framework, size, length, pieces, steps=a.memory_steps)
        tried.append({"length": length, **res})
        _say_trial(framework, size, pieces, length, res)
        if not res["ok"] and res["why"] != "over budget":
            return {"longest": good, "error": res["why"], "trials": tried}
        if not res["ok"] and res["phase"] != "forward/backward":
            return {"longest": good, "error": f"over the budget in the {res['phase']} at any length", "trials": tried}
        if res["ok"]:
            good = length
        else:
            bad = length
        if good is None:
            nxt = snap(length / factor)
        elif bad is None:
            nxt = snap(length * factor)
        elif bad - good <= max(unit, good * a.resolution):
            break
        else:
            nxt = snap((good + bad) / 2)
        if nxt in (good, bad) or nxt == length:
            break
        length = nxt
    best = next((t for t in tried if t["length"] == good), None)
    return {"longest": good, "first_failed": bad, "peak_mib": best and best["peak_mib"],
            "tokens_per_s": best and good / best["times"][-1], "trials": tried}


def fit(a, size: int, pieces: bool) -> dict:
    """The peak per rank at two lengths, the line through them, and where it crosses the budget."""
    points = []
    for local in a.locals:
        res = trial(a, "zerotrain", size, local * size, pieces, steps=a.memory_steps)
        points.append({"length": local * size, **res})
        _say_trial("zerotrain", size, pieces, local * size, res)
    ok = [p for p in points if p["ok"]]
    if len(ok) < 2:
        return {"longest": None, "error": next((p["why"] for p in points if not p["ok"]), "no two points"),
                "points": points}
    return {**line_through(ok, size, a.budget_gib * 1024), "init_mib": ok[-1]["init_mib"], "points": points}


def line_of_search(found: dict, size: int, budget_mib: float) -> dict | None:
    """The line through a search's two longest successful trials (the longer the lengths, the
    closer the line to the peaks far out), and its crossing of `budget_mib`."""
    ok = sorted((t for t in found["trials"] if t["ok"]), key=lambda t: t["length"])[-2:]
    return line_through(ok, size, budget_mib) if len(ok) == 2 else None


def rates(a) -> dict:
    """Step time at --rate-len, S = 1 and S = 2 alternating (the machine's load drifts; the
    pairs see the same drift), pieces on, two steps each: the second step's time (the first
    makes the optimizer's states). The ratio is of the medians."""
    runs = {"S1": [], "S2": []}
    for i in range(a.rate_pairs):
        for size in (1, 2) if i % 2 == 0 else (2, 1):
            res = trial(a, "zerotrain", size, a.rate_len, True, steps=2, budget=a.rate_budget_gib)
            runs[f"S{size}"].append(res)
            common.say(f"  rate S={size} T={a.rate_len}: " + (f"{res['times'][-1]:.1f} s/step" if res["ok"] else res["why"]))
    return {"length": a.rate_len, "runs": runs, **rate_medians(runs)}


def rate_medians(runs: dict) -> dict:
    """The medians of the second steps' wall and CPU seconds (the busiest rank's), S = 2 over S = 1."""
    med, cpu = {}, {}
    for key, v in runs.items():
        ok = [r for r in v if r["ok"]]
        if ok:
            med[key] = statistics.median(r["times"][-1] for r in ok)
            if all("cpu_s" in r for r in ok):
                cpu[key] = statistics.median(r["cpu_s"][-1] for r in ok)
    return {"median_s": med, "ratio": med["S2"] / med["S1"] if len(med) == 2 else None,
            "median_cpu_s": cpu, "cpu_ratio": cpu["S2"] / cpu["S1"] if len(cpu) == 2 else None}


def line_through(ok: list[dict], size: int, budget: float) -> dict:
    """The line fixed + slope x (T / S) through the first two measured peaks, and the longest T,
    in whole multiples of 64 x S positions, at which it stays within the budget (None when the
    peak does not grow with length, or the optimizer step alone is over the budget)."""
    (l0, m0), (l1, m1) = [(p["length"] / size, p["fb_peak_mib"]) for p in ok[:2]]
    slope = (m1 - m0) / (l1 - l0)  # MiB per position of the rank's share, through backward
    fixed = m0 - slope * l0
    step_peak = max(p["peak_mib"] for p in ok)  # the optimizer step's (its states come with the first step)
    longest = None
    if slope > 0 and step_peak <= budget:
        longest = int((budget - fixed) / slope * size) // (64 * size) * (64 * size)
    return {"longest": longest, "fixed_mib": fixed, "kib_per_position": slope * 1024, "step_peak_mib": step_peak}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budget-gib", type=float, default=3.0, help="peak RSS per rank (default 3 GiB)")
    p.add_argument("--line-budget-gib", type=float, default=3.0,
                   help="--bisect: where the line through the longest trials crosses (default 3 GiB)")
    p.add_argument("--sizes", default="1,2,4", help="sequence-parallel sizes (default 1,2,4)")
    p.add_argument("--locals", default="1024,2048", help="positions per rank the line is measured at")
    p.add_argument("--bisect", action="store_true", help="search the longest length by trials (no --locals line)")
    p.add_argument("--start", type=int, default=2048, help="--bisect: the first length tried at S = 1")
    p.add_argument("--resolution", type=float, default=0.125,
                   help="--bisect: stop when the bracket is within this fraction of the longest (default 1/8)")
    p.add_argument("--max-len", type=int, default=1 << 20)
    p.add_argument("--rate-len", type=int, default=2048, help="the length step times are compared at (0: none)")
    p.add_argument("--rate-pairs", type=int, default=3, help="S = 1 / S = 2 step-time pairs, alternating")
    p.add_argument("--rate-budget-gib", type=float, default=3.0, help="the watcher's budget in step-time trials")
    p.add_argument("--parts", default="on,rates,deepspeed,off",
                   help="what to run, in this order: on (zerotrain, tiled pieces on), rates, deepspeed, off "
                        "(pieces off); a part left out keeps what <out>/results.json has of it")
    p.add_argument("--memory-steps", type=int, default=2,
                   help="steps per memory trial (default 2: the second step's forward and backward run beside "
                        "the optimizer's states, which the first step makes; 1 leaves them out)")
    p.add_argument("--zero", type=int, default=1, help="ZeRO stage over the S ranks (default 1)")
    p.add_argument("--trial-timeout", type=int, default=900)
    p.add_argument("--mmap-threshold", type=int, default=131072,
                   help="glibc's MALLOC_MMAP_THRESHOLD_ for every trial (0: glibc's dynamic default)")
    p.add_argument("--ds-venv", default=str(common.DS_VENV), help="DeepSpeed's venv; 'none' to skip it")
    p.add_argument("--quick", action="store_true", help="a tiny model and budget: the script's own test")
    p.add_argument("--out", default=str(common.REPO / "docs" / "results" / "long_context"))
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--length", type=int, help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--pieces", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--report", action="store_true", help="only write results.md and longest.png from <out>/results.json")
    a = p.parse_args()
    a.locals = [int(x) for x in a.locals.split(",")]
    if a.worker:
        worker(a)
        return 0
    out = Path(a.out)
    if a.report:
        r = json.loads((out / "results.json").read_text())
        _write_report(out / "results.md", report(r))
        plot(r, out / "longest.png")
        return 0
    a.log_dir = out / "raw"
    a.log_dir.mkdir(parents=True, exist_ok=True)
    common.DS_VENV = Path(a.ds_venv)
    sizes = [int(s) for s in a.sizes.split(",")]
    parts = a.parts.split(",")
    r = {"commands": [], "budget_gib": a.budget_gib, "line_budget_gib": a.line_budget_gib,
         "model": "quick" if a.quick else FULL, "zero_stage": a.zero, "sizes": sizes, "bisect": a.bisect,
         "longest": {}, "rates": None, "deepspeed": {}, "wall_s": 0.0}
    keep = out / "results.json"
    if keep.exists() and set(parts) != {"on", "rates", "deepspeed", "off"}:
        old = json.loads(keep.read_text())
        if all(old.get(k) == r[k] for k in ("budget_gib", "model", "zero_stage", "sizes", "bisect")):
            r = old  # the parts run now replace theirs
    r["commands"].append(" ".join(["python", "benchmarks/long_context.py"] + sys.argv[1:]))
    wall0 = r["wall_s"]
    began = time.perf_counter()

    def save() -> None:
        r["wall_s"] = wall0 + time.perf_counter() - began
        (out / "results.json").write_text(json.dumps(r, indent=1))

    def sweep(found: dict, framework: str, pieces: bool, starts: dict | None = None) -> None:
        """Fill `found` (already in r, so that each size's search is saved as it ends)."""
        start = a.start if pieces else a.start // 4
        for i, size in enumerate(sizes):
            if not a.bisect:
                found[f"S{size}"] = fit(a, size, pieces)
                continue
            first = (starts or {}).get(size) or start
            found[f"S{size}"] = got = search(a, framework, size, pieces, first, 2.0 if i == 0 and not starts else 1.25)
            got["line"] = line_of_search(got, size, a.line_budget_gib * 1024)
            if i + 1 < len(sizes):  # the next size starts at this one's longest, scaled by the sizes' ratio
                start = (got["longest"] or start) * sizes[i + 1] // size
            save()

    if "on" in parts:
        sweep(r["longest"].setdefault("on", {}), "zerotrain", True)
    if "rates" in parts and a.rate_len and 1 in sizes and 2 in sizes:
        r["rates"] = rates(a)
        save()
    if "deepspeed" not in parts:
        pass
    elif a.ds_venv != "none" and (common.DS_VENV / "bin" / "python").exists():
        r["deepspeed"] = {}
        for size in [s for s in (1, 2) if s in sizes and a.rate_len]:
            r["deepspeed"][f"rate_S{size}"] = res = trial(a, "deepspeed", size, a.rate_len, True, steps=2,
                                                        budget=a.rate_budget_gib)
            _say_trial("deepspeed", size, True, a.rate_len, res)
        if a.bisect and "on" in r["longest"]:
            starts = {int(k[1:]): v["longest"] for k, v in r["longest"]["on"].items()}
            sweep(r["deepspeed"].setdefault("longest", {}), "deepspeed", True, starts)
    else:
        r["deepspeed"]["skipped"] = f"no DeepSpeed venv at {common.DS_VENV}"
    save()
    if "off" in parts:
        sweep(r["longest"].setdefault("off", {}), "zerotrain", False)
    save()
    _write_report(out / "results.md", report(r))
    plot(r, out / "longest.png")
    common.say((out / "results.md").read_text())
    return 0


def _write_report(path: Path, text: str) -> None:
    """Write the generated tables, keeping the hand-written "## Reading" section of a previous
    results.md (what the figures mean is read by a person, not generated)."""
    old = path.read_text() if path.exists() else ""
    reading = old[old.index("\n## Reading"):] if "\n## Reading" in old else ""
    path.write_text(text.rstrip("\n") + "\n" + reading)


def _growth(found: dict, key: str) -> str:
    base, this = (found.get("S1") or {}).get("longest"), (found.get(key) or {}).get("longest")
    return f"{this / base:.2f}" if base and this else "-"


def _rows(name: str, pieces: str, found: dict, bisect: bool, line_budget: float) -> list[str]:
    rows = []
    for key, v in found.items():
        if not bisect:  # the line through --locals
            points = ", ".join(f"{p['length']}: {p['fb_peak_mib']:.0f}" if p["ok"] else f"{p['length']}: {p['why']}"
                               for p in v["points"])
            rows.append(f"| {name} | {key[1:]} | {pieces} | {points} | {v.get('fixed_mib', 0):.0f} | "
                        f"{v.get('kib_per_position', 0):.1f} | {v['longest'] or v.get('error')} | {_growth(found, key)} |")
            continue
        tried = ", ".join(f"{t['length']} {'ok' if t['ok'] else 'x'}" for t in v["trials"])
        line = v.get("line") or {}
        est = line.get("longest") or "-"
        rate = f"{v['tokens_per_s']:.0f}" if v.get("tokens_per_s") else "-"
        peak = f"{v['peak_mib']:.0f}" if v.get("peak_mib") else "-"
        rows.append(f"| {name} | {key[1:]} | {pieces} | {v['longest'] or v.get('error') or 'no length fits'} | {v.get('first_failed') or '-'} | "
                    f"{_growth(found, key)} | {peak} | {rate} | {tried} | {est} |")
    return rows


def report(r: dict) -> str:
    b = r["bisect"]
    head = (["| framework | S | pieces | longest (tokens) | first failed | x S=1 | peak MiB/rank | tokens/s | "
             f"trials (length, ok/x over budget) | line at {r['line_budget_gib']} GiB |", "|---" * 10 + "|"] if b else
            ["| framework | S | pieces | peak MiB/rank through backward (tokens: MiB) | fixed MiB | KiB per position "
             "of a rank | longest within budget | x S=1 |", "|---" * 8 + "|"])
    rows = list(head)
    for pieces, found in r["longest"].items():
        rows += _rows("zerotrain", pieces, found, b, r["line_budget_gib"])
    ds = r["deepspeed"]
    if "longest" in ds:
        rows += _rows("DeepSpeed ALST", "on", ds["longest"], b, r["line_budget_gib"])
    text = ("# Longest sequence within a peak-RSS budget\n\n"
            "Commands: " + ", then ".join(f"`{c}`" for c in r["commands"]) + f"; budget {r['budget_gib']} GiB per rank, ZeRO stage {r['zero_stage']} over "
            f"the S ranks, model {r['model']}; wall {r['wall_s'] / 60:.0f} min.\n\n" + "\n".join(rows) + "\n")
    rt = r["rates"]
    if rt:
        lines = ["| run | s/step (each run) | median s/step | tokens/s | CPU s of the busiest rank (each run) | "
                 "median CPU s |", "|---|---|---|---|---|---|"]

        def cpu_of(x: dict) -> str:
            return f"{x['cpu_s'][-1]:.1f}" if x["ok"] and "cpu_s" in x else "-"

        for key, runs in rt["runs"].items():
            each = ", ".join(f"{x['times'][-1]:.1f}" if x["ok"] else x["why"] for x in runs)
            med, cpu = rt["median_s"].get(key), rt.get("median_cpu_s", {}).get(key)
            tps = f"{rt['length'] / med:.0f}" if med else "-"
            lines.append(f"| zerotrain {key} | {each} | {f'{med:.2f}' if med else '-'} | {tps} | "
                         f"{', '.join(cpu_of(x) for x in runs)} | {f'{cpu:.2f}' if cpu else '-'} |")
        for key in ("rate_S1", "rate_S2"):
            if key in ds:
                v = ds[key]
                lines.append(f"| DeepSpeed ALST {key[5:]} | {v['times'][-1]:.1f} | - | {rt['length'] / v['times'][-1]:.0f} | "
                             f"{cpu_of(v)} | - |" if v["ok"] else f"| DeepSpeed ALST {key[5:]} | failed: `{v['why']}` | - | - | - | - |")
        ratio = f"{rt['ratio']:.2f}" if rt["ratio"] else "-"
        cpu_ratio = f"{rt['cpu_ratio']:.2f}" if rt.get("cpu_ratio") else "-"
        text += (f"\nStep time at {rt['length']} tokens, pieces on (the second step of each run; S = 1 and 2 "
                 f"alternating): S = 2 / S = 1 = {ratio} (ratio of the median wall times), {cpu_ratio} (of the "
                 "median CPU seconds of the busiest rank).\n\n" + "\n".join(lines) + "\n")
    if "skipped" in ds:
        text += f"\nDeepSpeed: skipped ({ds['skipped']}).\n"
    return text


def plot(r: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(5, 3.5))
    series = [(f"zerotrain, pieces {k}", v) for k, v in r["longest"].items()]
    if "longest" in r["deepspeed"]:
        series.append(("DeepSpeed ALST, pieces on", r["deepspeed"]["longest"]))
    for label, found in series:
        xs = [s for s in r["sizes"] if (found.get(f"S{s}") or {}).get("longest")]
        ax.plot(xs, [found[f"S{s}"]["longest"] for s in xs], "o-", label=label)
    ax.set_xlabel("sequence-parallel ranks S")
    ax.set_ylabel("longest sequence (tokens)")
    ax.set_xticks(r["sizes"])
    ax.set_title(f"peak RSS <= {r['budget_gib']} GiB per rank")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    sys.exit(main())
