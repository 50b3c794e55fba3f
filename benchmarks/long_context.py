"""The longest sequence a ~20M-parameter LLaMA-shaped model trains within a peak-RSS budget
per rank, with 1, 2 and 4 sequence-parallel ranks (Ulysses), ALST's memory pieces on and off.

    python benchmarks/long_context.py                        # budget 3 GiB per rank, S = 1, 2, 4
    python benchmarks/long_context.py --bisect --budget-gib 0.8 --sizes 1,2
    python benchmarks/long_context.py --quick --out /tmp/lc  # a tiny model, seconds (the test's mode)

The model is transformers' LlamaForCausalLM built from a LlamaConfig here (no download): 4
layers, hidden 512, 8 heads (4 key/value), MLP 1376, vocabulary 8192 untied: 20.2M
parameters. Each trial is a fresh torchrun world of S processes (one thread each) training
one step (forward, backward, AdamW step; ZeRO stage 1 over the S ranks) on one sequence of
the length tried; each rank reads its peak RSS (VmHWM, /proc/self/status), and a watcher
thread ends the trial as soon as any rank passes the budget.

The longest length: with attention that keeps no (T x T) scores (torch's CPU flash kernel),
a rank's peak through forward and backward is a line in its share of the sequence, fixed +
slope x T / S; the optimizer step's peak after it (AdamW's states, made on the first step)
does not depend on T. The default measures both at two lengths per S (--locals, per rank:
1024 and 2048 positions) and reports where the line crosses the budget (none if the step's
own peak passes it); on this 2-core machine a trial at 8K positions takes 7
minutes, so bisecting up to the 3 GiB crossing (tens of thousands of positions, attention
quadratic in them) would take hours. --bisect searches by trials instead (doubling from
--start until one fails, then the midpoint once), for budgets small enough to reach.

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

Step time: at --rate-len, S = 1 and S = 2, pieces on, 3 steps, the faster of the last 2
(tokens per second of the whole sequence group). DeepSpeed 0.19.8's ALST runs the same trial
in its own venv (--ds-venv), with transformers from this one, where it can; otherwise the
exact error is recorded. Results: <out>/results.json, results.md, longest.png.
"""

from __future__ import annotations

import argparse
import json
import math
import os
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

def _watch(budget_kib: int, out: Path, rank: int) -> None:
    """End the job the moment this rank's peak RSS passes the budget."""
    while True:
        peak = common.status_kib("VmHWM")
        if peak > budget_kib:
            out.with_suffix(f".over{rank}").write_text(str(peak))
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


fb_peaks: list[int] = []  # the peak after each backward, before the optimizer step


def worker(a) -> None:
    import torch

    torch.set_num_threads(1)
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    out = Path(a.out)
    threading.Thread(target=_watch, args=(int(a.budget_gib * 2**20), out, rank), daemon=True).start()
    shape = QUICK if a.quick else FULL
    local = a.length // size
    fb_peaks.clear()
    config = {"train_batch_size": 1, "train_micro_batch_size_per_gpu": 1, "sequence_parallel_size": size,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}, "zero_optimization": {"stage": a.zero}}
    if a.worker == "zerotrain":
        import zerotrain

        model = _model("zerotrain", shape, a.pieces, local)
        engine, *_ = zerotrain.initialize(model=model, config=config)

        def step(ids):
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            fb_peaks.append(common.status_kib("VmHWM"))
            engine.step()
            return loss.item()
    else:
        step = _deepspeed_step(a, shape, local, config)
    init_kib = common.status_kib("VmHWM")
    g = torch.Generator().manual_seed(0)
    times, losses = [], []
    for _ in range(a.steps):
        ids = torch.randint(0, shape["vocab_size"], (1, a.length), generator=g)
        start = time.perf_counter()
        losses.append(step(ids))
        times.append(time.perf_counter() - start)
    mine = {"peak_kib": common.status_kib("VmHWM"), "init_peak_kib": init_kib, "fb_peak_kib": fb_peaks[0]}
    every = [mine]
    if size > 1:  # the benchmark's own report, gathered once at the end
        import torch.distributed as dist

        every = [None] * size
        dist.all_gather_object(every, mine)
    if rank == 0:
        out.write_text(json.dumps({**{k: [r[k] for r in every] for k in mine}, "times": times, "losses": losses}))


