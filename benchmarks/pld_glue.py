"""The PLD recipe's table at this machine's scale: pretrain a Pre-LN BERT (MLM) with and without
progressive layer drop for equal wall-clock, fine-tune both on three GLUE-format tasks, compare.

    python benchmarks/pld_glue.py [--minutes 3 --out runs/pld_glue]     (~15 min on 2 busy cores)
    python benchmarks/pld_glue.py --quick                                (smoke run, ~2 min)

Pretraining (one process, one thread): two engines built from the same BERT config (the seed's
keys, scaled: 6 layers, hidden 128, FFN 512, dropout 0.1; byte-level tokens of this
interpreter's standard library, sequences of 128, 16 per step), each with the seed's
DeepSpeed settings (Adam with bias_correction false, lr 1e-3, weight decay 0.01, clipping 1.0;
fp32 here: fp16 matmuls on a CPU are slower) and the seed's warmup_linear_decay_exp schedule
(2% warmup, 0.99 per decay_steps, decay_steps scaled to the run). One of them adds the PLD
block with theta 0.5 and a gamma that brings theta within 0.01 of 0.5 after a quarter of the
run. Their steps alternate (each next step goes to whichever has trained for less time), so
the machine's drift hits both alike, and each stops at --minutes of its own step time: equal
wall-clock, PLD doing more steps in it.

Fine-tuning: both pretrained folders go to `zerotrain train --task_name ... --data_dir ...
--init_from ...` on three tasks this script writes in GLUE's own layouts from the standard
library's lines (held-out files for dev):

    mrpc-like   paraphrase: is the second line the first with one word changed, or
                another line of the same file?                                  accuracy / F1
    cola-like   acceptability: a real line, or one with its words shuffled? Matthews corr.
    stsb-like   graded similarity: a line and a copy with k of 5 word slots replaced from
                other lines, score 5 - k (plus noise in [0, 1)); Pearson / Spearman

The two fine-tunes of a task run side by side (two processes), with the same options. The
table has the seed's shape: a column per task with its GLUE metric, a row per pretraining,
plus pretraining samples/s and the average. It also says which share of the step layer drop
could remove: the blocks' share of step time implied by the measured speed-up and the mean
fraction of blocks the masks kept.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
SEQ, BATCH = 128, 16
BERT = {"vocab_size_or_config_json_file": 259, "hidden_size": 128, "num_hidden_layers": 6, "num_attention_heads": 2,
        "intermediate_size": 512, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1, "max_position_embeddings": SEQ, "type_vocab_size": 2,
        "initializer_range": 0.02}
PRETRAIN_DS = {"train_batch_size": BATCH, "train_micro_batch_size_per_gpu": BATCH, "steps_per_print": 100000,
               "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "weight_decay": 0.01, "bias_correction": False}},
               "gradient_clipping": 1.0, "wall_clock_breakdown": False}
FINETUNE_DS = {"train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto",
               "optimizer": {"type": "Adam", "params": {"lr": "auto", "weight_decay": 0.0, "bias_correction": False}},
               "gradient_clipping": 1.0}
TASKS = {"mrpc": ("MRPC", ("accuracy", "f1")), "cola": ("CoLA", ("matthews_correlation",)),
         "stsb": ("STS-B", ("pearson", "spearmanr"))}


# ---- data ------------------------------------------------------------------------------------
def stdlib_files() -> list[Path]:
    return sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))


def code_lines(files: list[Path]) -> dict[str, list[str]]:
    out = {}
    for f in files:
        lines = [" ".join(line.split()) for line in f.read_text(encoding="utf-8", errors="replace").splitlines()]
        lines = [x for x in lines if 24 <= len(x) <= 60 and len(x.split()) >= 4 and "\t" not in x]
        if len(lines) >= 8:
            out[f.name] = lines
    return out


def _tsv(path: Path, header: list[str] | None, rows: list[list[str]]) -> None:
    lines = ([header] if header else []) + rows
    path.write_text("".join("\t".join(r) + "\n" for r in lines), encoding="utf-8")


def write_tasks(root: Path, n_train: int, n_dev: int, seed: int = 0) -> None:
    """Three task folders under root, in the layouts GLUE distributes (dev from held-out files)."""
    files = stdlib_files()
    splits = {"train": code_lines([f for i, f in enumerate(files) if i % 10]),
              "dev": code_lines([f for i, f in enumerate(files) if i % 10 == 0])}
    rng = random.Random(seed)
    for split, n in (("train", n_train), ("dev", n_dev)):
        by_file = splits[split]
        names = sorted(by_file)
        pool = [x for name in names for x in by_file[name]]
        mrpc, cola, stsb = [], [], []
        for i in range(n):
            f = rng.choice(names)
            a = rng.choice(by_file[f])
            same = i % 2 == 0  # a paraphrase: the line with one word changed; else another line of its file
            words = a.split()
            if same:
                words[rng.randrange(len(words))] = rng.choice(rng.choice(pool).split())
            b = " ".join(words) if same else rng.choice([x for x in by_file[f] if x != a] or [a])
            mrpc.append([str(int(same)), str(2 * i), str(2 * i + 1), a, b])
            words = a.split()
            good = i % 2 == 0
            if not good:
                while words == a.split():
                    rng.shuffle(words)
            cola.append(["stdlib", str(int(good)), "" if good else "*", " ".join(words)])
            k = i % 6
            slots = a.split()
            for j in rng.sample(range(len(slots)), min(len(slots), round(k * len(slots) / 5))):
                slots[j] = rng.choice(rng.choice(pool).split())
            score = min(5.0, 5 - k + rng.random())
            stsb.append([str(i), "code", "stdlib", "2026", f"{i:04d}", "none", "none", a, " ".join(slots),
                         f"{score:.3f}"])
        name = "train.tsv" if split == "train" else "dev.tsv"
        for task, header, rows in (("MRPC", ["\ufeffQuality", "#1 ID", "#2 ID", "#1 String", "#2 String"], mrpc),
                                   ("CoLA", None, cola),
                                   ("STS-B", ["index", "genre", "filename", "year", "old_index", "source1",
                                              "source2", "sentence1", "sentence2", "score"], stsb)):
            (root / task).mkdir(parents=True, exist_ok=True)
            _tsv(root / task / name, header, rows)


# ---- pretraining -----------------------------------------------------------------------------
def corpus_ids(tokenizer) -> torch.Tensor:
    files = [f for i, f in enumerate(stdlib_files()) if i % 10]  # the fine-tuning dev files stay unseen
    text = "\n".join(f.read_text(encoding="utf-8", errors="replace") for f in files)
    return torch.tensor(tokenizer(text)["input_ids"], dtype=torch.long)


def mlm_batch(stream: torch.Tensor, step: int, mask_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step * 7919)
    starts = torch.randint(0, len(stream) - SEQ, (BATCH,), generator=g)
    ids = torch.stack([stream[s: s + SEQ] for s in starts.tolist()])
    picked = torch.rand(ids.shape, generator=g) < 0.15
    labels = torch.where(picked, ids, torch.full_like(ids, -100))
    roll = torch.rand(ids.shape, generator=g)
    inputs = torch.where(picked & (roll < 0.8), torch.full_like(ids, mask_id), ids)
    inputs = torch.where(picked & (roll >= 0.8) & (roll < 0.9), torch.randint(0, 256, ids.shape, generator=g), inputs)
    return inputs, labels


def build_engine(pld: dict | None, steps_estimate: int):
    import zerotrain
    from zerotrain.models import BertConfig, PreLNBertMLM
    from zerotrain.models.bert import bert_config_keys

    torch.manual_seed(0)
    model = PreLNBertMLM(BertConfig(**bert_config_keys(BERT)))
    cfg = json.loads(json.dumps(PRETRAIN_DS))
    if pld:
        cfg["progressive_layer_drop"] = {"enabled": True, **pld}
    warmup, decay_steps = max(1, round(0.02 * steps_estimate)), max(1, steps_estimate // 200)
    schedule = lambda opt: zerotrain.get_scheduler("warmup_linear_decay_exp", opt, warmup, steps_estimate,  # noqa: E731
                                                   decay_rate=0.99, decay_steps=decay_steps)
    engine, *_ = zerotrain.initialize(model=model, config=cfg, lr_scheduler=schedule)
    return engine, model


def pretrain(out: Path, seconds: float, quick: bool) -> dict:
    from zerotrain.features.layer_drop import keep_probabilities
    from zerotrain.trainer.data.tokenizer import byte_tokenizer
    from zerotrain.trainer.model.build import ModelInfo, save_model

    tok = byte_tokenizer()
    stream = corpus_ids(tok)
    probe, _ = build_engine(None, 1000)  # calibration: the baseline's step time sets the run's step count
    for k in range(2 if quick else 4):
        inputs, labels = mlm_batch(stream, k, tok.mask_token_id)
        start = time.perf_counter()
        probe.backward(probe(inputs, labels=labels))
        probe.step()
    step_time = time.perf_counter() - start  # the last of a few steps
    del probe
    estimate = max(20, int(seconds / step_time))
    gamma = math.log(50) / (0.25 * estimate)  # theta within 0.01 of 0.5 after a quarter of the baseline's steps
    runs = {"baseline": build_engine(None, estimate), "pld": build_engine({"theta": 0.5, "gamma": gamma}, estimate)}
    spent = {name: 0.0 for name in runs}
    steps = {name: 0 for name in runs}
    kept = []  # expected fraction of blocks PLD's masks keep, per step
    losses = {name: [] for name in runs}
    while min(spent.values()) < seconds:
        name = min(spent, key=spent.get)
        engine, _ = runs[name]
        inputs, labels = mlm_batch(stream, steps[name], tok.mask_token_id)
        start = time.perf_counter()
        loss = engine(inputs, labels=labels)
        engine.backward(loss)
        engine.step()
        spent[name] += time.perf_counter() - start
        steps[name] += 1
        losses[name].append(loss.item())
        if name == "pld":
            theta = engine.get_pld_theta()
            kept.append(sum(keep_probabilities(BERT["num_hidden_layers"], theta)) / BERT["num_hidden_layers"])
    result = {"gamma": gamma, "steps_estimate": estimate}
    for name, (engine, model) in runs.items():
        folder = out / f"pretrained_{name}"
        cfg = model.cfg
        save_model(folder, model, ModelInfo("bert", "mlm", cfg.n_positions, cfg.n_embd, dataclasses.asdict(cfg)),
                   engine.module_state_dict(), tok)
        tail = losses[name][-20:]
        result[name] = {"steps": steps[name], "seconds": round(spent[name], 1),
                        "samples_per_s": steps[name] * BATCH / spent[name], "final_mlm_loss": sum(tail) / len(tail)}
    result["mean_kept_fraction"] = sum(kept) / len(kept)
    return result


# ---- fine-tuning ------------------------------------------------------------------------------
def finetune_args(task: str, data: Path, init: Path, out: Path, config: Path, steps: int) -> list[str]:
    return [sys.executable, "-m", "zerotrain", "train", "--task_name", task, "--data_dir", str(data / TASKS[task][0]),
            "--model_config", str(config), "--init_from", str(init), "--output_dir", str(out), "--max_seq_length",
            str(SEQ), "--per_device_train_batch_size", str(BATCH), "--per_device_eval_batch_size", "64",
            "--learning_rate", "1e-3", "--max_steps", str(steps), "--lr_scheduler_type", "linear",
            "--warmup_ratio", "0.1", "--deepspeed", json.dumps(FINETUNE_DS), "--save_strategy", "no",
            "--logging_steps", "50", "--disable_tqdm", "true", "--report_to", "none", "--overwrite_output_dir", "true",
            "--seed", "1"]


def finetune(out: Path, data: Path, steps: int) -> dict:
    config = out / "bert_config.json"
    config.write_text(json.dumps(BERT, indent=1), encoding="utf-8")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src"), "TOKENIZERS_PARALLELISM": "false",
           "XDG_CACHE_HOME": str(out / "cache")}
    scores = {}
    for task in TASKS:
        procs = {}
        for name in ("baseline", "pld"):  # side by side: the same load on both
            run_dir = out / f"finetune_{name}_{task}"
            log = open(out / f"finetune_{name}_{task}.log", "w")
            procs[name] = (subprocess.Popen(finetune_args(task, data, out / f"pretrained_{name}", run_dir, config,
                                                        steps), env=env, stdout=log, stderr=subprocess.STDOUT),
                           run_dir, log)
        for name, (proc, run_dir, log) in procs.items():
            if proc.wait() != 0:
                raise SystemExit(f"fine-tuning {name} on {task} failed; see {log.name}")
            log.close()
            state = json.loads((run_dir / "trainer_state.json").read_text())
            scores.setdefault(name, {})[task] = {m: state[f"eval_{m}"] for m in TASKS[task][1]}
    return scores


def table(pre: dict, scores: dict) -> str:
    heads = ["MRPC-like F1/Acc.", "CoLA-like MCC", "STS-B-like PCC/SCC", "average", "pretrain samples/s"]
    lines = ["| pretraining | " + " | ".join(heads) + " |", "|" + "---|" * (len(heads) + 1)]
    for name in ("baseline", "pld"):
        s = scores[name]
        cells = [f"{100 * s['mrpc']['f1']:.1f}/{100 * s['mrpc']['accuracy']:.1f}",
                 f"{100 * s['cola']['matthews_correlation']:.1f}",
                 f"{100 * s['stsb']['pearson']:.1f}/{100 * s['stsb']['spearmanr']:.1f}",
                 f"{average(s):.1f}", f"{pre[name]['samples_per_s']:.2f}"]
        lines.append(f"| {'PLD' if name == 'pld' else 'baseline'} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def average(s: dict) -> float:
    """GLUE's way: each task's metrics averaged first, then the tasks."""
    return 100 * sum(sum(v.values()) / len(v) for v in s.values()) / len(s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=3.0, help="pretraining step time of each model")
    parser.add_argument("--finetune-steps", type=int, default=90)
    parser.add_argument("--train-rows", type=int, default=1440)
    parser.add_argument("--dev-rows", type=int, default=320)
    parser.add_argument("--out", default="runs/pld_glue")
    parser.add_argument("--quick", action="store_true", help="seconds of pretraining and a few steps, to check it runs")
    args = parser.parse_args()
    if args.quick:
        args.minutes, args.finetune_steps, args.train_rows, args.dev_rows = 0.3, 6, 64, 32
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    write_tasks(out / "glue", args.train_rows, args.dev_rows)
    pre = pretrain(out, 60 * args.minutes, args.quick)
    scores = finetune(out, out / "glue", args.finetune_steps)
    speedup = pre["pld"]["samples_per_s"] / pre["baseline"]["samples_per_s"]
    keep = pre["mean_kept_fraction"]
    share = (1 - 1 / speedup) / (1 - keep) if keep < 1 else float("nan")
    result = {"pretraining": pre, "finetuning": scores, "speedup": speedup, "block_share_of_step": share,
              "average": {name: average(scores[name]) for name in scores}, "minutes": (time.perf_counter() - started) / 60}
    (out / "result.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    print(table(pre, scores))
    print(f"pretraining: {args.minutes:g} min of step time each; baseline {pre['baseline']['steps']} steps, PLD "
          f"{pre['pld']['steps']} (theta 0.5, gamma {pre['gamma']:.4f}); MLM loss of the last 20 steps "
          f"{pre['baseline']['final_mlm_loss']:.3f} vs {pre['pld']['final_mlm_loss']:.3f}")
    print(f"PLD samples/s {speedup:.2f}x the baseline's (target >= 1.24x); its masks kept {100 * keep:.1f}% of "
          f"block passes, so the blocks are {100 * share:.0f}% of a baseline step (the rest layer drop cannot "
          f"remove); fine-tuned average {result['average']['pld']:.1f} vs {result['average']['baseline']:.1f} "
          f"(target: no lower); {result['minutes']:.1f} min in all; written {out / 'result.json'}")


if __name__ == "__main__":
    main()
