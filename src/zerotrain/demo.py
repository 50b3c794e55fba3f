"""`zerotrain demo`: the main job end to end on data every machine has, with no download.

    Python standard library sources of this interpreter (every 10th file held out)
      ─► byte-level BPE tokenizer trained on the training files (HF tokenizers)
      ─► `zerotrain train` on 2 processes: a small GPT, ZeRO stage 2, a sequence-length
         curriculum (short sequences first) and a cosine LR schedule (about 3 minutes on 2 cores)
      ─► held-out perplexity next to the unigram baseline, a checkpoint, a plot and a sample

Everything lands in runs/demo/ (the options file demo.yaml there reruns the training alone:
`zerotrain train --nproc_per_node 2 runs/demo/demo.yaml --overwrite_output_dir`).
"""

from __future__ import annotations

import json
import shutil
import sysconfig
import time
from pathlib import Path

MODEL = {"zerotrain_model": "gpt", "n_embd": 128, "n_layer": 4, "n_head": 4, "n_positions": 128}
BATCH = 4  # sequences per rank and step: small steps learn fastest in a short run
PROMPT = "import os\nimport sys\n\n\ndef main(argv):\n"


def stdlib_files() -> tuple[list[Path], list[Path]]:
    """(training, held-out) top-level .py files of the running interpreter's standard library."""
    files = []
    for f in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        try:
            f.read_text(encoding="utf-8")
            files.append(f)
        except (UnicodeDecodeError, OSError):
            continue
    return [f for i, f in enumerate(files) if i % 10], [f for i, f in enumerate(files) if i % 10 == 0]


def unigram_perplexity(train_ids: list[list[int]], eval_ids: list[list[int]], vocab: int) -> float:
    """exp(cross-entropy) of the tokens the model is scored on (each block but its first
    token) under add-one smoothed token frequencies of the training set."""
    import numpy as np

    counts = np.bincount(np.concatenate([np.asarray(x) for x in train_ids]), minlength=vocab) + 1.0
    logp = np.log(counts / counts.sum())
    targets = np.concatenate([np.asarray(x[1:]) for x in eval_ids])
    return float(np.exp(-logp[targets].mean()))


def sample(model, tokenizer, prompt: str, new_tokens: int, seed: int = 0) -> str:
    """Top-k sampling, temperature 0.7; the window is the model's positions."""
    import torch

    g = torch.Generator().manual_seed(seed)
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    model.eval()
    with torch.no_grad():
        for _ in range(new_tokens):
            logits = model(ids[:, -model.cfg.n_positions:])[0, -1] / 0.7
            top = torch.topk(logits, 40)
            pick = top.indices[torch.multinomial(torch.softmax(top.values, -1), 1, generator=g)]
            ids = torch.cat([ids, pick[None]], dim=1)
    return tokenizer.decode(ids[0])