def _deepspeed_step(a, shape: dict, local: int, config: dict):
    """DeepSpeed's ALST as its tutorial wires it: register_with_transformers, the mpu into
    initialize, the loader adapter's pieces, TiledMLP and TiledFusedLogitsLoss."""
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
    engine, *_ = deepspeed.initialize(model=model, config=config, mpu=mpu, model_parameters=model.parameters())
    group = mpu.get_sequence_parallel_group()

    def step(ids):
        batch = {"input_ids": ids, "labels": ids, "position_ids": torch.arange(ids.shape[1]).unsqueeze(0)}
        adapter = UlyssesSPDataLoaderAdapter([batch], sp_rank=mpu.get_sequence_parallel_rank(), sp_group=group,
                                             sp_world_size=size, device=torch.device("cpu"))
        piece = next(iter(adapter))
        targets = piece.pop("shift_labels")
        piece.pop("labels", None)
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
        fb_peaks.append(common.status_kib("VmHWM"))
        engine.step()
        return (stats[0] / stats[1]).item()

    return step


# ---- driver ------------------------------------------------------------------------------

def trial(a, framework: str, size: int, length: int, pieces: bool, steps: int = 1) -> dict:
    """One torchrun job; {"ok": ..., "peak_mib": ..., ...} or the reason it failed."""
    out = a.log_dir / f"{framework}-s{size}-{length}-{int(pieces)}-{time.monotonic_ns()}.json"
    py = common.DS_VENV / "bin" / "python" if framework == "deepspeed" else Path(sys.executable)
    cmd = [py, "-m", "torch.distributed.run", "--nproc_per_node", size, "--master_port", common.free_port(),
           __file__, "--worker", framework, "--length", length, "--budget-gib", a.budget_gib, "--zero", a.zero,
           "--steps", steps, "--out", out] + (["--pieces"] if pieces else []) + (["--quick"] if a.quick else [])
    env = common.venv_env(common.DS_VENV if framework == "deepspeed" else Path(sys.prefix))
    paths = [str(common.SRC)] if framework == "zerotrain" else []
    if framework == "deepspeed":  # transformers from this venv, after DeepSpeed's own torch
        import transformers

        paths.append(str(Path(transformers.__file__).parents[1]))
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")])
    if a.mmap_threshold:  # see the module docstring: the peak is then the live memory's
        env["MALLOC_MMAP_THRESHOLD_"] = str(a.mmap_threshold)
    start = time.perf_counter()
    try:
        r = common.run_quiet(cmd, env=env, timeout=a.trial_timeout)
        text, code = r.stdout + r.stderr, r.returncode
    except Exception as e:  # noqa: BLE001 - a timeout is a failed trial, reported as such
        text, code = repr(e), -1
    wall = time.perf_counter() - start
    over = sorted(a.log_dir.glob(out.name.replace(".json", ".over*")))
    if over:
        return {"ok": False, "why": "over budget", "peak_mib": int(over[0].read_text()) / 1024, "wall_s": wall}
    if code != 0 or not out.exists():
        return {"ok": False, "why": _exception_line(text), "wall_s": wall}
    res = json.loads(out.read_text())
    return {"ok": True, "peak_mib": max(res["peak_kib"]) / 1024, "init_mib": max(res["init_peak_kib"]) / 1024,
            "fb_peak_mib": max(res["fb_peak_kib"]) / 1024,
            "times": res["times"], "loss": res["losses"][-1], "wall_s": wall}


def _exception_line(text: str) -> str:
    """The exception a rank raised (the line that ends its first traceback)."""
    lines = text.splitlines()
    at = next((i for i, ln in enumerate(lines) if ln.startswith("Traceback")), None)
    if at is not None:
        ends = [ln for ln in lines[at + 1:] if ln and not ln[0].isspace() and not ln.startswith("Traceback")]
        if ends:
            return ends[0].strip()[:400]
    return text.strip()[-300:]


