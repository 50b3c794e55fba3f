"""Study: a sequence-length curriculum against none, at the same token budget, on real text.

    python benchmarks/curriculum.py            # run the runs not done yet (resumable), then the report
    python benchmarks/curriculum.py --report   # only rebuild the tables, plots and page section
    python benchmarks/curriculum.py --list     # the fixed run list and what is done
    python benchmarks/curriculum.py --quick --out /tmp/cq   # a tiny model, a few steps (the test)

One process, one thread. Text: benchmarks/study_text.py (English docs, vim help, Python stdlib;
de-duplicated by hash, then 1 file in 10 held out), bytes as tokens, windows of 256. Every run
uses the DeepSpeed config's `token_budget` block through zerotrain.initialize: `train_tokens`
stops it, `lr_decay_tokens` (= the budget) decays the LR by tokens (cosine to lr/10) after a
warmup in steps, as Megatron-DeepSpeed's --train-tokens / --lr-decay-tokens recipe does. The
curriculum arm adds `curriculum_learning` (seqlen, fixed_linear, min_difficulty 8,
difficulty_step 8, max 256): its early steps are short, so it takes more steps for the same
tokens. Both arms of a setting see the same windows at the same step and run in one process,
alternating by tokens trained, so the machine's load hits both alike; only training steps are
timed (wall-clock and this process's CPU time), evaluations are not. AdamW (betas 0.9/0.95,
weight decay 0.1).

Fixed run list (budgets are tokens; a full-length step of batch 16 is 4,096 tokens):

  1 lr-sweep   1.9M-param GPT (4 layers, width 192), no curriculum, clip 1.0, warmup 10 steps,
               LR 5e-4, 1e-3, 2e-3, 4e-3, 8e-3, seeds 0 and 1, 409,600 tokens each (100 steps).
               The best LR = lowest final held-out loss, mean of the two seeds.
  2 headline   10.8M-param GPT (6 layers, width 384), the best LR, batch 16, clip 1.0, warmup
               10 steps, 614,400 tokens each (150 full steps); curriculum ramp 60 steps;
               seeds 0 and 1, each a pair (none, curriculum). Target: the curriculum reaches the
               baseline's final held-out loss in <= 0.8x the baseline's wall-clock.
  3 stability  the 1.9M model without clipping, warmup 5 steps, 60 full-length steps of the
               setting's batch (tokens = 60 x batch x 256), curriculum ramp 30 steps:
               LR 1x, 2x, 4x, 8x best at batch 16; batch 64 and 128 at LR 4x; seeds 0, 1;
               each a pair. Spikes and divergences counted per run (study_runs.py's rules).
About 65 CPU-minutes in all; 2-4 hours of wall-clock on the shared 2-core machine.
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

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

from study_runs import (Job, Study, count_events, diverging, finish_report,  # noqa: E402
                        first_reach, held_out_plot, machine, markdown_table, mean, plt, race_by_tokens)
from study_text import load_corpus, windows  # noqa: E402

ROOT = HERE.parent
PAGE = ROOT / "docs" / "curriculum-and-layer-drop.md"


@dataclass
class Plan:
    seq: int = 256
    batch: int = 16
    small: dict = field(default_factory=lambda: dict(n_embd=192, n_layer=4, n_head=4))
    big: dict = field(default_factory=lambda: dict(n_embd=384, n_layer=6, n_head=6))
    sweep_lrs: tuple = (5e-4, 1e-3, 2e-3, 4e-3, 8e-3)
    sweep_steps: int = 100  # full-length steps of the budget
    headline_steps: int = 150
    headline_ramp: int = 60
    stability: tuple = ((1, 1), (2, 1), (4, 1), (8, 1), (4, 4), (4, 8))  # (LR x best, batch x 16)
    stability_steps: int = 60
    stability_ramp: int = 30
    seeds: tuple = (0, 1)
    evals: int = 15  # held-out evaluations per run (plus one at the start)
    eval_windows: int = 64
    max_files: int | None = None


QUICK = Plan(seq=64, batch=4, small=dict(n_embd=32, n_layer=2, n_head=2), big=dict(n_embd=48, n_layer=2, n_head=2),
             sweep_lrs=(1e-3, 4e-3), sweep_steps=4, headline_steps=6, headline_ramp=3, stability=((2, 2),),
             stability_steps=4, stability_ramp=2, seeds=(0,), evals=2, eval_windows=4, max_files=12)


def build(plan: Plan, size: str, lr: float, batch: int, tokens: int, warmup: int, clip: float, ramp: int | None,
          seed: int):
    import zerotrain
    from zerotrain.models import GPT, GPTConfig

    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=256, n_positions=plan.seq, **getattr(plan, size)))
    cfg = {"train_micro_batch_size_per_gpu": batch, "gradient_clipping": clip, "steps_per_print": 10**9,
           "optimizer": {"type": "AdamW", "params": {"lr": lr, "betas": [0.9, 0.95], "weight_decay": 0.1}},
           "token_budget": {"train_tokens": tokens, "lr_decay_tokens": tokens, "lr_decay_style": "cosine",
                            "warmup_steps": warmup, "min_lr": lr / 10}}
    if ramp is not None:
        cfg["curriculum_learning"] = {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": 8,
                                      "max_difficulty": plan.seq, "schedule_type": "fixed_linear",
                                      "schedule_config": {"total_curriculum_step": ramp, "difficulty_step": 8}}
    engine, *_ = zerotrain.initialize(model=model, config=cfg)
    return engine, cfg, sum(p.numel() for p in model.parameters())


class Run:
    def __init__(self, plan, run_id, arm, size, lr, batch, tokens, warmup, clip, ramp, seed, setting):
        self.engine, cfg, params = build(plan, size, lr, batch, tokens, warmup, clip, ramp, seed)
        self.id, self.warmup, self.batch, self.seed, self.seq = run_id, warmup, batch, seed, plan.seq
        self.steps: list[list] = []  # [step, tokens after it, seqlen, loss, lr, wall_s, cpu_s]
        self.evals: list[dict] = []
        self.wall = self.cpu = 0.0
        self.diverged = False
        self.record = {"study": "curriculum", "arm": arm, "setting": setting, "model": size, "params": params,
                       "seed": seed, "lr": lr, "batch": batch, "seq": plan.seq, "token_budget": tokens,
                       "warmup_steps": warmup, "gradient_clipping": clip, "curriculum_ramp_steps": ramp,
                       "ds_config": cfg, "machine_start": machine()}

    @property
    def tokens(self) -> int:
        from zerotrain.features.engine_methods import tokens_consumed

        return tokens_consumed(self.engine)

    @property
    def live(self) -> bool:
        return not self.diverged and not self.engine.should_stop()

    def step(self, train: torch.Tensor) -> None:
        k = len(self.steps)
        x = windows(train, self.batch, self.seq, seed=self.seed * 1_000_003 + k)
        before = self.tokens
        w, c = time.perf_counter(), time.process_time()
        loss = self.engine(x, labels=x)
        self.engine.backward(loss)
        self.engine.step()
        self.wall += time.perf_counter() - w
        self.cpu += time.process_time() - c
        lr = self.engine.optimizer.param_groups[0]["lr"]
        seqlen = (self.tokens - before) // self.batch
        self.steps.append([k + 1, self.tokens, seqlen, float(loss.item()), float(lr), round(self.wall, 3),
                           round(self.cpu, 3)])
        self.diverged = diverging([s[3] for s in self.steps], self.warmup)

    def result(self) -> dict:
        losses = [s[3] for s in self.steps]
        return {**self.record, "steps": self.steps, "evals": self.evals, "events": count_events(losses, self.warmup),
                "rules": "study_runs.py: spike > 1.2 x running min after warmup; divergence non-finite or > first loss",
                "final": {"steps": len(self.steps), "tokens": self.tokens, "wall_s": round(self.wall, 2),
                          "cpu_s": round(self.cpu, 2), "val_loss": self.evals[-1]["val_loss"]}}


def race(runs: list[Run], corpus, plan: Plan, eval_every: int) -> dict:
    """Step whichever live run has trained fewer tokens until budgets (or divergence) stop all."""
    print(corpus.describe(), flush=True)
    val = windows(corpus.val, plan.eval_windows, plan.seq, seed=10**6)
    val_batches = list(val.split(16))
    race_by_tokens(runs, val_batches, eval_every, lambda run: run.step(corpus.train))
    out = {}
    for run in runs:
        res = run.result()
        res["corpus"] = corpus.stats
        out[run.id] = res
        f = res["final"]
        print(f"  {run.id}: {f['steps']} steps, {f['tokens']:,} tokens, {f['wall_s']:.0f}s, held-out "
              f"{f['val_loss']:.4f}, events {res['events']}", flush=True)
    return out


def lr_tag(lr: float) -> str:
    return f"{lr:.0e}".replace("e-0", "e-")


def jobs(plan: Plan, study: Study, corpus_fn) -> list[Job]:
    out = []
    sweep_budget = plan.sweep_steps * plan.batch * plan.seq
    for lr in plan.sweep_lrs:
        for seed in plan.seeds:
            rid = f"sweep-lr{lr_tag(lr)}-s{seed}"

            def fn(rid=rid, lr=lr, seed=seed):
                run = Run(plan, rid, "none", "small", lr, plan.batch, sweep_budget, 10, 1.0, None, seed,
                          f"sweep lr {lr:g}")
                return race([run], corpus_fn(), plan, max(1, sweep_budget // plan.evals))

            out.append(Job(rid, [rid], fn, f"small GPT, no curriculum, LR {lr:g}, seed {seed}, {sweep_budget:,} tokens"))
    sweep_ids = [j.runs[0] for j in out]

    def best() -> float:
        return best_lr(plan, study)

    head_budget = plan.headline_steps * plan.batch * plan.seq
    for seed in plan.seeds:
        ids = [f"headline-none-s{seed}", f"headline-curriculum-s{seed}"]

        def fn(ids=ids, seed=seed):
            lr = best()
            runs = [Run(plan, ids[0], "none", "big", lr, plan.batch, head_budget, 10, 1.0, None, seed, "headline"),
                    Run(plan, ids[1], "curriculum", "big", lr, plan.batch, head_budget, 10, 1.0, plan.headline_ramp,
                        seed, "headline")]
            return race(runs, corpus_fn(), plan, max(1, head_budget // plan.evals))

        out.append(Job(f"headline-s{seed}", ids, fn, f"big GPT pair at the best LR, seed {seed}, {head_budget:,} tokens "
                       f"each", needs=sweep_ids))
    for lr_x, batch_x in plan.stability:
        batch = plan.batch * batch_x
        budget = plan.stability_steps * batch * plan.seq
        for seed in plan.seeds:
            tag = f"stab-lr{lr_x}x-b{batch_x}x-s{seed}"
            ids = [f"{tag}-none", f"{tag}-curriculum"]

            def fn(ids=ids, seed=seed, lr_x=lr_x, batch=batch, budget=budget, batch_x=batch_x):
                lr = lr_x * best()
                setting = f"LR {lr_x}x, batch {batch_x}x"
                runs = [Run(plan, ids[0], "none", "small", lr, batch, budget, 5, 0.0, None, seed, setting),
                        Run(plan, ids[1], "curriculum", "small", lr, batch, budget, 5, 0.0, plan.stability_ramp,
                            seed, setting)]
                return race(runs, corpus_fn(), plan, max(1, budget // plan.evals))

            out.append(Job(tag, ids, fn, f"small GPT pair, no clipping, LR {lr_x}x best, batch {batch}, seed {seed}, "
                           f"{budget:,} tokens each", needs=sweep_ids))
    return out


def best_lr(plan: Plan, study: Study) -> float:
    scores = {lr: mean([(study.load(f"sweep-lr{lr_tag(lr)}-s{s}") or {}).get("final", {}).get("val_loss", math.nan)
                        for s in plan.seeds]) for lr in plan.sweep_lrs}
    scores = {lr: v for lr, v in scores.items() if math.isfinite(v)}
    if not scores:
        raise SystemExit("no finished LR-sweep run: run the sweep first")
    return min(scores, key=scores.get)


# ---- report ------------------------------------------------------------------------------------
def saving_along_the_run(plan: Plan, runs: dict) -> str:
    """Where in the run the curriculum's saving lies: for the held-out loss the baseline had at
    a quarter, half, three quarters and all of its tokens, the curriculum's tokens and CPU time
    to the same loss as a fraction of the baseline's. A saving that is large early and shrinks
    towards the end is the token-based LR decay pulling both arms to the same end point."""
    fractions = (0.25, 0.5, 0.75, 1.0)
    rows = []
    for seed in plan.seeds:
        base, cur = runs.get(f"headline-none-s{seed}"), runs.get(f"headline-curriculum-s{seed}")
        if not (base and cur):
            continue
        cells = []
        for frac in fractions:
            mark = frac * base["final"]["tokens"]
            level = next(e for e in base["evals"] if e["tokens"] >= mark)
            b_tok, b_cpu = (first_reach(base["evals"], level["val_loss"], k) for k in ("tokens", "cpu_s"))
            c_tok, c_cpu = (first_reach(cur["evals"], level["val_loss"], k) for k in ("tokens", "cpu_s"))
            cells.append("not reached" if c_tok is None else
                         f"{level['val_loss']:.3f}: {c_tok / b_tok:.2f}x / {c_cpu / b_cpu:.2f}x")
        rows.append([seed] + cells)
    return ("Where the saving lies (the baseline's held-out loss at a fraction of its tokens; the "
            "curriculum's tokens / CPU time to that loss as a multiple of the baseline's):\n\n" +
            markdown_table(["seed"] + [f"at {f:.0%} of the baseline's tokens" for f in fractions], rows))


def report(plan: Plan, study: Study, jobs_: list[Job], page: Path | None) -> str:
    runs = study.all_runs()
    parts = []
    any_run = next(iter(runs.values()), None)
    if any_run:
        c = any_run["corpus"]
        parts.append("Text read: " + "; ".join(f"{k} {v['train_files']} training files ({v['train_bytes']:,} tokens), "
                                               f"{v['val_files']} held out ({v['val_bytes']:,})" for k, v in c.items()))
    # sweep
    rows, sweep_recs = [], []
    for lr in plan.sweep_lrs:
        recs = [runs.get(f"sweep-lr{lr_tag(lr)}-s{s}") for s in plan.seeds]
        got = [r for r in recs if r]
        sweep_recs += got
        if got:
            rows.append([f"{lr:g}", len(got), " / ".join(f"{r['final']['val_loss']:.4f}" for r in got),
                         f"{mean([r['final']['val_loss'] for r in got]):.4f}",
                         sum(r["events"]["spikes"] for r in got), sum(r["events"]["diverged"] for r in got)])
    if rows:
        done = all(runs.get(f"sweep-lr{lr_tag(lr)}-s{s}") for lr in plan.sweep_lrs for s in plan.seeds)
        parts.append(f"**LR sweep** ({sweep_recs[0]['params'] / 1e6:.1f}M-param GPT, no curriculum, "
                     f"{plan.sweep_steps * plan.batch * plan.seq:,} tokens a run):\n\n" +
                     markdown_table(["LR", "seeds", "final held-out loss per seed", "mean", "spikes", "divergences"],
                                    rows) + (f"\n\nBest LR: **{best_lr(plan, study):g}**" if done else ""))
    # headline
    rows, reach = [], []
    for seed in plan.seeds:
        base, cur = runs.get(f"headline-none-s{seed}"), runs.get(f"headline-curriculum-s{seed}")
        for r in (base, cur):
            if r:
                f = r["final"]
                rows.append([r["arm"], seed, f"{r['lr']:g}", f"{r['params'] / 1e6:.1f}M", f["steps"], f"{f['tokens']:,}",
                             f"{f['wall_s']:.0f}", f"{f['cpu_s']:.0f}", f"{f['val_loss']:.4f}"])
        if base and cur:
            target = base["final"]["val_loss"]
            w = first_reach(cur["evals"], target, "wall_s")
            t = first_reach(cur["evals"], target, "tokens")
            c = first_reach(cur["evals"], target, "cpu_s")
            reach.append([seed, f"{target:.4f}", "not reached" if w is None else f"{w:.0f} s",
                          "-" if w is None else f"{w / base['final']['wall_s']:.2f}x",
                          "-" if c is None else f"{c / base['final']['cpu_s']:.2f}x",
                          "-" if t is None else f"{t / base['final']['tokens']:.2f}x"])
    if rows:
        parts.append("**Headline** (same token budget, token-based cosine decay, clip 1.0):\n\n" +
                     markdown_table(["arm", "seed", "LR", "params", "steps", "tokens", "wall-clock s", "CPU s",
                                     "final held-out loss"], rows))
    if reach:
        parts.append("Curriculum to the baseline's final held-out loss (target <= 0.8x wall-clock):\n\n" +
                     markdown_table(["seed", "baseline final", "curriculum reaches it at", "x baseline wall-clock",
                                     "x baseline CPU time", "x baseline tokens"], reach))
        parts.append(saving_along_the_run(plan, runs))
    # stability
    rows = []
    for lr_x, batch_x in plan.stability:
        for arm in ("none", "curriculum"):
            got = [runs.get(f"stab-lr{lr_x}x-b{batch_x}x-s{s}-{arm}") for s in plan.seeds]
            got = [r for r in got if r]
            if got:
                rows.append([f"{lr_x}x ({got[0]['lr']:g})", f"{batch_x}x ({got[0]['batch']})",
                             f"{got[0]['token_budget']:,}", arm, len(got),
                             " / ".join(str(r["events"]["spikes"]) for r in got),
                             " / ".join(("step %d" % r["events"]["diverged_at_step"]) if r["events"]["diverged"]
                                        else "no" for r in got),
                             " / ".join(f"{r['final']['val_loss']:.3f}" for r in got)])
    if rows:
        parts.append("**Stability** (the sweep's model, no clipping, warmup 5 steps; per seed):\n\n" +
                     markdown_table(["LR", "batch", "tokens", "arm", "seeds", "spikes", "diverged",
                                     "final held-out loss"], rows))
    notes = []
    for rid, r in sorted(runs.items()):
        ev = r["events"]
        if ev["diverged"]:
            k = ev["diverged_at_step"]
            before = [e["val_loss"] for e in r["evals"] if e["step"] < k]
            notes.append(f"- `{rid}`: step {k}, training loss {r['steps'][k - 1][3]:.2f} (first step "
                         f"{r['steps'][0][3]:.2f}); held-out loss {before[-1]:.3f} before, "
                         f"{r['evals'][-1]['val_loss']:.3f} after")
    if notes:
        parts.append("Divergences (the run stops there): the held-out loss around each tells a one-batch jump "
                     "from a run gone off.\n\n" + "\n".join(notes))
    plots(plan, study, runs)
    return finish_report(study, jobs_, parts, page, "curriculum", link_plots=True)


def plots(plan: Plan, study: Study, runs: dict) -> None:
    heads = {k: v for k, v in runs.items() if k.startswith("headline-")}
    colors = {"none": "tab:blue", "curriculum": "tab:orange"}
    if heads:
        some = next(iter(heads.values()))
        held_out_plot(study.root / "headline.png", heads, colors, plan.seeds[0], "tokens trained", 3.5,
                      f"seqlen curriculum vs none, {some['params'] / 1e6:.1f}M-param GPT, same token budget")
    stab = {k: v for k, v in runs.items() if k.startswith("stab-")}
    if stab:
        pyplot = plt()
        settings = list(plan.stability)
        cols = min(3, len(settings))
        rows = math.ceil(len(settings) / cols)
        fig, axes = pyplot.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
        for ax, (lr_x, batch_x) in zip(axes.flat, settings):
            for s in plan.seeds:
                for arm in ("none", "curriculum"):
                    r = stab.get(f"stab-lr{lr_x}x-b{batch_x}x-s{s}-{arm}")
                    if r:
                        ax.plot([x[1] for x in r["steps"]], [min(x[3], 8.0) for x in r["steps"]],
                                "-" if s == plan.seeds[0] else "--", color=colors[arm], lw=0.8,
                                label=f"{arm} s{s}")
            ax.set_title(f"LR {lr_x}x, batch {batch_x}x", fontsize=9)
            ax.set_xlabel("tokens")
            ax.set_ylim(0.5, 8.0)
        axes[0][0].set_ylabel("training loss (clipped at 8)")
        axes[0][0].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(study.root / "stability.png", dpi=90)
        pyplot.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(ROOT / "docs" / "results" / "curriculum"))
    parser.add_argument("--report", action="store_true", help="only rebuild the tables, plots and page section")
    parser.add_argument("--list", action="store_true", help="print the run list and what is done")
    parser.add_argument("--only", default="", help="run only jobs whose name matches this regular expression")
    parser.add_argument("--max-jobs", type=int, default=None, help="stop after this many jobs")
    parser.add_argument("--quick", action="store_true", help="tiny model, a few steps (the test)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    plan = QUICK if args.quick else Plan()
    study = Study(Path(args.out))
    page = PAGE if Path(args.out).resolve() == (ROOT / "docs" / "results" / "curriculum").resolve() else None
    cache = {}

    def corpus():
        if "c" not in cache:
            cache["c"] = load_corpus(max_files=plan.max_files)
        return cache["c"]

    all_jobs = jobs(plan, study, corpus)
    if args.list:
        for job, state in study.status(all_jobs):
            print(f"{job.name:28s} {state:16s} {job.note}")
        return
    if not args.report:
        chosen = [j for j in all_jobs if re.search(args.only, j.name)]
        # the report after every job keeps the page current during the long runs (not worth it in --quick)
        study.run(chosen, report=None if args.quick else (lambda: report(plan, study, all_jobs, page)),
                  limit=args.max_jobs)
    print(report(plan, study, all_jobs, page))
    print(json.dumps({"done": sum(s == "done" for _, s in study.status(all_jobs)), "jobs": len(all_jobs)}))


if __name__ == "__main__":
    main()
