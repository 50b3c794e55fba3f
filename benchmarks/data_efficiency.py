"""Study: DeepSpeed's Data Efficiency recipe (curriculum by vocabulary rarity + seqlen_truncate,
random-LTD, both) against a baseline, on real text, at equal data tokens and equal wall-clock.

    python benchmarks/data_efficiency.py            # run what is not done yet (resumable), then the report
    python benchmarks/data_efficiency.py --report   # only rebuild the tables, plots and page section
    python benchmarks/data_efficiency.py --list     # the fixed job list and what is done
    python benchmarks/data_efficiency.py --quick --out /tmp/deq   # a tiny model, a few steps (the test)

One process, one thread. Text: benchmarks/study_text.py (bytes as tokens; held-out files never
trained on). The training pool is `pool` windows of 256 tokens cut without overlap from the
training stream at seeded random places. Everything goes through zerotrain.initialize with a
DeepSpeed config, as a DeepSpeed user drives it:

  analysis    zerotrain.data_efficiency.DataAnalyzer over the pool: total_vocab_freq
              (accumulated), then vocab_rarity per sample (sum of -log p(byte)); the index
              files the curriculum sampler reads (kept under --index, not committed; their
              sizes, times and the metric's spread go to runs/analysis.json, which is what
              marks the job done: a race that finds no index files makes them again first,
              in about 20 s of analyzer time)
  baseline    the pool in a seeded order, full windows
  curriculum  data_efficiency.data_sampling.curriculum_learning with two metrics, as
              Megatron-DeepSpeed's GPT recipe pairs them: vocab_rarity (percentile,
              schedule_based: the commonest-text 1% of samples first, to 100%) and
              seqlen_truncate (value, single_cluster: batches cut to 64 -> 256 tokens by the
              built-in post-process), both fixed_root (degree 2) over `cl_steps` steps; the
              sampler (initialize(training_data=pool)) draws the batches
  random_ltd  data_efficiency.data_routing.random_ltd: the 4 middle layers of 6 keep
              64 -> 256 tokens (fixed_linear over `ltd_steps` steps, seq_per_step 16); the
              first and last layers see every token (DeepSpeed's GPT recipe); baseline's data
  both        the two together

Every run stops at the same data-token budget (`token_budget.train_tokens`: batch x length
after the cut, so the curriculum takes more, shorter steps) and decays its LR by tokens
(cosine to lr/10, warmup 10 steps); AdamW, LR 1e-3 (curriculum.py's sweep), clip 1.0.
The four arms of a seed race in one process, the one with fewest tokens stepping next, so
machine load falls on all four alike; each step (data draw, forward, backward, optimizer step)
is timed, evaluations are not. Held-out loss: 16 fixed held-out windows of 256 tokens (the
same for every arm, so the comparison is paired), every budget/10 tokens.

"Reaches the baseline's final held-out loss" is fixed before the runs: the target is the
baseline's held-out loss at its last evaluation (same seed); an arm reaches it at its first
evaluation at or below it, its tokens and wall-clock interpolated linearly between that
evaluation and the one before (study_runs.first_reach); the ratio is that over the baseline's
final tokens (wall-clock). Targets: curriculum + random-LTD at <= 0.75x tokens or wall-clock;
random-LTD's data tokens per second (whole run, steps only) >= 1.15x the baseline's.

The `ltd-profile` job times random-LTD's step at fixed kept lengths (steps interleaved) and
profiles one baseline and one r=64 step by operator: where a random-LTD step's time goes.

Fixed budgets: 10.8M-param GPT (6 layers, width 384), batch 8, 50 full steps (102,400
tokens) a run, cl_steps 20, ltd_steps 35, seeds 0 and 1, pool 65,536 windows. About 10
CPU-minutes in all (sized for a 2-core machine shared with other long jobs).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

from study_runs import (Job, Study, count_events, finish_report, first_reach,  # noqa: E402
                        held_out_plot, machine, markdown_table, mean, race_by_tokens)
from study_text import load_corpus, windows  # noqa: E402

ROOT = HERE.parent
PAGE = ROOT / "docs" / "data-efficiency.md"
ARMS = ("baseline", "curriculum", "random_ltd", "both")
COLORS = {"baseline": "tab:blue", "curriculum": "tab:orange", "random_ltd": "tab:green", "both": "tab:red"}


@dataclass
class Plan:
    seq: int = 256
    batch: int = 8
    model: dict = field(default_factory=lambda: dict(n_embd=384, n_layer=6, n_head=6))
    lr: float = 1e-3
    warmup: int = 10
    steps: int = 50  # full-length steps of the token budget
    cl_steps: int = 20
    cl_min_len: int = 64
    ltd_steps: int = 35
    ltd_min: int = 64
    ltd_max: int | None = None  # None: the full sequence (the profile fixes both ends)
    seeds: tuple = (0, 1)
    pool: int = 65_536
    evals: int = 10
    eval_windows: int = 16
    profile_lengths: tuple = (64, 128, 192)
    profile_rounds: int = 6
    max_files: int | None = None


QUICK = Plan(seq=64, batch=4, model=dict(n_embd=48, n_layer=4, n_head=2), steps=8, warmup=2, cl_steps=4, cl_min_len=16,
             ltd_steps=5, ltd_min=16, seeds=(0,), pool=512, evals=2, eval_windows=4, profile_lengths=(16,),
             profile_rounds=2, max_files=12)


# ---- the data ----------------------------------------------------------------------------------
class Pool(torch.utils.data.Dataset):
    """Fixed windows of the training stream: the samples every arm draws from and the analyzer reads."""

    def __init__(self, rows: torch.Tensor):
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.rows[i]

    def get_batch(self, indices) -> dict:  # the analyzer's one-call read
        return {"input_ids": self.rows[torch.as_tensor(np.asarray(indices), dtype=torch.long)].numpy()}


def make_pool(train: torch.Tensor, plan: Plan) -> Pool:
    slots = len(train) // plan.seq
    g = torch.Generator().manual_seed(1234)
    chosen = torch.randperm(slots, generator=g)[:plan.pool].sort().values
    return Pool(train[: slots * plan.seq].view(slots, plan.seq)[chosen].clone())


def analyse(pool: Pool, index: Path) -> dict:
    """DataAnalyzer over the pool: total_vocab_freq, then vocab_rarity; returns what it took."""
    from zerotrain.data_efficiency import DataAnalyzer, metrics
    from zerotrain.data.indexed import IndexedFile

    common = dict(batch_size=4096, num_workers=1, worker_id=0, save_path=str(index), progress=False)
    t0 = time.perf_counter()
    DataAnalyzer(pool, metric_names=["total_vocab_freq"], metric_functions=[metrics.total_vocab_freq(256)],
                 metric_types=["accumulate_value_over_samples"], metric_dtypes=[np.int64], **common).run_map_reduce()
    t1 = time.perf_counter()
    freq = metrics.read_vocab_freq(str(index))
    DataAnalyzer(pool, metric_names=["vocab_rarity"], metric_functions=[metrics.vocab_rarity(freq)],
                 metric_types=["single_value_per_sample"], metric_dtypes=[np.int64], **common).run_map_reduce()
    t2 = time.perf_counter()
    values = np.asarray(IndexedFile(str(index / "vocab_rarity" / "vocab_rarity_sample_to_metric"), "vocab_rarity")
                        .concatenated(), dtype=np.float64)
    counts = np.asarray(freq, dtype=np.int64)  # the file's dtype is unsigned: negate only after widening
    return {"samples": len(pool), "tokens": len(pool) * pool.rows.shape[1], "freq_seconds": round(t1 - t0, 2),
            "rarity_seconds": round(t2 - t1, 2),
            "rarity_percentiles": {str(p): float(np.percentile(values, p)) for p in (0, 1, 10, 50, 90, 99, 100)},
            "commonest_bytes": [chr(b) for b in np.argsort(-counts, kind="stable")[:10].tolist()],
            "bytes_seen": int((counts > 0).sum())}


def index_ready(pool: Pool, index: Path) -> None:
    """The index files the curriculum arms read: the analysis job writes them to --index, which
    is not in git, so on a fresh checkout (the job done by its committed record) a race makes
    them again here, the same files from the same pool."""
    if not Path(index_paths(index)["index_to_sample_path"] + ".idx").is_file():
        print(f"[study] no index files under {index}: running the analyzer again", flush=True)
        analyse(pool, index)


def index_paths(index: Path) -> dict:
    base = index / "vocab_rarity" / "vocab_rarity"
    return {"index_to_sample_path": f"{base}_index_to_sample_percentile_merged",
            "index_to_metric_path": f"{base}_index_to_metric"}


# ---- one run ---------------------------------------------------------------------------------
def ds_config(plan: Plan, arm: str, seed: int, index: Path, clusters: Path) -> dict:
    tokens = plan.steps * plan.batch * plan.seq
    cfg = {"train_micro_batch_size_per_gpu": plan.batch, "gradient_clipping": 1.0, "steps_per_print": 10**9,
           "optimizer": {"type": "AdamW", "params": {"lr": plan.lr, "betas": [0.9, 0.95], "weight_decay": 0.1}},
           "token_budget": {"train_tokens": tokens, "lr_decay_tokens": tokens, "lr_decay_style": "cosine",
                            "warmup_steps": plan.warmup, "min_lr": plan.lr / 10}}
    de: dict = {"enabled": True, "seed": 1000 + seed}
    if arm in ("curriculum", "both"):
        root = {"schedule_type": "fixed_root", "schedule_config": {"total_curriculum_step": plan.cl_steps,
                                                                   "difficulty_step": 8, "root_degree": 2}}
        de["data_sampling"] = {"enabled": True, "num_epochs": 1, "curriculum_learning": {
            "enabled": True, "data_cluster_path": str(clusters), "curriculum_metrics": {
                "vocab_rarity": {**index_paths(index), "difficulty_type": "percentile",
                                 "clustering_type": "schedule_based", "min_difficulty": 1, "max_difficulty": 100,
                                 **root, "schedule_config": {**root["schedule_config"], "difficulty_step": 1}},
                "seqlen_truncate": {"difficulty_type": "value", "clustering_type": "single_cluster",
                                    "min_difficulty": plan.cl_min_len, "max_difficulty": plan.seq, **root}}}}
    if arm in ("random_ltd", "both"):
        n = plan.model["n_layer"]
        de["data_routing"] = {"enabled": True, "random_ltd": {
            "enabled": True, "total_layer_num": n, "random_ltd_layer_num": n - 2,
            "random_ltd_layer_id": list(range(1, n - 1)), "model_mask_name": None, "model_type": "decoder",
            "hidden_state_order": "batch_seq_dim",
            "random_ltd_schedule": {"min_value": plan.ltd_min, "max_value": plan.ltd_max or plan.seq, "schedule_type": "fixed_linear",
                                    "schedule_config": {"require_steps": plan.ltd_steps, "seq_per_step": 16}}}}
    if len(de) > 2:
        cfg["data_efficiency"] = de
    return cfg


class Run:
    def __init__(self, plan: Plan, arm: str, seed: int, pool: Pool, index: Path, clusters: Path):
        import zerotrain
        from zerotrain.data.curriculum_loader import seqlen_truncate
        from zerotrain.models import GPT, GPTConfig

        self.id, self.arm, self.seed, self.batch = f"{arm}-s{seed}", arm, seed, plan.batch
        cfg = ds_config(plan, arm, seed, index, clusters / self.id)
        torch.manual_seed(seed)  # the same initial weights in every arm of a seed
        model = GPT(GPTConfig(vocab_size=256, n_positions=plan.seq, **plan.model))
        sampled = arm in ("curriculum", "both")
        self.engine, _, loader, _ = zerotrain.initialize(model=model, config=cfg,
                                                         training_data=pool if sampled else None)
        if sampled:
            self.engine.set_data_post_process_func(seqlen_truncate)
            it = iter(loader)
            self.next_batch = lambda: next(it)
        else:
            order = torch.randperm(len(pool), generator=torch.Generator().manual_seed(seed))
            self.next_batch = lambda: pool.rows[order[len(self.steps) * plan.batch:][:plan.batch]]
        self.steps: list[list] = []  # [step, tokens after it, seqlen, kept tokens, loss, lr, wall_s, cpu_s]
        self.evals: list[dict] = []
        self.wall = self.cpu = 0.0
        self.record = {"study": "data_efficiency", "arm": arm, "seed": seed,
                       "params": sum(p.numel() for p in model.parameters()), "lr": plan.lr, "batch": plan.batch,
                       "seq": plan.seq, "token_budget": cfg["token_budget"]["train_tokens"], "ds_config": cfg,
                       "machine_start": machine()}

    @property
    def tokens(self) -> int:
        from zerotrain.features.engine_methods import tokens_consumed

        return tokens_consumed(self.engine)

    @property
    def live(self) -> bool:
        return not self.engine.should_stop()

    def kept(self, seqlen: int) -> int:
        sched = self.engine.random_ltd_scheduler
        return seqlen if sched is None else min(seqlen, sched.get_current_seq())

    def step(self) -> None:
        before = self.tokens
        w, c = time.perf_counter(), time.process_time()
        x = self.next_batch()
        loss = self.engine(x, labels=x)
        self.engine.backward(loss)
        self.engine.step()
        self.wall += time.perf_counter() - w
        self.cpu += time.process_time() - c
        seqlen = (self.tokens - before) // self.batch
        self.steps.append([len(self.steps) + 1, self.tokens, seqlen, self.kept(seqlen), float(loss.item()),
                           float(self.engine.optimizer.param_groups[0]["lr"]), round(self.wall, 3),
                           round(self.cpu, 3)])

    def result(self) -> dict:
        losses = [s[4] for s in self.steps]
        from zerotrain.features.random_ltd import RandomLTDFeature

        ltd = self.engine.feature(RandomLTDFeature)
        return {**self.record, "steps": self.steps, "evals": self.evals, "events": count_events(losses, 10),
                "final": {"steps": len(self.steps), "tokens": self.tokens, "wall_s": round(self.wall, 2),
                          "cpu_s": round(self.cpu, 2), "val_loss": self.evals[-1]["val_loss"],
                          "tokens_per_s": round(self.tokens / self.wall, 1),
                          "layer_tokens": None if ltd is None else int(ltd.layer_tokens)}}


def race(runs: list[Run], val_batches: list[torch.Tensor], eval_every: int) -> dict:
    """Step whichever live run has trained fewest tokens until every budget is spent."""
    race_by_tokens(runs, val_batches, eval_every, lambda run: run.step())
    out = {}
    for run in runs:
        out[run.id] = run.result()
        f = out[run.id]["final"]
        print(f"  {run.id}: {f['steps']} steps, {f['tokens']:,} tokens, {f['wall_s']:.0f}s "
              f"({f['tokens_per_s']:.0f} tokens/s), held-out {f['val_loss']:.4f}", flush=True)
    return out


# ---- where random-LTD's step time goes ------------------------------------------------------------
def profile(plan: Plan, pool: Pool, index: Path, clusters: Path) -> dict:
    """Step time at fixed kept lengths (each engine's schedule is min_value = max_value = r),
    interleaved round by round, in CPU time (one thread: what the step costs, whatever else
    the machine runs) and wall-clock; the cost of choosing the kept tokens alone; then one
    step of the baseline and of the smallest r by operator."""
    import dataclasses

    from zerotrain.data_efficiency import kept_token_indices

    engines = {}
    for r in (*plan.profile_lengths, plan.seq):
        fixed = dataclasses.replace(plan, ltd_min=r, ltd_max=r, ltd_steps=1)
        engines[r] = Run(fixed, "baseline" if r == plan.seq else "random_ltd", 0, pool, index, clusters)
    cpu, wall = ({r: [] for r in engines} for _ in range(2))
    for k in range(plan.profile_rounds):
        for r, run in engines.items():
            c, w = run.cpu, run.wall
            run.step()
            if k > 0:  # the first step of each warms caches and allocator
                cpu[r].append(run.cpu - c)
                wall[r].append(run.wall - w)
    per = {r: float(np.median(v)) for r, v in cpu.items()}
    # a straight line t(r) = a + b r: the fixed part (embeddings, head, unrouted layers, optimizer) and the routed part
    b, a = np.polyfit(np.array(list(per), dtype=float), np.array(list(per.values())), 1)
    samples = torch.arange(plan.batch)
    routed = plan.model["n_layer"] - 2
    c = time.process_time()
    for step in range(20):
        for layer in range(routed):
            kept_token_indices(1000, step, layer, samples, plan.seq, plan.profile_lengths[0])
    choose = (time.process_time() - c) / 20
    ops = {}
    from torch.profiler import ProfilerActivity, profile as torch_profile

    for r in (plan.profile_lengths[0], plan.seq):
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            engines[r].step()
        rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
        total = sum(e.self_cpu_time_total for e in rows)
        ops[str(r)] = {"total_ms": round(total / 1000, 1),
                       "top": [[e.key, round(e.self_cpu_time_total / 1000, 1), e.count] for e in rows[:14]]}
    return {"id": "ltd-profile", "study": "data_efficiency", "clock": "cpu",
            "step_s_by_kept": {str(r): round(v, 4) for r, v in per.items()},
            "wall_s_by_kept": {str(r): round(float(np.median(v)), 4) for r, v in wall.items()},
            "samples": {str(r): [round(x, 4) for x in v] for r, v in cpu.items()},
            "fit": {"fixed_s": round(float(a), 4), "per_kept_token_s": round(float(b), 7)},
            "choose_kept_s": round(choose, 5), "ops": ops, "machine": machine()}


# ---- the job list ------------------------------------------------------------------------------
def jobs(plan: Plan, study: Study, data, index: Path) -> list[Job]:
    clusters = index / "clusters"  # the sampler's cluster files: beside the index, not in the results
    out = [Job("analysis", ["analysis"], lambda: {"analysis": {"id": "analysis", **analyse(data()["pool"], index)}},
               f"DataAnalyzer over {plan.pool:,} windows: total_vocab_freq, vocab_rarity (index files under "
               f"{index.name}/, remade by a race that lacks them)")]
    out.append(Job("ltd-profile", ["ltd-profile"], lambda: {"ltd-profile": profile(plan, data()["pool"], index, clusters)},
                   "random-LTD step time at fixed kept lengths, and by operator", needs=["analysis"]))
    budget = plan.steps * plan.batch * plan.seq
    for seed in plan.seeds:
        ids = [f"{arm}-s{seed}" for arm in ARMS]

        def fn(seed=seed):
            d = data()
            print(d["corpus"].describe(), flush=True)
            index_ready(d["pool"], index)
            runs = [Run(plan, arm, seed, d["pool"], index, clusters) for arm in ARMS]
            out = race(runs, d["val"], max(1, budget // plan.evals))
            for rec in out.values():
                rec["corpus"] = d["corpus"].stats
            return out

        out.append(Job(f"race-s{seed}", ids, fn, f"the 4 arms, seed {seed}, {budget:,} tokens each", needs=["analysis"]))
    return out


# ---- report ------------------------------------------------------------------------------------
def reach(base: dict, run: dict) -> list[float | None]:
    """The run's tokens, wall-clock and CPU time to the baseline's final held-out loss, as
    multiples of the baseline's (None: not reached)."""
    target = base["final"]["val_loss"]
    got = [first_reach(run["evals"], target, k) for k in ("tokens", "wall_s", "cpu_s")]
    return [None if g is None else g / base["final"][k] for g, k in zip(got, ("tokens", "wall_s", "cpu_s"))]


def at(evals: list[dict], key: str, x: float) -> float:
    """Held-out loss at `key` = x, linear between evaluations (the last one past the end)."""
    prev = evals[0]
    for e in evals[1:]:
        if e[key] >= x:
            f = 0.0 if e[key] == prev[key] else (x - prev[key]) / (e[key] - prev[key])
            return prev["val_loss"] + f * (e["val_loss"] - prev["val_loss"])
        prev = e
    return evals[-1]["val_loss"]


def fmt(x: float | None) -> str:
    return "not reached" if x is None else f"{x:.2f}x"


def report(plan: Plan, study: Study, jobs_: list[Job], page: Path | None) -> str:
    runs = study.all_runs()
    parts = []
    a = runs.get("analysis")
    if a:
        p = a["rarity_percentiles"]
        parts.append(f"**Analysis**: DataAnalyzer over {a['samples']:,} training windows ({a['tokens']:,} tokens): "
                     f"total_vocab_freq in {a['freq_seconds']} s, vocab_rarity in {a['rarity_seconds']} s. "
                     f"vocab_rarity (nats per window) ranges {p['0']:.0f} to {p['100']:.0f}, median {p['50']:.0f}, "
                     f"1st percentile {p['1']:.0f}, 99th {p['99']:.0f}; the commonest bytes "
                     f"{' '.join(repr(c) for c in a['commonest_bytes'])}.")
    rows, gains, reaches, wall_rows = [], [], [], []
    for seed in plan.seeds:
        recs = {arm: runs.get(f"{arm}-s{seed}") for arm in ARMS}
        base = recs["baseline"]
        for arm, r in recs.items():
            if not r:
                continue
            f = r["final"]
            rows.append([arm, seed, f"{r['params'] / 1e6:.1f}M", f["steps"], f"{f['tokens']:,}", f"{f['wall_s']:.0f}",
                         f"{f['cpu_s']:.0f}", f"{f['tokens_per_s']:.0f}",
                         "-" if not base else f"{f['tokens_per_s'] / base['final']['tokens_per_s']:.2f}x / "
                                              f"{base['final']['cpu_s'] / f['cpu_s']:.2f}x", f"{f['val_loss']:.4f}"])
            if base and arm != "baseline":
                reaches.append([arm, seed, f"{base['final']['val_loss']:.4f}"] + [fmt(x) for x in reach(base, r)])
        if all(recs.values()):
            end = min(r["final"]["wall_s"] for r in recs.values())
            wall_rows.append([seed, f"{end:.0f}"] + [f"{at(recs[arm]['evals'], 'wall_s', end):.4f}" for arm in ARMS])
            gains.append((recs["random_ltd"]["final"]["tokens_per_s"] / base["final"]["tokens_per_s"],
                          base["final"]["cpu_s"] / recs["random_ltd"]["final"]["cpu_s"]))
    if rows:
        parts.append(f"**Runs** (same data-token budget, {plan.steps * plan.batch * plan.seq:,} tokens; wall-clock "
                     "= the timed steps; tokens/s = data tokens over it):\n\n" +
                     markdown_table(["arm", "seed", "params", "steps", "data tokens", "wall-clock s", "CPU s", "tokens/s",
                                     "x baseline tokens/s (wall / CPU)", "final held-out loss"], rows))
    if reaches:
        parts.append("**To the baseline's final held-out loss** (first evaluation at or below it, interpolated; as a "
                     "multiple of the baseline's; target for both: <= 0.75x tokens or wall-clock):\n\n" +
                     markdown_table(["arm", "seed", "baseline final", "x baseline tokens", "x baseline wall-clock",
                                     "x baseline CPU time"], reaches))
    if wall_rows:
        parts.append("**At equal wall-clock** (held-out loss of each arm when the fastest arm of the seed ended):\n\n" +
                     markdown_table(["seed", "at s"] + list(ARMS), wall_rows))
    if gains:
        parts.append("**Random-LTD's data tokens per second** against the baseline's, per seed: "
                     f"{' / '.join(f'{w:.2f}x' for w, _ in gains)} by wall-clock (mean {mean([w for w, _ in gains]):.2f}x; "
                     f"target >= 1.15x), {' / '.join(f'{c:.2f}x' for _, c in gains)} by CPU time.")
    prof = runs.get("ltd-profile")
    if prof:
        per = prof["step_s_by_kept"]
        full = per[str(plan.seq)]
        fit = prof["fit"]
        expect = expected_gain(plan, prof)
        n = plan.model["n_layer"]
        clock = "CPU" if prof.get("clock") == "cpu" else "wall-clock"
        parts.append(f"**Where random-LTD's step time goes** (batch {plan.batch}, {n - 2} of {n} layers routed; median "
                     f"step of interleaved rounds in {clock} time, which the machine's load does not stretch; a fixed "
                     "kept length per engine):\n\n" +
                     markdown_table(["kept tokens", f"step {clock} s", "x full-length step"],
                                    [[r, f"{v:.3f}", f"{v / full:.2f}"] for r, v in per.items()]) +
                     f"\n\nA line through them: {fit['fixed_s']:.3f} s a step whatever is kept (embedding, head, the "
                     f"first and last layer, the optimizer) + {fit['per_kept_token_s'] * 1e3:.3f} ms per kept token; "
                     f"over the run's schedule ({plan.ltd_min} -> {plan.seq} in {plan.ltd_steps} of {plan.steps} "
                     f"steps) that line gives {expect:.2f}x tokens/s." +
                     (f" Choosing the kept tokens (the hash, top-k and sort for {n - 2} layers) takes "
                      f"{prof['choose_kept_s'] * 1e3:.1f} ms a step." if "choose_kept_s" in prof else "") + ops_table(prof))
    plots(plan, study, runs)
    return finish_report(study, jobs_, parts, page, "data_efficiency")


def expected_gain(plan: Plan, prof: dict) -> float:
    """Tokens/s over a run of the schedule, from the fitted step-time line."""
    from zerotrain.data_efficiency import random_ltd_value

    a, b = prof["fit"]["fixed_s"], prof["fit"]["per_kept_token_s"]
    kept = [min(plan.seq, random_ltd_value(k, plan.ltd_min, plan.seq, plan.ltd_steps, 16)) for k in range(plan.steps)]
    return plan.steps * (a + b * plan.seq) / sum(a + b * r for r in kept)


def ops_table(prof: dict) -> str:
    """The profiled steps by operator, as shares of each step: torch.profiler times operators
    by the wall clock, which a loaded machine stretches, so the shares carry, not the ms."""
    keys = list(prof["ops"])
    rows = {}
    for k in keys:
        for name, ms, _ in prof["ops"][k]["top"]:
            rows.setdefault(name, {})[k] = 100 * ms / prof["ops"][k]["total_ms"]
    lines = [[name] + [f"{v[k]:.1f}%" if k in v else "-" for k in keys] for name, v in
             sorted(rows.items(), key=lambda kv: -max(kv[1].values()))[:12]]
    small = prof["ops"][keys[0]]
    routing = sum(ms for name, ms, _ in small["top"] if re.search("gather|scatter", name)) / small["total_ms"]
    return (f"\n\nThe routing's own gather and scatter operators take {100 * routing:.1f}% of the kept-{keys[0]} step."
            "\n\nOne step by operator (share of the step's self CPU time in torch.profiler; '-': not among the "
            "step's top 14), kept " + " and ".join(keys) + " tokens:\n\n" +
            markdown_table(["operator"] + [f"kept {k}" for k in keys], lines))


def plots(plan: Plan, study: Study, runs: dict) -> None:
    got = {k: v for k, v in runs.items() if v.get("arm") in ARMS}
    if got:
        some = next(iter(got.values()))
        held_out_plot(study.root / "held_out.png", got, COLORS, plan.seeds[0], "data tokens trained", 3.6,
                      f"Data Efficiency on a {some['params'] / 1e6:.1f}M-param GPT, same data-token budget")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(ROOT / "docs" / "results" / "data_efficiency"))
    parser.add_argument("--index", default=None, help="where the analyzer's index files go (default: "
                        "build/data_efficiency_index, or OUT/index with --quick)")
    parser.add_argument("--report", action="store_true", help="only rebuild the tables, plots and page section")
    parser.add_argument("--list", action="store_true", help="print the job list and what is done")
    parser.add_argument("--only", default="", help="run only jobs whose name matches this regular expression")
    parser.add_argument("--quick", action="store_true", help="tiny model, a few steps (the test)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    plan = QUICK if args.quick else Plan()
    study = Study(Path(args.out))
    index = Path(args.index or (Path(args.out) / "index" if args.quick else ROOT / "build" / "data_efficiency_index"))
    page = PAGE if Path(args.out).resolve() == (ROOT / "docs" / "results" / "data_efficiency").resolve() else None
    cache = {}

    def data() -> dict:
        if not cache:
            corpus = load_corpus(max_files=plan.max_files)
            val = windows(corpus.val, plan.eval_windows, plan.seq, seed=10**6)
            cache.update(corpus=corpus, pool=make_pool(corpus.train, plan), val=list(val.split(16)))
        return cache

    all_jobs = jobs(plan, study, data, index)
    if args.list:
        for job, state in study.status(all_jobs):
            print(f"{job.name:14s} {state:16s} {job.note}")
        return
    if not args.report:
        chosen = [j for j in all_jobs if re.search(args.only, j.name)]
        study.run(chosen, report=None if args.quick else (lambda: report(plan, study, all_jobs, page)))
    print(report(plan, study, all_jobs, page))
    print(json.dumps({"done": sum(s == "done" for _, s in study.status(all_jobs)), "jobs": len(all_jobs)}))


if __name__ == "__main__":
    main()