def search(a, framework: str, size: int, pieces: bool, start: int) -> dict:
    """Double from `start` until a trial fails (halve while the first ones fail), then try the
    midpoint of the last success and the first failure once."""
    unit = 64 * size
    tried, good, bad = [], None, None

    def attempt(length: int) -> dict:
        res = trial(a, framework, size, length, pieces)
        tried.append({"length": length, **res})
        common.say(f"  {framework} S={size} pieces={'on' if pieces else 'off'} T={length}: "
                   f"{'ok' if res['ok'] else res['why']} peak {res.get('peak_mib', float('nan')):.0f} MiB "
                   f"({res['wall_s']:.0f} s)")
        return res

    length = max(unit, start // unit * unit)
    while length <= a.max_len:
        res = attempt(length)
        if res["ok"]:
            good = length
            if bad is not None:
                break
            length *= 2
            continue
        if res["why"] != "over budget":
            return {"longest": good, "error": res["why"], "trials": tried}
        bad = length
        if good is not None or length <= unit:
            break
        length = max(unit, length // 2 // unit * unit)
    if good is not None and bad is not None:
        mid = (good + bad) // 2 // unit * unit
        if good < mid < bad and attempt(mid)["ok"]:
            good = mid
        elif good < mid < bad:
            bad = mid
    best = next((t for t in tried if t["length"] == good), None)
    return {"longest": good, "first_failed": bad, "peak_mib": best and best["peak_mib"],
            "init_mib": best and best.get("init_mib"), "trials": tried}


def fit(a, size: int, pieces: bool) -> dict:
    """The peak per rank at two lengths, the line through them, and where it crosses the budget."""
    points = []
    for local in a.locals:
        res = trial(a, "zerotrain", size, local * size, pieces)
        points.append({"length": local * size, **res})
        common.say(f"  S={size} pieces={'on' if pieces else 'off'} T={local * size}: " + (
            f"peak {res['fb_peak_mib']:.0f} MiB through backward, {res['peak_mib']:.0f} with the step"
            if res["ok"] else res["why"]) + f" ({res['wall_s']:.0f} s)")
    ok = [p for p in points if p["ok"]]
    if len(ok) < 2:
        return {"longest": None, "error": next((p["why"] for p in points if not p["ok"]), "no two points"),
                "points": points}
    return {**line_through(ok, size, a.budget_gib * 1024), "init_mib": ok[-1]["init_mib"], "points": points}


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
    p.add_argument("--sizes", default="1,2,4", help="sequence-parallel sizes (default 1,2,4)")
    p.add_argument("--locals", default="1024,2048", help="positions per rank the line is measured at")
    p.add_argument("--bisect", action="store_true", help="also search the longest length by trials")
    p.add_argument("--start", type=int, default=2048, help="--bisect: the first length tried at S = 1")
    p.add_argument("--max-len", type=int, default=1 << 20)
    p.add_argument("--rate-len", type=int, default=2048, help="the length step times are compared at (0: none)")
    p.add_argument("--modes", default="on,off", help="pieces on, off or both (default on,off)")
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
    a = p.parse_args()
    a.locals = [int(x) for x in a.locals.split(",")]
    if a.worker:
        worker(a)
        return 0
    out = Path(a.out)
    a.log_dir = out / "logs"
    a.log_dir.mkdir(parents=True, exist_ok=True)
    common.DS_VENV = Path(a.ds_venv)
    sizes = [int(s) for s in a.sizes.split(",")]
    results = {"budget_gib": a.budget_gib, "model": "quick" if a.quick else FULL, "zero_stage": a.zero,
               "sizes": sizes, "longest": {}, "rates": {}, "deepspeed": {}}
    began = time.perf_counter()
    for pieces in [m == "on" for m in a.modes.split(",")]:
        start = a.start if pieces else a.start // 4
        for i, size in enumerate(sizes):
            key = f"S{size}_{'on' if pieces else 'off'}"
            results["longest"][key] = line = fit(a, size, pieces)
            if a.bisect:
                line["bisect"] = search(a, "zerotrain", size, pieces, start)
                if i + 1 < len(sizes):  # the next size starts at this one's longest, scaled by the sizes' ratio
                    start = (line["bisect"]["longest"] or start) * sizes[i + 1] // size
    for size in [s for s in (1, 2) if s in sizes and a.rate_len]:
        res = trial(a, "zerotrain", size, a.rate_len, True, steps=3)
        results["rates"][f"S{size}"] = res
        if res["ok"]:
            common.say(f"  rate S={size} T={a.rate_len}: {a.rate_len / min(res['times'][1:]):.0f} tokens/s")
    if a.ds_venv != "none" and (common.DS_VENV / "bin" / "python").exists():
        for size in [s for s in (1, 2) if s in sizes]:
            res = trial(a, "deepspeed", size, a.rate_len, True, steps=2)
            results["deepspeed"][f"S{size}"] = res
            common.say(f"  deepspeed S={size} T={a.rate_len}: {'ok' if res['ok'] else res['why']}")
    else:
        results["deepspeed"]["skipped"] = f"no DeepSpeed venv at {common.DS_VENV}"
    results["wall_s"] = time.perf_counter() - began
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "results.md").write_text(report(results, a))
    plot(results, out / "longest.png")
    common.say((out / "results.md").read_text())
    return 0


def report(r: dict, a) -> str:
    L = r["longest"]
    rows = ["| S | pieces | tokens: peak MiB/rank through backward | fixed MiB | KiB per position of a rank | "
            "peak with the step (MiB) | longest within budget | x S=1 | bisected |",
            "|---|---|---|---|---|---|---|---|---|"]
    for key, v in L.items():
        size, pieces = key[1:].split("_")
        base = L.get(f"S1_{pieces}", {}).get("longest")
        grow = f"{v['longest'] / base:.2f}" if v["longest"] and base else "-"
        points = ", ".join(f"{p['length']}: {p['fb_peak_mib']:.0f}" if p["ok"] else f"{p['length']}: {p['why']}"
                           for p in v["points"])
        step = f"{v['step_peak_mib']:.0f}" if "step_peak_mib" in v else "-"
        b = v.get("bisect")
        bis = "-" if b is None else f"{b['longest']} (failed at {b.get('first_failed')})"
        fixed = f"{v['fixed_mib']:.0f}" if "fixed_mib" in v else "-"
        slope = f"{v['kib_per_position']:.1f}" if "kib_per_position" in v else "-"
        rows.append(f"| {size} | {pieces} | {points} | {fixed} | {slope} | {step} | "
                    f"{v['longest'] or v.get('error')} | {grow} | {bis} |")
    rates = []
    for key, v in r["rates"].items():
        rates.append(f"| zerotrain {key} | {a.rate_len / min(v['times'][1:]):.0f} | {min(v['times'][1:]):.2f} |"
                     if v["ok"] else f"| zerotrain {key} | failed: {v['why']} | - |")
    for key, v in r["deepspeed"].items():
        if key == "skipped":
            rates.append(f"| DeepSpeed | skipped: {v} | - |")
        else:
            rates.append(f"| DeepSpeed ALST {key} | {a.rate_len / min(v['times'][1:]):.0f} | "
                         f"{min(v['times'][1:]):.2f} |" if v["ok"] else f"| DeepSpeed ALST {key} | failed: `{v['why']}` | - |")
    return ("# Longest sequence within a peak-RSS budget\n\n"
            f"Command: `python benchmarks/long_context.py --budget-gib {a.budget_gib} --sizes {a.sizes}"
            f"{' --quick' if a.quick else ''}{' --bisect' if a.bisect else ''}`; budget {r['budget_gib']} GiB per rank, ZeRO stage {r['zero_stage']}, "
            f"model {r['model']}; wall {r['wall_s'] / 60:.1f} min.\n\n" + "\n".join(rows) +
            f"\n\nStep time at {a.rate_len} tokens (pieces on; the faster of steps 2 and 3):\n\n"
            "| run | tokens/s | s/step |\n|---|---|---|\n" + "\n".join(rates) + "\n")


def plot(r: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for pieces in ("on", "off"):
        xs = [s for s in r["sizes"] if (r["longest"].get(f"S{s}_{pieces}") or {}).get("longest")]
        ax.plot(xs, [r["longest"][f"S{s}_{pieces}"]["longest"] for s in xs], "o-", label=f"tiled pieces {pieces}")
    ax.set_xlabel("sequence-parallel ranks S")
    ax.set_ylabel("longest sequence (tokens)")
    ax.set_xticks(r["sizes"])
    ax.set_title(f"peak RSS <= {r['budget_gib']} GiB per rank")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    sys.exit(main())