def calibrate_steps(vocab_size: int, seconds: float, batch: int = BATCH) -> int:
    """Optimizer steps that fill `seconds` on this machine as it is now: time a few full-length
    training steps of the demo model in one process (each rank runs the same work on its own
    core), allow for what the 2-rank job adds, round down to a multiple of 20."""
    import torch

    from .models import GPT, GPTConfig

    torch.set_num_threads(1)
    cfg = {k: v for k, v in MODEL.items() if k != "zerotrain_model"}
    model = GPT(GPTConfig(vocab_size=vocab_size, **cfg))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(vocab_size, (batch, MODEL["n_positions"]))
    times = []
    for _ in range(8):
        start = time.perf_counter()
        model(x, labels=x).backward()
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - start)
    # the median (other load on the machine comes and goes), x1.5 measured for the gradient
    # exchange and the trainer around the two ranks
    per_step = sorted(times[1:])[3] * 1.5
    return max(100, min(5000, int(seconds / per_step) // 20 * 20))


def options(out: Path, steps: int) -> dict:
    warm = max(steps // 5, 1)  # the curriculum reaches the full length after 20% of the steps
    return {
        "model_config": str(out / "model.json"), "tokenizer_name_or_path": str(out / "tokenizer"),
        "train_file": str(out / "data" / "train"), "validation_file": str(out / "data" / "validation"),
        "cache_dir": str(out / "cache"), "output_dir": str(out), "overwrite_output_dir": True,
        "block_size": MODEL["n_positions"], "preprocessing_num_workers": 2, "max_eval_samples": 400,
        "per_device_train_batch_size": BATCH, "per_device_eval_batch_size": 32, "max_steps": steps,
        "learning_rate": 3e-3, "weight_decay": 0.1, "adam_beta2": 0.95, "lr_scheduler_type": "cosine",
        "warmup_steps": max(steps // 20, 1), "logging_steps": 20, "eval_strategy": "steps",
        "eval_steps": max(steps // 4, 1), "save_steps": steps, "seed": 0,
        "deepspeed": {
            "zero_optimization": {"stage": 2},
            "curriculum_learning": {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": 16,
                                    "max_difficulty": "auto", "schedule_type": "fixed_linear",
                                    "schedule_config": {"total_curriculum_step": warm, "difficulty_step": 8}},
        },
    }


def prepare(out: Path, vocab_size: int) -> None:
    from .trainer.data.tokenizer import train_bpe

    if out.exists():
        print(f"demo: replacing the previous demo run in {out}", flush=True)
        shutil.rmtree(out)
    train_files, val_files = stdlib_files()
    texts = {}
    for split, files in (("train", train_files), ("validation", val_files)):
        folder = out / "data" / split
        folder.mkdir(parents=True)
        for f in files:
            shutil.copyfile(f, folder / f.name)
        texts[split] = [f.read_text(encoding="utf-8") for f in files]
    start = time.perf_counter()
    tokenizer = train_bpe(texts["train"], vocab_size)
    tokenizer.save_pretrained(str(out / "tokenizer"))
    (out / "model.json").write_text(json.dumps(MODEL, indent=2) + "\n", encoding="utf-8")
    size = sum(len(t) for t in texts["train"]) / 1e6
    print(f"demo: {len(train_files)} training files ({size:.1f} MB) and {len(val_files)} held-out files from "
          f"{sysconfig.get_paths()['stdlib']}; BPE tokenizer with {len(tokenizer)} tokens trained in "
          f"{time.perf_counter() - start:.1f}s", flush=True)


def run_demo(out: Path, nproc: int, steps: int | None, vocab_size: int) -> int:
    import yaml

    from .commands.train import _launch
    from .comm import Comm, ParallelState
    from .trainer.args import build
    from .trainer.data.prepare import prepare as prepare_data
    from .trainer.data.tokenizer import load_tokenizer
    from .trainer.model.build import load_model
    from .trainer.report.plot import plot_run

    start = time.perf_counter()
    prepare(out, vocab_size)
    if steps is None:
        steps = calibrate_steps(vocab_size, 170.0)
        print(f"demo: {steps} optimizer steps should take about 3 minutes on this machine now "
              "(set --max_steps to choose)", flush=True)
    (out / "demo.yaml").write_text(yaml.safe_dump(options(out, steps), sort_keys=False), encoding="utf-8")
    code = _launch([str(out / "demo.yaml")], nproc)
    if code != 0:
        return code
    state = json.loads((out / "trainer_state.json").read_text(encoding="utf-8"))
    tokenizer = load_tokenizer(str(out / "tokenizer"))
    model_args, data_args, train_args = build(options(out, steps))
    data = prepare_data(model_args, data_args, train_args.seed, tokenizer, MODEL["n_positions"],
                        Comm(ParallelState()))  # the run's cached token blocks
    baseline = unigram_perplexity(data.train["input_ids"], data.eval["input_ids"], len(tokenizer))
    png = plot_run(out)
    model, _ = load_model(str(out), "clm")
    text = sample(model, tokenizer, PROMPT, 120)
    print(f"\ndemo: held-out perplexity {state['eval_perplexity']:.2f} vs unigram baseline {baseline:.2f} "
          f"({baseline / state['eval_perplexity']:.1f}x lower) after {state['global_step']} steps, "
          f"{state['tokens']:,} tokens in {state['train_time_s']:.0f}s of training", flush=True)
    print(f"demo: checkpoint {out / f'checkpoint-{steps}'}, final model and tokenizer in {out}, plot {png}")
    print(f"demo: a sample from the model, after a prompt of {PROMPT.count(chr(10))} lines:\n{'-' * 60}\n"
          f"{text}\n{'-' * 60}")
    print(f"demo: done in {time.perf_counter() - start:.0f}s")
    return 0


def add_arguments(parser) -> None:
    parser.add_argument("--nproc_per_node", type=int, default=2, help="processes to launch (default 2)")
    parser.add_argument("--max_steps", type=int, default=None,
                        help="optimizer steps (default: what fits in about 3 minutes, measured at start)")
    parser.add_argument("--vocab_size", type=int, default=2048, help="BPE vocabulary size (default 2048)")
    parser.add_argument("--output_dir", default="runs/demo", help="where the run goes (default runs/demo)")


def run(args) -> int:
    return run_demo(Path(args.output_dir), args.nproc_per_node, args.max_steps, args.vocab_size)
