"""Study: progressive layer drop on a Pre-LN BERT (MLM), then fine-tuning on three GLUE-format
tasks built from real text, with and without PLD and from a random initialisation.

    python benchmarks/pld_glue.py             # run the runs not done yet (resumable), then the report
    python benchmarks/pld_glue.py --report    # only rebuild the tables, plots and page section
    python benchmarks/pld_glue.py --list      # the fixed run list and what is done
    python benchmarks/pld_glue.py --diagnose  # the short fine-tuning experiments (small BERT)
    python benchmarks/pld_glue.py --probe NAME [--probe-steps K]  # the baseline alone, PROBES[NAME]
    python benchmarks/pld_glue.py --probe-task mrpc                # one fine-tune from random init
    python benchmarks/pld_glue.py --probe-task mrpc --probe-start baseline --probe-seed 1 --probe-ft 3e-4,1000,3
    python benchmarks/pld_glue.py --probe-task mrpc --probe-start baseline --probe-seed 1 --probe-pretrain 64,32,300
    python benchmarks/pld_glue.py --probe-task stsb --probe-start pld --probe-seed 0 --probe-ft-seed 2
    python benchmarks/pld_glue.py --quick --out /tmp/pq   # a tiny model, a few steps (the test)

One process, one thread. Text: benchmarks/study_text.py (English docs, vim help, Python stdlib,
de-duplicated by hash, then 1 file in 10 held out); bytes as tokens plus three ids: 256 [CLS]
(also [SEP]), 257 [PAD], 258 [MASK]. Every pretraining window starts with [CLS], as BERT's do.

Pretraining (the third source document's recipe, scaled to a CPU): the built-in Pre-LN BERT,
8 layers, hidden 256, 4 heads, FFN 1024, dropout 0.1 (6.5M parameters), MLM on 15% of
positions (80/10/10), sequences of 128, batch 16; Adam (bias correction on), lr 1e-3, weight
decay 0.01, clipping 1.0; the warmup_linear_decay_exp schedule (50 warmup steps, 0.99 every
N/200 steps). The document's own optimizer settings (bias_correction false, 2% warmup: 6
steps here), made for a batch of 4,096, leave this model on the byte-unigram plateau at 64 x
32 (held-out MLM 3.46 after 200 steps against a unigram entropy of 3.50; with bias correction
and 50 warmup steps 3.10): `--probe` measures each setting, PROBES lists them.
Per seed (0 and 1) one job races two engines in one process, each next step going to the one
that has trained for less time: the baseline trains N = 900 steps (14,400 samples) on a
schedule planned for N; PLD (theta 0.5, gamma = ln(50) / (N/4), so theta is within 0.01 of 0.5
after a quarter of the run) has its own schedule, planned for 1.35 N steps (what PLD reached in
the baseline's wall-clock in a 300-step study), and trains until its summed step time reaches
the baseline's (equal wall-clock) or its planned steps are done. Held-out MLM loss (eval
mode, all layers, 8 fixed masked batches of held-out text) every N/10 steps of each run.
Targets: PLD samples/s >= 1.24x the baseline's (over the steps after theta settled), and PLD
reaching the baseline's final held-out loss in <= 0.8x the baseline's wall-clock.

Fine-tuning: three tasks written in GLUE's layouts (train from training files, dev from
held-out files; `zerotrain train --task_name ... --data_dir` reads the same folders), each
balanced so the majority class is 50%:

    cola-like  one line of Python: does it parse on its own (ast.parse)?          MCC / accuracy
    mrpc-like  two lines: is the second the first with its names consistently renamed
               (a paraphrase), or another line of the same function renamed
               the same way?                                                     F1 / accuracy
    stsb-like  two lines: 5 x the Jaccard overlap of their identifier sets, a fifth
               of the pairs in each fifth of the range 0-5                       Pearson / Spearman

For each pretraining seed, three starts (baseline, PLD, random init of the same shape) x three
tasks: 1,000 training rows, 3 epochs, batch 32, AdamW lr 1e-3 (bias correction on), linear
warmup 10% then linear decay, dropout 0.1, the built-in classifier's pooler and head fed the
mean of the encoder's outputs over the line (not its first position: see --diagnose), dev
metrics (500 rows) at the end. A task counts as learnt when a model beats the majority class
by >= 5 accuracy points, MCC >= 0.1, Pearson >= 0.2.
Measured (one process per seed, both at once on the 2-core machine, shared for part of the
run with a 1.23B-parameter job; runs/*.json): a pretraining job 26-27 minutes of wall-clock
(1,032-1,063 CPU s of steps per arm, a baseline step 1.15-1.18 CPU s); a fine-tuning job 78-96
CPU s (CoLA-like) or 151-182 (the pair tasks); the whole study about 115 CPU-minutes, 85 minutes
of wall-clock.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

from code_tasks import CLS, TASKS, encode, learnt, make_tasks, metrics, write_glue  # noqa: E402
from study_runs import Job, Study, finish_report, first_reach, machine, markdown_table, mean, plt  # noqa: E402
from study_text import load_corpus, windows  # noqa: E402

ROOT = HERE.parent
PAGE = ROOT / "docs" / "curriculum-and-layer-drop.md"
MASK, VOCAB = 258, 259  # after the bytes, CLS and PAD (code_tasks.py)


@dataclass
class Plan:
    # the document's 128 positions: a fine-tuning pair reaches 115 (2 lines of up to 56 bytes and
    # 3 markers), and positions the pretraining never filled keep their random embeddings
    seq: int = 128
    batch: int = 16  # 2,048 tokens a step, as the probes' 64 x 32
    bert: dict = field(default_factory=lambda: dict(n_embd=256, n_layer=8, n_head=4, n_inner=1024, dropout=0.1))
    steps: int = 900
    # PLD's own LR schedule is planned for this many times the baseline's steps: the step count the
    # 300-step study's PLD arm reached in the baseline's wall-clock (404 / 300), so neither arm's last
    # steps run on a schedule planned for the other
    pld_steps_ratio: float = 1.35
    # the document's optimizer at its batch of 4,096 is lr 1e-3, bias_correction false, 2%
    # warmup; at batch 32 that keeps the encoder on the byte-unigram plateau (PROBES)
    lr: float = 1e-3
    warmup: int | None = 50  # LR warmup steps; None: 2% of the steps (the document's)
    bias_correction: bool = True
    evals: int = 10
    eval_batches: int = 8
    seeds: tuple = (0, 1)
    ft_rows: int = 1000
    ft_dev: int = 500
    ft_epochs: int = 3
    ft_batch: int = 32
    ft_lr: float = 1e-3  # a random start learns the MRPC-like task at 1e-3, barely at 3e-4 (--probe-task)
    ft_line: tuple = (16, 56)  # line lengths kept (characters)
    max_files: int | None = None
    weights: Path = ROOT / "runs" / "pld_glue_weights"


QUICK = Plan(seq=32, batch=4, bert=dict(n_embd=32, n_layer=2, n_head=2, n_inner=64, dropout=0.1), steps=6, warmup=2,
             evals=2, eval_batches=1, seeds=(0,), ft_rows=16, ft_dev=16, ft_epochs=1, ft_batch=8, max_files=6)


# ---- model and masking -------------------------------------------------------------------------
def bert_config(plan: Plan, num_labels: int = 2):
    from zerotrain.models import BertConfig

    return BertConfig(vocab_size=VOCAB, n_positions=max(plan.seq, 2 * plan.ft_line[1] + 3), num_labels=num_labels,
                      **plan.bert)


def mlm_batch(stream: torch.Tensor, plan: Plan, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[CLS] + 127 bytes; 15% of the byte positions picked: 80% [MASK], 10% a random byte, 10% kept."""
    g = torch.Generator().manual_seed(seed)
    ids = windows(stream, plan.batch, plan.seq - 1, seed)
    picked = torch.rand(ids.shape, generator=g) < 0.15
    labels = torch.where(picked, ids, torch.full_like(ids, -100))
    roll = torch.rand(ids.shape, generator=g)
    inputs = torch.where(picked & (roll < 0.8), torch.full_like(ids, MASK), ids)
    inputs = torch.where(picked & (roll >= 0.8) & (roll < 0.9), torch.randint(0, 256, ids.shape, generator=g), inputs)
    cls = torch.full((plan.batch, 1), CLS)
    return torch.cat([cls, inputs], 1), torch.cat([torch.full_like(cls, -100), labels], 1)


# ---- pretraining -------------------------------------------------------------------------------
def build_pretrain(plan: Plan, seed: int, pld: dict | None, steps: int | None = None):
    """One arm's engine, its LR schedule planned for `steps` (default: the plan's)."""
    import zerotrain
    from zerotrain.models import PreLNBertMLM

    steps = steps or plan.steps
    torch.manual_seed(seed)
    model = PreLNBertMLM(bert_config(plan))
    cfg = {"train_batch_size": plan.batch, "train_micro_batch_size_per_gpu": plan.batch, "steps_per_print": 10**9,
           "optimizer": {"type": "Adam", "params": {"lr": plan.lr, "weight_decay": 0.01,
                                                    "bias_correction": plan.bias_correction}},
           "gradient_clipping": 1.0}
    if pld:
        cfg["progressive_layer_drop"] = {"enabled": True, **pld}
    warmup = plan.warmup if plan.warmup is not None else max(1, round(0.02 * steps))
    decay_steps = max(1, steps // 200)
    schedule = lambda opt: zerotrain.get_scheduler("warmup_linear_decay_exp", opt, warmup, steps,  # noqa: E731
                                                   decay_rate=0.99, decay_steps=decay_steps)
    engine, *_ = zerotrain.initialize(model=model, config=cfg, lr_scheduler=schedule)
    return engine, model, cfg


@torch.no_grad()
def mlm_val_loss(engine, val: torch.Tensor, plan: Plan) -> float:
    engine.eval()
    total = 0.0
    for i in range(plan.eval_batches):
        inputs, labels = mlm_batch(val, plan, 10**7 + i)
        total += engine(inputs, labels=labels).item()
    engine.train()
    return total / plan.eval_batches


def pretrain(plan: Plan, seed: int, corpus) -> dict:
    from zerotrain.features.layer_drop import keep_probabilities

    print(corpus.describe(), flush=True)
    gamma = math.log(50) / (0.25 * plan.steps)
    planned = {"baseline": plan.steps, "pld": round(plan.pld_steps_ratio * plan.steps)}
    arms = {"baseline": build_pretrain(plan, seed, None, planned["baseline"]),
            "pld": build_pretrain(plan, seed, {"theta": 0.5, "gamma": gamma}, planned["pld"])}
    logs = {a: {"steps": [], "evals": [], "wall": 0.0, "cpu": 0.0} for a in arms}
    every = max(1, plan.steps // plan.evals)

    def evaluate(arm):
        lg = logs[arm]
        lg["evals"].append({"step": len(lg["steps"]), "samples": len(lg["steps"]) * plan.batch,
                            "wall_s": round(lg["wall"], 3), "cpu_s": round(lg["cpu"], 3),
                            "val_loss": mlm_val_loss(arms[arm][0], corpus.val, plan)})

    for arm in arms:
        evaluate(arm)

    def live(arm):
        if arm == "baseline":
            return len(logs[arm]["steps"]) < plan.steps
        if len(logs["pld"]["steps"]) >= planned["pld"]:
            return False
        return len(logs["baseline"]["steps"]) < plan.steps or logs["pld"]["wall"] < logs["baseline"]["wall"]

    n_layer = plan.bert["n_layer"]
    while any(live(a) for a in arms):
        arm = min((a for a in arms if live(a)), key=lambda a: logs[a]["wall"])
        engine, lg = arms[arm][0], logs[arm]
        k = len(lg["steps"])
        theta = engine.get_pld_theta() if arm == "pld" else 1.0  # what this step uses
        inputs, labels = mlm_batch(corpus.train, plan, seed * 1_000_003 + k)
        w, c = time.perf_counter(), time.process_time()
        loss = engine(inputs, labels=labels)
        engine.backward(loss)
        engine.step()
        lg["wall"] += time.perf_counter() - w
        lg["cpu"] += time.process_time() - c
        kept = sum(keep_probabilities(n_layer, theta)) / n_layer if arm == "pld" else 1.0
        lg["steps"].append([k + 1, float(loss.item()), float(theta), round(kept, 4), round(lg["wall"], 3),
                            round(lg["cpu"], 3)])
        if (k + 1) % every == 0 or not live(arm):
            evaluate(arm)
    plan.weights.mkdir(parents=True, exist_ok=True)
    out = {}
    for arm, (engine, model, cfg) in arms.items():
        torch.save(engine.module_state_dict(), weights_path(plan, seed, arm))
        lg = logs[arm]
        settled = next((s[0] - 1 for s in lg["steps"] if s[2] <= 0.51), 0) if arm == "pld" else 0
        out[f"pretrain-{arm}-s{seed}"] = {
            "study": "pld_glue", "kind": "pretrain", "arm": arm, "seed": seed, "params": sum(p.numel() for p in
                                                                                              model.parameters()),
            "bert": plan.bert, "seq": plan.seq, "batch": plan.batch, "planned_steps": planned[arm], "gamma": gamma,
            "ds_config": cfg, "corpus": corpus.stats, "machine_start": machine(),
            "steps": lg["steps"], "evals": lg["evals"], "settled_from_step": settled,
            "final": {"steps": len(lg["steps"]), "samples": len(lg["steps"]) * plan.batch, "wall_s": round(lg["wall"], 2),
                      "cpu_s": round(lg["cpu"], 2), "val_loss": lg["evals"][-1]["val_loss"]}}
        print(f"  pretrain {arm} seed {seed}: {len(lg['steps'])} steps in {lg['wall']:.0f}s, held-out MLM "
              f"{lg['evals'][-1]['val_loss']:.4f}", flush=True)
    return out


def weights_path(plan: Plan, seed: int, arm: str) -> Path:
    """The study's weights file, or a probe's when its pretraining shape differs from the plan's."""
    default = Plan()
    tag = "" if (plan.seq, plan.batch, plan.steps) == (default.seq, default.batch, default.steps) or plan is QUICK \
        else f"-seq{plan.seq}x{plan.batch}-{plan.steps}steps"
    return plan.weights / f"{'quick-' if plan is QUICK else ''}pretrain-{arm}-s{seed}{tag}.pt"


# ---- fine-tuning ---------------------------------------------------------------------------------
@dataclass
class FT:
    lr: float = 1e-4
    epochs: int = 3
    batch: int = 32
    optimizer: str = "AdamW"  # or "Adam-nobc": Adam with bias_correction false (the pretraining's)
    warmup: float = 0.1
    dropout: float | None = None  # None: the model's
    pool: str = "mean"  # "cls": the built-in head's first-token pooling; "mean": over the non-padding positions


def finetune(plan: Plan, task: str, init: dict | None, data: dict, seed: int, ft: FT) -> dict:
    import zerotrain
    from zerotrain.models import PreLNBertClassifier

    torch.manual_seed(1000 + seed)
    cfg = bert_config(plan, TASKS[task][2])
    cfg = replace(cfg, pooling=ft.pool)
    if ft.dropout is not None:
        cfg = replace(cfg, dropout=ft.dropout)
    model = PreLNBertClassifier(cfg)
    if init is not None:
        missing, unexpected = model.load_state_dict(init, strict=False)
        assert not [k for k in missing if k.startswith("bert.")], missing
    train, dev = data["train"], data["dev"]
    steps = ft.epochs * math.ceil(len(train) / ft.batch)
    params = {"lr": ft.lr, "weight_decay": 0.01}
    if ft.optimizer == "Adam-nobc":
        opt = {"type": "Adam", "params": {**params, "bias_correction": False}}
    else:
        opt = {"type": "AdamW", "params": params}
    ds = {"train_micro_batch_size_per_gpu": ft.batch, "gradient_clipping": 1.0, "optimizer": opt,
          "steps_per_print": 10**9}
    sched = lambda o: zerotrain.get_scheduler("linear", o, round(ft.warmup * steps), steps)  # noqa: E731
    engine, *_ = zerotrain.initialize(model=model, config=ds, lr_scheduler=sched)
    rng = random.Random(seed)
    max_len = 2 * plan.ft_line[1] + 3
    losses, wall, cpu = [], time.perf_counter(), time.process_time()
    for epoch in range(ft.epochs):
        order = list(range(len(train)))
        rng.shuffle(order)
        for i in range(0, len(order), ft.batch):
            rows = [train[j] for j in order[i: i + ft.batch]]
            ids, tt, mask = encode(rows, max_len)
            y = torch.tensor([r[2] for r in rows], dtype=torch.float if task == "stsb" else torch.long)
            loss = engine(ids, attention_mask=mask, token_type_ids=tt, labels=y)
            engine.backward(loss)
            engine.step()
            losses.append(round(float(loss.item()), 5))
    engine.eval()
    preds = []
    with torch.no_grad():
        for i in range(0, len(dev), 64):
            rows = dev[i: i + 64]
            ids, tt, mask = encode(rows, max_len)
            out = engine(ids, attention_mask=mask, token_type_ids=tt)
            preds += out.squeeze(-1).tolist() if task == "stsb" else out.argmax(-1).tolist()
    m = metrics(task, preds, [r[2] for r in dev])
    return {"losses": losses, "metrics": m, "learnt": learnt(task, m), "ft": ft.__dict__, "rows": len(train),
            "dev_rows": len(dev), "steps": len(losses), "wall_s": round(time.perf_counter() - wall, 1),
            "cpu_s": round(time.process_time() - cpu, 1)}


def jobs(plan: Plan, study: Study, corpus_fn) -> list[Job]:
    out = []
    tasks_cache = {}

    def tasks():
        if "t" not in tasks_cache:
            tasks_cache["t"] = make_tasks(plan.ft_rows, plan.ft_dev, plan.ft_line, plan.max_files)
            write_glue(tasks_cache["t"], study.root / "glue")
        return tasks_cache["t"]

    for seed in plan.seeds:
        ids = [f"pretrain-baseline-s{seed}", f"pretrain-pld-s{seed}"]
        ft_ids = [f"ft-{init}-{task}-s{seed}" for init in ("baseline", "pld", "random") for task in TASKS]

        def weights_ok(seed=seed, ft_ids=ft_ids):
            return all(weights_path(plan, seed, a).is_file() for a in ("baseline", "pld")) or all(
                study.have(r) for r in ft_ids)

        out.append(Job(f"pretrain-s{seed}", ids, lambda seed=seed: pretrain(plan, seed, corpus_fn()),
                       f"BERT pair (baseline {plan.steps} steps x {plan.batch}; PLD on its own "
                       f"{round(plan.pld_steps_ratio * plan.steps)}-step schedule to equal wall-clock), seed {seed}",
                       done=weights_ok))
        for init in ("baseline", "pld", "random"):
            for task in TASKS:
                rid = f"ft-{init}-{task}-s{seed}"

                def fn(rid=rid, init=init, task=task, seed=seed):
                    state = None if init == "random" else torch.load(weights_path(plan, seed, init))
                    res = finetune(plan, task, state, tasks()[task], seed, FT(plan.ft_lr, plan.ft_epochs, plan.ft_batch))
                    res.update({"study": "pld_glue", "kind": "finetune", "init": init, "task": task, "seed": seed,
                                "machine_start": machine()})
                    print(f"  {rid}: {res['metrics']}", flush=True)
                    return {rid: res}

                out.append(Job(rid, [rid], fn, f"fine-tune {init} on {task}-like, seed {seed}",
                               needs=[] if init == "random" else ids))
    return out


# ---- diagnosis: why fine-tuning learnt nothing ---------------------------------------------------
DIAG_CASES = {
    "A: Adam no-bias-correction lr 1e-3, 1 epoch": FT(lr=1e-3, epochs=1, optimizer="Adam-nobc", pool="cls"),
    "B: AdamW lr 1e-3, 1 epoch": FT(lr=1e-3, epochs=1, pool="cls"),
    "C: AdamW lr 1e-4, 3 epochs": FT(lr=1e-4, epochs=3, pool="cls"),
    "D: AdamW lr 1e-4, 3 epochs, mean pooling": FT(lr=1e-4, epochs=3, pool="mean"),
    "E: AdamW lr 1e-3, 3 epochs, mean pooling": FT(lr=1e-3, epochs=3, pool="mean"),
    "F: AdamW lr 3e-4, 3 epochs, mean pooling": FT(lr=3e-4, epochs=3, pool="mean"),
}


def probe(init: dict | None, plan: Plan, data: dict) -> dict:
    """Dev accuracy of a logistic regression on the frozen encoder's [CLS] output and on its mean
    over the line: what each pooling can see before any fine-tuning."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler
    from zerotrain.models import PreLNBertClassifier

    torch.manual_seed(0)
    model = PreLNBertClassifier(bert_config(plan, 2)).eval()
    if init is not None:
        model.load_state_dict(init, strict=False)
    feats = {}
    for split in ("train", "dev"):
        rows = data[split][:400]
        ids, tt, mask = encode(rows, 2 * plan.ft_line[1] + 3)
        with torch.no_grad():
            h = model.bert(ids, mask, tt)
        m = mask[..., None].float()
        feats[split] = ({"cls": h[:, 0], "mean": (h * m).sum(1) / m.sum(1)}, [r[2] for r in rows])
    out = {}
    for pool in ("cls", "mean"):
        x, y = feats["train"][0][pool].numpy(), feats["train"][1]
        scale = StandardScaler().fit(x)
        clf = LogisticRegression(max_iter=3000).fit(scale.transform(x), y)
        out[pool] = clf.score(scale.transform(feats["dev"][0][pool].numpy()), feats["dev"][1])
    return out


def diagnose(study: Study) -> None:
    """Short fine-tunes of a small BERT (4 layers, hidden 128) pretrained 300 steps, on the three
    tasks, over the settings in DIAG_CASES; written to <out>/diagnosis.json."""
    plan = Plan(bert=dict(n_embd=128, n_layer=4, n_head=2, n_inner=512, dropout=0.1), steps=300, evals=3,
                ft_rows=1000, ft_dev=400, seeds=(0,), weights=Plan().weights / "diagnosis")
    path = study.root / "diagnosis.json"
    done = json.loads(path.read_text()) if path.is_file() else {}
    if not weights_path(plan, 0, "baseline").is_file():
        done["pretrain"] = {k: v["final"] for k, v in pretrain(plan, 0, load_corpus()).items()}
        path.write_text(json.dumps(done, indent=1))
    init = torch.load(weights_path(plan, 0, "baseline"))
    data = make_tasks(plan.ft_rows, plan.ft_dev, plan.ft_line)
    done["class_balance"] = {t: {s: mean([r[2] for r in rows]) for s, rows in d.items()} for t, d in data.items()}
    for start, state in (("pretrained", init), ("random", None)):
        done[f"probe | {start} | cola"] = probe(state, plan, data["cola"])
        print("linear probe, CoLA-like dev accuracy:", start, done[f"probe | {start} | cola"], flush=True)
    path.write_text(json.dumps(done, indent=1))
    for start in ("pretrained", "random"):  # the pretrained model's verdicts first
        for name, ft in DIAG_CASES.items():
            for task in TASKS:
                key = f"{name} | {start} | {task}"
                if key in done:
                    continue
                res = finetune(plan, task, init if start == "pretrained" else None, data[task], 0, ft)
                done[key] = {"metrics": res["metrics"], "learnt": res["learnt"], "steps": res["steps"],
                             "first_losses": res["losses"][:5], "last_losses": res["losses"][-5:]}
                print(key, {k: round(v, 3) for k, v in res["metrics"].items()}, flush=True)
                path.write_text(json.dumps(done, indent=1))


# ---- probe: does the baseline's pretraining leave the byte-unigram plateau? -----------------------
DOC = dict(lr=1e-3, warmup=None, bias_correction=False)  # the document's optimizer, as the first study ran it
PROBES = {
    "doc-seq128-b16": dict(seq=128, batch=16, **DOC),
    "doc-seq64-b32": dict(seq=64, batch=32, **DOC),
    "lr3e-4-bc-w50-seq64-b32": dict(seq=64, batch=32, lr=3e-4, warmup=50, bias_correction=True),
    "lr1e-4-bc-w50-seq64-b32": dict(seq=64, batch=32, lr=1e-4, warmup=50, bias_correction=True),
    "lr3e-4-nobc-w50-seq64-b32": dict(seq=64, batch=32, lr=3e-4, warmup=50, bias_correction=False),
    "lr1e-3-bc-w50-seq64-b32": dict(seq=64, batch=32, lr=1e-3, warmup=50, bias_correction=True),
    "lr2e-3-bc-w50-seq64-b32": dict(seq=64, batch=32, lr=2e-3, warmup=50, bias_correction=True),
    "lr1e-3-nobc-w50-seq64-b32": dict(seq=64, batch=32, lr=1e-3, warmup=50, bias_correction=False),
}


def probe_pretraining(plan: Plan, name: str, study: Study, steps: int) -> dict:
    """The baseline arm alone for `steps` steps with PROBES[name]'s settings, held-out MLM loss
    every steps/10; written to <out>/probes/<name>.json, read against the byte unigram entropy
    (the loss of predicting a masked byte by its frequency)."""
    from study_text import unigram_entropy

    plan = replace(plan, steps=steps, **PROBES[name])
    corpus = load_corpus()
    engine, model, cfg = build_pretrain(plan, 0, None)
    evals, losses, cpu, every = [], [], 0.0, max(1, steps // 10)
    for k in range(steps + 1):
        if k % every == 0 or k == steps:
            evals.append({"step": k, "val_loss": round(mlm_val_loss(engine, corpus.val, plan), 4),
                          "cpu_s": round(cpu, 1), "train_loss": round(mean(losses[-every:]), 4) if losses else None})
            print(name, evals[-1], flush=True)
        if k == steps:
            break
        inputs, labels = mlm_batch(corpus.train, plan, k)
        c = time.process_time()
        loss = engine(inputs, labels=labels)
        engine.backward(loss)
        engine.step()
        cpu += time.process_time() - c
        losses.append(float(loss.item()))
    res = {"name": name, "settings": PROBES[name], "bert": plan.bert, "params": sum(p.numel() for p in
                                                                                   model.parameters()),
           "steps": steps, "cpu_s_per_step": round(cpu / steps, 3), "evals": evals,
           "unigram_entropy_held_out": round(unigram_entropy(corpus.val), 4), "ds_config": cfg, "machine": machine()}
    out = study.root / "probes"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(res, indent=1) + "\n")
    return res


def baseline_weights(plan: Plan, seed: int) -> dict:
    """The baseline arm's pretrained weights: the study's file when it is there, else the arm
    trained alone with the study's data, schedule and steps (its dropout draws differ from the
    race's, where the PLD arm's steps share the generator), saved for the next probe."""
    path = weights_path(plan, seed, "baseline")
    if not path.exists():
        corpus = load_corpus()
        engine, _, _ = build_pretrain(plan, seed, None)
        for k in range(plan.steps):
            inputs, labels = mlm_batch(corpus.train, plan, seed * 1_000_003 + k)
            engine.backward(engine(inputs, labels=labels))
            engine.step()
        print(f"baseline seed {seed} pretrained alone: held-out MLM {mlm_val_loss(engine, corpus.val, plan):.4f}",
              flush=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(engine.module_state_dict(), path)
    return torch.load(path)


def probe_task(plan: Plan, task: str, study: Study, start: str = "random", seed: int = 0,
               ft_seed: int | None = None) -> dict:
    """One fine-tuning job with the plan's settings from a random initialisation (can a start
    with nothing pretrained learn the task at this size?), from the baseline's pretrained
    weights (does the fine-tuning LR, or the pretraining's shape, decide what a pretrained start
    learns?) or from the study's PLD weights; `ft_seed` sets the rows' order and the head's (for
    a random start, every weight's) draws, so its spread can be measured apart from the start's.
    Written to <out>/probes/ft-<task>-....json."""
    path = weights_path(plan, seed, "pld")
    if start == "pld" and not path.is_file():  # a PLD arm is not pretrained alone: the study's own weights
        raise SystemExit(f"{path}: no PLD weights of this shape; the study's pretraining writes them "
                         f"(python benchmarks/pld_glue.py --only 'pretrain-s{seed}$'), without --probe-pretrain")
    data = make_tasks(plan.ft_rows, plan.ft_dev, plan.ft_line, plan.max_files)[task]
    if start == "pld":
        init = torch.load(path)
    else:
        init = None if start == "random" else baseline_weights(plan, seed)
    ft_seed = seed if ft_seed is None else ft_seed
    res = finetune(plan, task, init, data, ft_seed, FT(plan.ft_lr, plan.ft_epochs, plan.ft_batch))
    res.update({"task": task, "start": start, "seed": seed, "ft_seed": ft_seed,
                "n_positions": bert_config(plan).n_positions, "machine": machine()})
    if init is not None:
        res["pretrain"] = {"seq": plan.seq, "batch": plan.batch,
                           "steps": "the race's" if start == "pld" else f"{plan.steps} steps"}
    print(task, start, res["metrics"], "learnt" if res["learnt"] else "not learnt", f"{res['cpu_s']} CPU s",
          flush=True)
    out = study.root / "probes"
    out.mkdir(parents=True, exist_ok=True)
    tag = "" if start == "random" else f"-{start}-s{seed}" + weights_path(plan, seed, start).stem.partition(
        f"-s{seed}")[2]
    tag += f"-ft{ft_seed}" if ft_seed != seed else ""
    (out / f"ft-{task}{tag}-lr{plan.ft_lr:g}-rows{plan.ft_rows}-ep{plan.ft_epochs}.json").write_text(
        json.dumps(res, indent=1) + "\n")
    return res


# ---- report --------------------------------------------------------------------------------------
def report(plan: Plan, study: Study, jobs_: list[Job], page: Path | None) -> str:
    runs = study.all_runs()
    parts = []
    rows, reach = [], []
    for seed in plan.seeds:
        base, pld = runs.get(f"pretrain-baseline-s{seed}"), runs.get(f"pretrain-pld-s{seed}")
        if not (base and pld):
            continue
        k0 = pld["settled_from_step"]
        sps = {}
        for name, r in (("baseline", base), ("pld", pld)):
            st = r["steps"]
            window = [s for s in st if s[0] > k0 and s[0] <= base["final"]["steps"]]
            t = sum(b[4] - a[4] for a, b in zip(st, st[1:]) if b[0] > k0 and b[0] <= base["final"]["steps"])
            sps[name] = plan.batch * (len(window) - 1) / t if t > 0 else math.nan
            f = r["final"]
            rows.append([name, seed, f"{r['params'] / 1e6:.1f}M", f["steps"], f["samples"], f"{f['wall_s']:.0f}",
                         f"{f['cpu_s']:.0f}", f"{sps[name]:.2f}", f"{r['evals'][-1]['val_loss']:.4f}"])
        target = base["final"]["val_loss"]
        w = first_reach(pld["evals"], target, "wall_s")
        kept = mean([s[3] for s in pld["steps"]])
        reach.append([seed, f"{pld['gamma']:.4f}", k0, f"{sps['pld'] / sps['baseline']:.2f}x", f"{100 * kept:.1f}%",
                      f"{target:.4f}", "not reached" if w is None else f"{w / base['final']['wall_s']:.2f}x"])
    if rows:
        planned = next(r.get("planned_steps") for k, r in runs.items() if k.startswith("pretrain-pld"))
        parts.append(f"**Pretraining** (Pre-LN BERT MLM, seq {plan.seq}, batch {plan.batch}; PLD on its own LR schedule "
                     f"planned for {planned} steps, stopped at the baseline's wall-clock or there):\n\n" +
                     markdown_table(["arm", "seed", "params", "steps", "samples", "wall-clock s", "CPU s",
                                     "samples/s (theta settled)", "final held-out MLM loss"], rows))
        parts.append("PLD against the baseline (targets: >= 1.24x samples/s; the baseline's final held-out loss in "
                     "<= 0.8x its wall-clock):\n\n" +
                     markdown_table(["seed", "gamma", "theta settled from step", "samples/s", "block passes kept",
                                     "baseline final loss", "PLD reaches it at"], reach))
    # fine-tuning table shaped like the document's
    rows = []
    for init in ("baseline", "pld", "random"):
        got = {t: [runs.get(f"ft-{init}-{t}-s{s}") for s in plan.seeds] for t in TASKS}
        got = {t: [r for r in v if r] for t, v in got.items()}
        if not any(got.values()):
            continue
        cells, avgs = [], []
        for t in TASKS:
            ms = [r["metrics"] for r in got[t]]
            if not ms:
                cells.append("-")
                continue
            if t == "mrpc":
                a, b = mean([m["f1"] for m in ms]), mean([m["accuracy"] for m in ms])
            elif t == "cola":
                a, b = mean([m["matthews_correlation"] for m in ms]), mean([m["accuracy"] for m in ms])
            else:
                a, b = mean([m["pearson"] for m in ms]), mean([m["spearmanr"] for m in ms])
            n_learnt = sum(r["learnt"] for r in got[t])
            cells.append(f"{100 * a:.1f}/{100 * b:.1f} ({n_learnt}/{len(ms)} learnt)")
            avgs.append((a + b) / 2)
        name = {"baseline": "baseline (no PLD)", "pld": "PLD", "random": "random init"}[init]
        rows.append([name] + cells + [f"{100 * mean(avgs):.1f}" if len(avgs) == len(TASKS) else "-",
                                      ", ".join(str(s) for s in plan.seeds if all(runs.get(f"ft-{init}-{t}-s{s}")
                                                                                 for t in TASKS))])
    if rows:
        parts.append("**Fine-tuning** (dev sets from held-out files, classes balanced: majority 50%; mean over seeds; "
                     "a task is learnt at +5 accuracy points, MCC 0.1 or Pearson 0.2):\n\n" +
                     markdown_table(["pretraining", "CoLA-like MCC/Acc.", "MRPC-like F1/Acc.", "STS-B-like PCC/SCC",
                                     "average", "seeds complete"], rows))
    probes = [json.loads(f.read_text()) for f in sorted((study.root / "probes").glob("*.json"))]
    pre = [r for r in probes if "evals" in r]
    if pre:
        at = sorted({e["step"] for r in pre for e in r["evals"] if e["step"] and e["step"] % 50 == 0})
        prows = []
        for r in sorted(pre, key=lambda r: list(PROBES).index(r["name"]) if r["name"] in PROBES else 99):
            got = {e["step"]: e["val_loss"] for e in r["evals"]}
            st = r["settings"]
            warm = st["warmup"] if st["warmup"] is not None else f"{max(1, round(0.02 * r['steps']))} (2%)"
            prows.append([st["lr"], "on" if st["bias_correction"] else "off", warm, f"{st['seq']} x {st['batch']}"] +
                         [f"{got[k]:.3f}" if k in got else "-" for k in at] + [f"{r['cpu_s_per_step']:.2f}"])
        parts.append(f"**Pretraining probes** (`--probe NAME`: the baseline alone, {pre[0]['params'] / 1e6:.1f}M "
                     f"parameters, held-out MLM loss; the byte unigram entropy of the held-out text is "
                     f"{pre[0]['unigram_entropy_held_out']:.3f}):\n\n" +
                     markdown_table(["lr", "bias correction", "warmup steps", "seq x batch"] +
                                    [f"step {k}" for k in at] + ["CPU s/step"], prows))
    ftp = [r for r in probes if "metrics" in r]
    if ftp:
        shown = ("accuracy", "f1", "matthews_correlation", "pearson")
        def start(r):
            fs = r.get("ft_seed", r.get("seed", 0))
            if r.get("start", "random") == "random":
                return f"random (seed {fs}, {r['n_positions']} positions)"
            pre = r["pretrain"]
            return (f"{r['start']} s{r['seed']} ({pre['seq']} x {pre['batch']}, {pre['steps']})"
                    + (f", fine-tuning seed {fs}" if fs != r["seed"] else ""))

        frows = [[r["task"], start(r),
                  r["ft"]["lr"], r["rows"], r["steps"],
                  ", ".join(f"{k} {v:.3f}" for k, v in r["metrics"].items() if k in shown),
                  "yes" if r["learnt"] else "no", f"{r['cpu_s']:.0f}"] for r in ftp]
        parts.append("**Fine-tuning probes** (`--probe-task TASK [--probe-start baseline|pld --probe-seed S] "
                     "[--probe-ft-seed K] [--probe-ft LR,ROWS,EPOCHS] [--probe-pretrain SEQ,BATCH,STEPS]`: a random "
                     "initialisation, the study's pretrained weights or a baseline pretrained alone at another "
                     "shape, otherwise the study's fine-tuning settings):\n\n" +
                     markdown_table(["task", "start", "lr", "training rows", "steps", "dev", "learnt", "CPU s"], frows))
    diag = study.root / "diagnosis.json"
    if diag.is_file():
        d = json.loads(diag.read_text())
        drows = []
        for name in DIAG_CASES:
            cells = []
            for start in ("pretrained", "random"):
                for t in TASKS:
                    r = d.get(f"{name} | {start} | {t}")
                    if r is None:
                        cells.append("-")
                        continue
                    m = r["metrics"]
                    v = m["pearson"] if t == "stsb" else m["accuracy"]
                    cells.append(f"{v:.2f}{'' if r['learnt'] else ' (no)'}")
            drows.append([name] + cells)
        probes = [d.get(f"probe | {start} | cola") for start in ("pretrained", "random")]
        if all(probes):
            drows.append(["linear probe on the frozen encoder, [CLS] / mean (CoLA-like)",
                          f"{probes[0]['cls']:.2f} / {probes[0]['mean']:.2f}", "", "",
                          f"{probes[1]['cls']:.2f} / {probes[1]['mean']:.2f}", "", ""])
        parts.append("**Fine-tuning diagnosis** (4-layer, 128-wide BERT pretrained 300 steps; 1,000 balanced "
                     "training rows; dev accuracy, STS-B-like Pearson; '(no)': not learnt):\n\n" +
                     markdown_table(["setting", "pre CoLA", "pre MRPC", "pre STS-B", "rand CoLA", "rand MRPC",
                                     "rand STS-B"], drows))
    plots(plan, study, runs)
    return finish_report(study, jobs_, parts, page, "pld_glue")


def plots(plan: Plan, study: Study, runs: dict) -> None:
    pre = {k: v for k, v in runs.items() if k.startswith("pretrain-")}
    if not pre:
        return
    pyplot = plt()
    fig, axes = pyplot.subplots(1, 2, figsize=(12, 4.2))
    colors = {"baseline": "tab:blue", "pld": "tab:orange"}
    for rid, r in sorted(pre.items()):
        ls = "-" if r["seed"] == plan.seeds[0] else "--"
        for ax, key in zip(axes, ("samples", "wall_s")):
            ax.plot([e[key] for e in r["evals"]], [e["val_loss"] for e in r["evals"]], ls, color=colors[r["arm"]],
                    marker="o", ms=2, label=f"{r['arm']} seed {r['seed']}")
    unigram = [json.loads(f.read_text())["unigram_entropy_held_out"] for f in (study.root / "probes").glob("lr*.json")]
    for ax, label in zip(axes, ("samples trained", "training wall-clock (s, steps only)")):
        if unigram:
            ax.axhline(unigram[0], color="gray", lw=0.8, ls=":", label="byte unigram entropy (held out)")
        ax.set_ylim(top=3.7)  # the first evaluation (untrained, ~5.6) would flatten the rest
        ax.set_xlabel(label)
        ax.set_ylabel("held-out MLM loss (nats/byte)")
        ax.legend(fontsize=8)
    fig.suptitle("progressive layer drop (theta 0.5) vs none, Pre-LN BERT")
    fig.tight_layout()
    fig.savefig(study.root / "pretraining.png", dpi=90)
    pyplot.close(fig)


def profile_step(plan: Plan, out: Path, repeats: int = 6) -> dict:
    """Where a pretraining step's time goes, to read PLD's samples/s against the share of block
    passes it skips: the forward+backward of the study's BERT with all its layers and with half
    of them (a line through the two gives one block's cost and what is not a block: embeddings,
    the MLM head over the vocabulary, the loss), and the optimizer step (gradient clipping,
    Adam over every parameter, the schedule), which PLD does not shorten. CPU time of one
    thread, the median of `repeats` steps after one warm-up step."""
    import statistics

    torch.manual_seed(0)
    stream = torch.randint(0, 256, (1 << 20,))
    inputs, labels = mlm_batch(stream, plan, 0)
    n_layer = plan.bert["n_layer"]
    fb = {}
    for layers in (n_layer, n_layer // 2):
        engine, _, _ = build_pretrain(replace(plan, bert=dict(plan.bert, n_layer=layers)), 0, None)
        times, steps = [], []
        for i in range(repeats + 1):
            c = time.process_time()
            engine.backward(engine(inputs, labels=labels))
            mid = time.process_time()
            engine.step()
            if i:
                times.append(mid - c)
                steps.append(time.process_time() - mid)
        fb[layers] = statistics.median(times)
        if layers == n_layer:
            opt = statistics.median(steps)
    # PLD itself with theta already settled at 0.5 (a gamma this large gets there in one step):
    # its measured forward+backward against what the skipped blocks predict
    from zerotrain.features.layer_drop import keep_probabilities

    engine, _, _ = build_pretrain(plan, 0, {"theta": 0.5, "gamma": 100.0})
    pld_times = []
    for i in range(2 * repeats + 1):
        c = time.process_time()
        engine.backward(engine(inputs, labels=labels))
        if i:
            pld_times.append(time.process_time() - c)
        engine.step()
    pld_kept = sum(keep_probabilities(n_layer, 0.5)) / n_layer
    block = (fb[n_layer] - fb[n_layer // 2]) / (n_layer - n_layer // 2)
    rest = fb[n_layer] - n_layer * block
    total = fb[n_layer] + opt
    res = {"n_layer": n_layer, "forward_backward_s": fb[n_layer], "per_block_s": block, "not_blocks_s": rest,
           "optimizer_step_s": opt, "step_s": total, "blocks_share": n_layer * block / total}
    res.update({"pld_theta": 0.5, "pld_kept": pld_kept, "pld_forward_backward_s": statistics.mean(pld_times),
                "pld_forward_backward_expected_s": fb[n_layer] - (1 - pld_kept) * n_layer * block})
    for kept in (0.724, 0.5):
        res[f"expected_speedup_at_{kept}"] = total / (total - (1 - kept) * n_layer * block)
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile.json").write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res, indent=1))
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(ROOT / "docs" / "results" / "pld_glue"))
    parser.add_argument("--report", action="store_true", help="only rebuild the tables, plots and page section")
    parser.add_argument("--list", action="store_true", help="print the run list and what is done")
    parser.add_argument("--diagnose", action="store_true", help="the short fine-tuning experiments")
    parser.add_argument("--only", default="", help="run only jobs whose name matches this regular expression")
    parser.add_argument("--max-jobs", type=int, default=None, help="stop after this many jobs")
    parser.add_argument("--quick", action="store_true", help="tiny model, a few steps (the test)")
    parser.add_argument("--profile", action="store_true", help="where a pretraining step's time goes")
    parser.add_argument("--probe", choices=sorted(PROBES), help="train the baseline alone with these settings")
    parser.add_argument("--probe-steps", type=int, default=300, help="the probe's steps")
    parser.add_argument("--probe-task", choices=sorted(TASKS), help="fine-tune one start on this task alone")
    parser.add_argument("--probe-start", choices=["random", "baseline", "pld"], default="random",
                        help="the probe's start: a random init, or the baseline's (or the study's PLD) weights")
    parser.add_argument("--probe-ft-seed", type=int, default=None, help="the fine-tuning's seed (default: "
                                                                          "--probe-seed)")
    parser.add_argument("--probe-seed", type=int, default=0, help="the probe's seed (pretraining and fine-tuning)")
    parser.add_argument("--probe-pretrain", default="", help="the baseline start's seq,batch,steps, pretrained "
                                                                 "alone (default: the study's weights)")
    parser.add_argument("--probe-ft", default="", help="the fine-tuning probe's lr,rows,epochs (default: the "
                                                           "plan's)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    plan = QUICK if args.quick else Plan()
    if args.quick:
        plan.weights = Path(args.out) / "weights"
    study = Study(Path(args.out))
    page = PAGE if Path(args.out).resolve() == (ROOT / "docs" / "results" / "pld_glue").resolve() else None
    if args.probe:
        probe_pretraining(plan, args.probe, study, args.probe_steps)
        return
    if args.probe_task:
        if args.probe_ft:
            lr, rows, epochs = args.probe_ft.split(",")
            plan = replace(plan, ft_lr=float(lr), ft_rows=int(rows), ft_epochs=int(epochs))
        if args.probe_pretrain:
            seq, batch, steps = (int(x) for x in args.probe_pretrain.split(","))
            plan = replace(plan, seq=seq, batch=batch, steps=steps)
        probe_task(plan, args.probe_task, study, args.probe_start, args.probe_seed, args.probe_ft_seed)
        return
    if args.profile:
        profile_step(plan, study.root, repeats=1 if args.quick else 6)
        return
    if args.diagnose:
        study.root.mkdir(parents=True, exist_ok=True)
        diagnose(study)
        print(report(plan, study, jobs(plan, study, load_corpus), page))
        return
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
