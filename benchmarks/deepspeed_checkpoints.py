"""DeepSpeed writes small checkpoints; zerotrain resumes them and must continue as DeepSpeed does.

    python benchmarks/deepspeed_checkpoints.py                  # the matrix, into runs/ds-checkpoints/
    python benchmarks/deepspeed_checkpoints.py --universal      # the universal-checkpoint matrix
    python benchmarks/deepspeed_checkpoints.py --pipeline       # DeepSpeed's pipeline folders
    python benchmarks/deepspeed_checkpoints.py --autotp         # DeepSpeed's AutoTP training, tried
                                                                # (HF models need transformers in DeepSpeed's
                                                                # venv: pip install transformers there)
    python benchmarks/deepspeed_checkpoints.py --fixture DIR [--pipeline [--stage 0] | --autotp]   # one case,
                                                                # as a test fixture

DeepSpeed 0.19.8 runs in its own venv (benchmarks/.ds-venv, made as compare_zero.py makes it).
Each case is a torchrun job in that venv: a tiny GPT (zerotrain's own model code, so the
parameter names are the same) trains K steps on fixed batches, saves `global_stepK/`, trains
N more steps (the run that never stopped), then a fresh DeepSpeed engine loads the checkpoint
and trains the same N steps (DeepSpeed's own resume). Both loss lists go into `expected.json`
beside the checkpoint. zerotrain then resumes the same folder, with 1 process and with the
ranks DeepSpeed had, at the same stage and at another, and its next losses are compared with
DeepSpeed's resume (mean over ranks of each step's loss; within 1e-5 relative).

Cases: ranks 1, 2 x ZeRO stage 1, 2, 3 x fp32, bf16.

`--universal` (2 ranks x ZeRO 1, 2, 3 x fp32, bf16), both directions of the universal format:
    DeepSpeed -> zerotrain   DeepSpeed's own ds_to_universal converts global_stepK; zerotrain
                             loads it with "load_universal" (same layout, and 1 rank at another
                             stage); DeepSpeed also resumes its own universal folder, for reference
    zerotrain -> DeepSpeed   zerotrain loads global_stepK and saves its own checkpoint at once,
                             `zerotrain convert --to deepspeed-universal` writes it out, and
                             DeepSpeed resumes that with "load_universal"
every resume's next losses against DeepSpeed's resume of global_stepK (within 1e-5 relative).

`--pipeline` (ZeRO 1, 0 x fp32, bf16): DeepSpeed's PipelineModule engine on 2 stages (a GPT of
pipeline layers, tied embedding) saves `layer_*` files and one `mp_rank_SS` set per stage;
zerotrain resumes it on 2 stages (the same ZeRO stage and the other), on 1 stage (1 process,
and 2 data ranks) and as a plain model of the same layers (checkpoint/pipe_names.py; in bf16
also with data_types.grad_accum_dtype bf16, DeepSpeed's default). DeepSpeed also resumes each
folder with every step's micro-batches in reverse order: what summing the same gradients in
another order alone does to its next losses. A case DeepSpeed itself cannot run is recorded
with DeepSpeed's error.

Results (--results DIR): docs/results/deepspeed_checkpoints/matrix.{json,md,log} for the matrix,
universal.* for --universal, pipeline.* for --pipeline.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
sys.path.insert(0, str(HERE))

VOCAB, SEQ, EMBD, LAYERS, HEADS = 32, 8, 16, 1, 2
GLOBAL_BATCH = 4


def ds_config(stage: int, precision: str, nproc: int) -> dict:
    """The one config both engines read."""
    cfg = {
        "train_batch_size": GLOBAL_BATCH,
        "train_micro_batch_size_per_gpu": GLOBAL_BATCH // nproc,
        "gradient_clipping": 0.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01, "torch_adam": True}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 4, "warmup_max_lr": 3e-3,
                                                      "warmup_type": "linear"}},
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }
    if precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    if precision == "fp16":
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 8}
    return cfg


def batch(step: int):
    import torch

    g = torch.Generator().manual_seed(1000 + step)
    return torch.randint(0, VOCAB, (GLOBAL_BATCH, SEQ), generator=g)


def model():
    """zerotrain's GPT (in DeepSpeed's venv without running zerotrain/__init__: common.import_gpt)."""
    import torch

    from common import import_gpt

    GPT, GPTConfig = import_gpt("deepspeed")
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=VOCAB, n_positions=SEQ, n_embd=EMBD, n_layer=LAYERS, n_head=HEADS, bias=False))


def run_steps(engine, start: int, stop: int, rank: int, world: int) -> list[float]:
    """Steps [start, stop): each rank its slice of the global batch; the mean loss over ranks."""
    import torch
    import torch.distributed as dist

    losses = []
    for step in range(start, stop):
        per = GLOBAL_BATCH // world
        x = batch(step)[rank * per : (rank + 1) * per]
        loss = engine(x, labels=x)
        engine.backward(loss)
        engine.step()
        mean = loss.detach().float().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / world)
    return losses


def worker(args) -> None:
    import torch

    torch.set_num_threads(1)
    import deepspeed
    import torch.distributed as dist

    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = ds_config(args.stage, args.precision, world)
    engine, *_ = deepspeed.initialize(model=model(), config=cfg, model_parameters=None)
    before = run_steps(engine, 0, args.before, rank, world)
    engine.save_checkpoint(args.save, client_state={"run": "deepspeed_checkpoints.py", "k": args.before})
    uninterrupted = run_steps(engine, args.before, args.before + args.after, rank, world)
    engine.destroy()
    fresh, *_ = deepspeed.initialize(model=model(), config=cfg, model_parameters=None)
    fresh.load_checkpoint(args.save)
    resumed = run_steps(fresh, args.before, args.before + args.after, rank, world)
    if rank == 0:
        Path(args.out).write_text(json.dumps({
            "deepspeed": deepspeed.__version__, "torch": torch.__version__, "stage": args.stage,
            "precision": args.precision, "ranks": world, "k": args.before, "config": cfg,
            "model": {"vocab_size": VOCAB, "n_positions": SEQ, "n_embd": EMBD, "n_layer": LAYERS,
                      "n_head": HEADS, "bias": False, "seed": 0},
            "batches": "torch.randint(0, vocab, (4, seq), generator=torch.Generator().manual_seed(1000 + step)), "
                       "rank r takes rows [r * 4 / ranks, (r + 1) * 4 / ranks)",
            "losses_before": before, "next_losses_uninterrupted": uninterrupted,
            "next_losses_resumed": resumed}, indent=1))


def universal_worker(args) -> None:
    """DeepSpeed resumes the universal folder under `args.save` (latest_universal) and trains."""
    import torch

    torch.set_num_threads(1)
    import deepspeed
    import torch.distributed as dist

    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = dict(ds_config(args.stage, args.precision, world), checkpoint={"load_universal": True})
    engine, *_ = deepspeed.initialize(model=model(), config=cfg, model_parameters=None)
    engine.load_checkpoint(args.save)
    k = engine.global_steps
    losses = run_steps(engine, k, k + args.after, rank, world)
    if rank == 0:
        Path(args.out).write_text(json.dumps({"start": k, "losses": losses}))


# ---- pipeline folders: DeepSpeed's PipelineModule on 2 stages ----------------------------------
PIPE_MODEL = {"vocab_size": VOCAB, "n_positions": SEQ, "n_embd": EMBD, "n_layer": 2, "n_head": HEADS}


def pipe_layers(spec, tied_spec) -> list:
    """A GPT as pipeline layers (`spec`/`tied_spec`: DeepSpeed's or zerotrain's LayerSpec and
    TiedLayerSpec): the token embedding tied with the head, positions, blocks, final norm. The
    same layers as tests/distributed/pipe_scenarios.layer_specs, so the parameter names agree."""
    import torch
    from torch import nn

    import_gpt = __import__("common").import_gpt
    import_gpt("deepspeed")
    from zerotrain.models.block import PreLNBlock

    class TokenEmbed(nn.Embedding):
        pass

    class AddPositions(nn.Module):
        def __init__(self, n_positions: int, dim: int):
            super().__init__()
            self.pos = nn.Embedding(n_positions, dim)

        def forward(self, x):
            return x + self.pos(torch.arange(x.shape[1], device=x.device))

    m = PIPE_MODEL
    return ([tied_spec("embed", TokenEmbed, m["vocab_size"], m["n_embd"]),
             spec(AddPositions, m["n_positions"], m["n_embd"])]
            + [spec(PreLNBlock, m["n_embd"], m["n_head"], 0.0, False) for _ in range(m["n_layer"])]
            + [spec(nn.LayerNorm, m["n_embd"], bias=False),
               tied_spec("embed", TokenEmbed, m["vocab_size"], m["n_embd"], forward_fn=_logits)])


def _logits(embed, x):
    return x @ embed.weight.t()


def pipe_loss(out, labels):
    import torch.nn.functional as F

    targets = F.pad(labels[:, 1:], (0, 1), value=-100)
    return F.cross_entropy(out.flatten(0, 1).float(), targets.flatten())


def pipe_config(stage: int, precision: str, micro: int) -> dict:
    """ds_config with the global batch in micro-batches of `micro` per data-parallel rank."""
    cfg = ds_config(stage, precision, 1)
    cfg["train_micro_batch_size_per_gpu"] = micro
    return cfg


def pipe_batches(step: int, micro: int, dp: int, d: int) -> list:
    """Step `step`'s micro-batches (input, labels) for data-parallel rank d of dp."""
    rows = batch(step)[d * GLOBAL_BATCH // dp : (d + 1) * GLOBAL_BATCH // dp]
    return [(rows[i : i + micro], rows[i : i + micro]) for i in range(0, len(rows), micro)]


def save_and_resume(args, engine, steps, client_state=None) -> tuple[list, list, list]:
    """DeepSpeed's own resume: `engine()` trains K steps and saves, then N more; a fresh
    engine loads the folder and trains the same N. Returns the three loss lists."""
    e = engine()
    before = steps(e, 0, args.before)
    e.save_checkpoint(args.save, client_state=client_state or {})
    uninterrupted = steps(e, args.before, args.before + args.after)
    e.destroy()
    fresh = engine()
    fresh.load_checkpoint(args.save)
    return before, uninterrupted, steps(fresh, args.before, args.before + args.after)


def pipe_worker(args) -> None:
    """DeepSpeed's PipelineModule (2 stages): K steps, save, N more; a fresh engine loads and
    trains the same N (DeepSpeed's resume)."""
    import torch

    torch.set_num_threads(1)
    import deepspeed
    import torch.distributed as dist
    from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec

    deepspeed.init_distributed(dist_backend="gloo")
    cfg = pipe_config(args.stage, args.precision, 1)

    def engine():
        torch.manual_seed(0)  # (DeepSpeed 0.19.8's seed_layers fails: it seeds `random` with a tensor)
        net = PipelineModule(pipe_layers(LayerSpec, TiedLayerSpec), num_stages=2, loss_fn=pipe_loss,
                             partition_method="type:PreLNBlock")
        return deepspeed.initialize(model=net, config=cfg, model_parameters=[p for p in net.parameters()])[0]

    def steps(e, start, stop):
        return [e.train_batch(iter(pipe_batches(s, 1, 1, 0))).item() for s in range(start, stop)]

    before, uninterrupted, resumed = save_and_resume(args, engine, steps,
                                                     {"run": "deepspeed_checkpoints.py", "k": args.before})
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps({
            "deepspeed": deepspeed.__version__, "torch": torch.__version__, "stage": args.stage,
            "precision": args.precision, "pipeline_stages": 2, "k": args.before, "config": cfg,
            "model": dict(PIPE_MODEL, partition_method="type:PreLNBlock"),
            "batches": "torch.randint(0, vocab, (4, seq), generator=torch.Generator().manual_seed(1000 + step)), "
                       "micro-batches of 1 row",
            "losses_before": before, "next_losses_uninterrupted": uninterrupted,
            "next_losses_resumed": resumed}, indent=1))


def ds_reversed_worker(args) -> None:
    """DeepSpeed resumes its own 2-stage folder and trains `--after` steps with each step's
    micro-batches in reverse order: the same gradients summed in another order, so what that
    order alone moves DeepSpeed's next losses by (nothing in fp32; bf16 rounds each partial sum)."""
    import torch

    torch.set_num_threads(1)
    import deepspeed
    import torch.distributed as dist
    from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    net = PipelineModule(pipe_layers(LayerSpec, TiedLayerSpec), num_stages=2, loss_fn=pipe_loss,
                         partition_method="type:PreLNBlock")
    e = deepspeed.initialize(model=net, config=pipe_config(args.stage, args.precision, 1),
                             model_parameters=list(net.parameters()))[0]
    e.load_checkpoint(args.save)
    k = e.global_steps
    losses = [e.train_batch(iter(pipe_batches(s, 1, 1, 0)[::-1])).item() for s in range(k, k + args.after)]
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps({"losses": losses}))


def zerotrain_pipe_worker(args) -> None:
    """zerotrain resumes a DeepSpeed pipeline folder: with a PipelineModule of `--stages` stages
    (the rest of the world data-parallel), or with `--stages 0` a plain model of the same layers."""
    import torch
    import torch.distributed as dist
    from torch import nn

    import zerotrain
    from zerotrain.pipe import LayerSpec, PipelineModule, TiedLayerSpec

    torch.set_num_threads(1)
    expected = json.loads((Path(args.save) / "expected.json").read_text())
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    specs = pipe_layers(LayerSpec, TiedLayerSpec)
    torch.manual_seed(1)  # other initial weights than DeepSpeed's: the checkpoint must replace them
    if args.stages:
        net = PipelineModule(specs, num_stages=args.stages, loss_fn=pipe_loss, partition_method="type:PreLNBlock")
    else:
        net = Plain(specs)
    dp = world // max(1, args.stages)
    cfg = pipe_config(args.stage, expected["precision"], 1)
    if args.grad_accum_dtype:
        cfg["data_types"] = {"grad_accum_dtype": args.grad_accum_dtype}
    engine, *_ = zerotrain.initialize(model=net, config=cfg)
    engine.load_checkpoint(args.save)
    k, losses = engine.global_steps, []
    d = engine.grid.get_data_parallel_rank() if args.stages else rank
    for step in range(k, k + len(expected["next_losses_resumed"])):
        pairs = pipe_batches(step, 1, dp, d)
        if args.stages:
            losses.append(engine.train_batch(iter(pairs)).item())
            continue
        total = torch.zeros(())
        for x, y in pairs:
            loss = engine(x, labels=y)
            engine.backward(loss)
            engine.step()
            total += loss.detach() / len(pairs)
        dist.all_reduce(total)
        losses.append(total.item() / world)
    if rank == 0:
        Path(args.out).write_text(json.dumps({"losses": losses}))


def Plain(specs):
    """The pipeline's layers as one plain model (the tied head reusing layer 0's embedding)."""
    from torch import nn

    class PlainPipe(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(s.build() for s in specs[:-1])

        def forward(self, x, labels=None):
            for layer in self.layers:
                x = layer(x)
            return pipe_loss(_logits(self.layers[0], x), labels)

    return PlainPipe()


def pipe_matrix(python: Path, args) -> list[dict]:
    """DeepSpeed's 2-stage pipeline folders (ZeRO 0-1 x the precisions), each resumed by
    zerotrain's pipeline on 2 stages, on 1 stage (1 process; and 2 data ranks), and by a plain
    model of the same layers."""
    rows, k, n = [], args.before, args.after
    for stage in (1, 0):
        for precision in args.precisions.split(","):
            folder = Path(args.out_dir) / f"pipe2-stage{stage}-{precision}"
            if not (args.reuse and (folder / "expected.json").exists()):
                shutil.rmtree(folder, ignore_errors=True)
                folder.mkdir(parents=True)
            try:
                exp = json.loads((folder / "expected.json").read_text()) if args.reuse and \
                    (folder / "expected.json").exists() else deepspeed_job(python, "--pipe-worker", 2, folder / "expected.json", "--stage", stage,
                                    "--precision", precision, "--save", folder, "--before", k, "--after", n)
            except SystemExit as err:  # DeepSpeed itself refuses this combination: recorded as it said
                said = [line for line in str(err).splitlines() if line.startswith("[rank0]:") and "Error:" in line]
                last = [said[-1][len("[rank0]:"):]] if said else [str(err)[-300:]]
                rows.append({"deepspeed_stage": stage, "deepspeed_ranks": "2 pipeline stages x 1",
                             "precision": precision, "run": "DeepSpeed's own run", "relative": float("nan"),
                             "note": f"DeepSpeed failed: {last[0].strip()}"})
                print(rows[-1]["note"], flush=True)
                continue
            ds = exp["next_losses_resumed"]
            runs = [(2, 2, stage, ""), (2, 2, 1 - stage, ""), (1, 1, stage, ""), (1, 2, stage, ""), (0, 1, stage, "")]
            if precision != "fp32":  # DeepSpeed's default accumulates micro-batches in the training dtype
                runs.append((0, 1, stage, precision))
            for stages, procs, z_stage, accum in runs:
                label = (f"zerotrain pipeline {stages} stage(s) x {procs // stages} data rank(s), ZeRO {z_stage}"
                         if stages else f"zerotrain plain model, 1 process, ZeRO {z_stage}")
                label += f", data_types.grad_accum_dtype {accum}" if accum else ""
                try:
                    z = zerotrain_resume(folder, exp, z_stage, procs, "--pipe", "--stages", stages,
                                         *(("--grad-accum-dtype", accum) if accum else ()),
                                         name=f"-pipe{stages}-{procs}{accum}", reuse=args.reuse)
                except SystemExit as err:  # zerotrain refused the folder: its one line
                    said = [line for line in str(err).splitlines() if "CheckpointError" in line][-1:]
                    rows.append({"deepspeed_stage": stage, "deepspeed_ranks": "2 pipeline stages x 1",
                                 "precision": precision, "run": label, "relative": float("nan"),
                                 "note": said[0].split("CheckpointError: ")[-1] if said else str(err)[-300:]})
                    print(f"{label}: refused: {rows[-1]['note']}", flush=True)
                    continue
                rel = max(abs(a - b) / abs(b) for a, b in zip(z, ds))
                rows.append({"deepspeed_stage": stage, "deepspeed_ranks": "2 pipeline stages x 1",
                             "precision": precision, "run": label, "losses": z, "deepspeed_resume": ds,
                             "deepspeed_uninterrupted": exp["next_losses_uninterrupted"], "relative": rel})
                print(f"DeepSpeed pipeline 2 stages ZeRO-{stage} {precision} -> {label}: next losses within "
                      f"{rel:.1e} of DeepSpeed's resume", flush=True)
            out = folder / "deepspeed-reversed.json"
            if not (args.reuse and out.exists()):
                deepspeed_job(python, "--ds-reversed-worker", 2, out, "--stage", stage, "--precision", precision,
                              "--save", folder, "--after", n)
            rev = json.loads(out.read_text())["losses"]
            rel = max(abs(a - b) / abs(b) for a, b in zip(rev, ds))
            rows.append({"deepspeed_stage": stage, "deepspeed_ranks": "2 pipeline stages x 1", "precision": precision,
                         "run": "DeepSpeed's own resume, each step's micro-batches in reverse order", "losses": rev,
                         "deepspeed_resume": ds, "relative": rel})
            print(f"DeepSpeed pipeline ZeRO-{stage} {precision}, micro-batches reversed: within {rel:.1e} of its "
                  "resume", flush=True)
    return rows


def autotp_worker(args) -> None:
    """DeepSpeed's AutoTP training (tensor_parallel.autotp_size 2, ZeRO 1) of the GPT, as it is
    and under a class name AutoTP's parser accepts: a step and a save, or the error each gives."""
    import traceback

    import torch

    torch.set_num_threads(1)
    import deepspeed
    import torch.distributed as dist

    deepspeed.init_distributed(dist_backend="gloo")
    cfg = dict(ds_config(1, "fp32", 2), tensor_parallel={"autotp_size": 2})

    class TinyGPTModel(torch.nn.Module):  # AutoTP reads the model's kind from "<Name>Model"
        def __init__(self):
            super().__init__()
            self.gpt = model()

        def forward(self, x, labels=None):
            return self.gpt(x, labels=labels)

    tries = {}
    for label, build in (("zerotrain's GPT", model), ("the GPT inside a class TinyGPTModel", TinyGPTModel),
                         ("an HF LlamaForCausalLM", hf_llama)):
        try:
            engine, *_ = deepspeed.initialize(model=build(), config=cfg, model_parameters=None)
            x = batch(0)[:2]
            out = engine(x, labels=x)
            engine.backward(getattr(out, "loss", out))  # an HF model returns an output object
            engine.step()
            engine.save_checkpoint(str(Path(args.save) / label.split()[-1]))
            tries[label] = "trained a step and saved"
        except Exception as err:  # what DeepSpeed says, recorded as it is
            root = Path(deepspeed.__file__).parent.parent
            frames = traceback.extract_tb(err.__traceback__)
            frame = ([f for f in frames if Path(f.filename).is_relative_to(root / "deepspeed")] or frames)[-1]
            path = Path(frame.filename)
            where = path.relative_to(root) if path.is_relative_to(root) else path
            tries[label] = f"{type(err).__name__}: {err} ({where}:{frame.lineno})"
    if dist.get_rank() == 0:
        try:
            import transformers
        except ImportError:
            transformers = None
        Path(args.out).write_text(json.dumps({"deepspeed": deepspeed.__version__, "torch": torch.__version__,
                                              "transformers": getattr(transformers, "__version__", None),
                                              "config": cfg, "tries": tries}, indent=1))


def hf_llama():
    """A tiny HF LlamaForCausalLM (random weights) of the GPT's sizes, which AutoTP splits."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=EMBD, intermediate_size=2 * EMBD,
                                        num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=HEADS,
                                        max_position_embeddings=SEQ))


def autotp_case_worker(args) -> None:
    """DeepSpeed's AutoTP (2 tensor ranks, ZeRO 1) trains the HF LLaMA K steps, saves, N more;
    a fresh engine loads and trains the same N (DeepSpeed's resume). Both tensor ranks read the
    same 2 rows a step (DeepSpeed 0.19.8 checks the batch sizes against the whole world size)."""
    import torch

    torch.set_num_threads(1)
    import deepspeed
    import torch.distributed as dist

    deepspeed.init_distributed(dist_backend="gloo")
    cfg = dict(ds_config(args.stage, args.precision, 2), tensor_parallel={"autotp_size": 2})

    def steps(engine, start, stop):
        out = []
        for step in range(start, stop):
            x = batch(step)[:2]
            loss = engine(x, labels=x).loss
            engine.backward(loss)
            engine.step()
            out.append(loss.item())
        return out

    before, uninterrupted, resumed = save_and_resume(
        args, lambda: deepspeed.initialize(model=hf_llama(), config=cfg, model_parameters=None)[0], steps)
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps({
            "deepspeed": deepspeed.__version__, "torch": torch.__version__, "stage": args.stage,
            "precision": args.precision, "tensor_parallel": 2, "k": args.before, "config": cfg,
            "model": {"hf": "LlamaForCausalLM", "vocab_size": VOCAB, "hidden_size": EMBD, "layers": LAYERS},
            "losses_before": before, "next_losses_uninterrupted": uninterrupted, "next_losses_resumed": resumed},
            indent=1))


def zerotrain_autotp_worker(args) -> None:
    """zerotrain resumes a DeepSpeed AutoTP folder with the HF LLaMA: `--tensor` 1 a plain model
    (the world data-parallel), else tensor_parallel.autotp_size = the world; the same 2 rows a
    step as DeepSpeed's run, and the mean loss over the data ranks."""
    import torch
    import torch.distributed as dist

    import zerotrain

    torch.set_num_threads(1)
    expected = json.loads((Path(args.save) / "expected.json").read_text())
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dp = world // args.tensor
    cfg = dict(ds_config(args.stage, expected["precision"], dp), train_batch_size=2, train_micro_batch_size_per_gpu=2 // dp)
    if args.tensor > 1:
        cfg["tensor_parallel"] = {"autotp_size": args.tensor}
    torch.manual_seed(1)
    engine, *_ = zerotrain.initialize(model=hf_llama(), config=cfg)
    engine.load_checkpoint(args.save)
    k, losses = engine.global_steps, []
    d = rank // args.tensor if args.tensor > 1 else rank
    for step in range(k, k + len(expected["next_losses_resumed"])):
        x = batch(step)[:2][d * 2 // dp : (d + 1) * 2 // dp]
        loss = engine(x, labels=x).loss
        engine.backward(loss)
        engine.step()
        mean = loss.detach().float().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / world)
    if rank == 0:
        Path(args.out).write_text(json.dumps({"losses": losses}))


def autotp_resumes(python: Path, folder: Path, k: int, n: int) -> list[dict]:
    """DeepSpeed's AutoTP case (autotp_case_worker) into `folder`, resumed by zerotrain as a
    plain model on 1 process and on 2 data ranks, and on 2 tensor ranks."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    exp = deepspeed_job(python, "--autotp-case-worker", 2, folder / "expected.json", "--stage", 1, "--precision",
                        "fp32", "--save", folder, "--before", k, "--after", n)
    rows = []
    for procs, tensor, label in ((1, 1, "plain model, 1 process"), (2, 1, "plain model, 2 data ranks"),
                                 (2, 2, "tensor_parallel.autotp_size 2")):
        z = zerotrain_resume(folder, exp, 1, procs, "--zerotrain-autotp", "--tensor", tensor, name=f"-tp{tensor}")
        rel = max(abs(a - b) / abs(b) for a, b in zip(z, exp["next_losses_resumed"]))
        rows.append({"run": f"zerotrain, {label}, ZeRO 1", "losses": z, "deepspeed_resume": exp["next_losses_resumed"],
                     "deepspeed_uninterrupted": exp["next_losses_uninterrupted"], "relative": rel})
        print(f"DeepSpeed AutoTP -> {rows[-1]['run']}: next losses within {rel:.1e} of DeepSpeed's resume", flush=True)
    return rows


def deepspeed_job(python: Path, mode: str, nproc: int, out: Path, *extra) -> dict:
    """A torchrun job of this script in DeepSpeed's venv; its json output."""
    from common import DS_VENV, free_port, venv_env

    cmd = [str(python), "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
           str(free_port()), __file__, mode, "--out", str(out), *map(str, extra)]
    r = subprocess.run(cmd, env=venv_env(DS_VENV), capture_output=True, text=True, timeout=900)
    if r.returncode != 0 or not out.exists():
        raise SystemExit(f"DeepSpeed job failed ({mode} {extra}):\n{(r.stdout + r.stderr)[-4000:]}")
    return json.loads(out.read_text())


def deepspeed_case(python: Path, stage: int, precision: str, nproc: int, folder: Path, k: int, n: int) -> dict:
    """One DeepSpeed job writing `folder/global_step{k}` and `folder/expected.json`."""
    folder.mkdir(parents=True, exist_ok=True)
    return deepspeed_job(python, "--worker", nproc, folder / "expected.json", "--stage", stage, "--precision",
                         precision, "--save", folder, "--before", k, "--after", n)


def zerotrain_resume(folder: Path, expected: dict, stage: int, nproc: int, *extra, name: str = "",
                     reuse: bool = False) -> list[float]:
    """zerotrain resumes the DeepSpeed folder at `stage` on `nproc` ranks: its next losses.
    `extra`: --universal (load with load_universal), --save-zt DIR (save its own checkpoint);
    `reuse`: the losses of an earlier run of the same resume, where there are."""
    out = folder / f"zerotrain{name}-stage{stage}-ranks{nproc}.json"
    if reuse and out.exists():
        return json.loads(out.read_text())["losses"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
           str(__import__("common").free_port()), __file__, "--zerotrain", "--stage", str(stage),
           "--save", str(folder), "--out", str(out), *map(str, extra)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(SRC))
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise SystemExit(f"zerotrain resume failed:\n{(r.stdout + r.stderr)[-4000:]}")
    return json.loads(out.read_text())["losses"]


def zerotrain_worker(args) -> None:
    import torch
    import torch.distributed as dist

    import zerotrain

    torch.set_num_threads(1)
    expected = json.loads((Path(args.expected or args.save) / "expected.json").read_text())
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = ds_config(args.stage, expected["precision"], world)
    if args.universal:
        cfg["checkpoint"] = {"load_universal": True}
    engine, *_ = zerotrain.initialize(model=model(), config=cfg)
    engine.load_checkpoint(args.save)
    k = engine.global_steps
    if args.save_zt:  # zerotrain's own checkpoint of the state it just loaded
        engine.save_checkpoint(args.save_zt)
    losses = run_steps(engine, k, k + len(expected["next_losses_resumed"]), rank, world)
    if rank == 0:
        Path(args.out).write_text(json.dumps({"losses": losses}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--zerotrain", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--ds-universal", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--pipe-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--autotp-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--ds-reversed-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--autotp-case-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--zerotrain-autotp", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--tensor", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--autotp", action="store_true", help="try DeepSpeed's AutoTP training on CPU (a tensor-parallel "
                   "folder); record what DeepSpeed says")
    p.add_argument("--pipe", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--stages", type=int, default=2, help=argparse.SUPPRESS)
    p.add_argument("--save-zt", help=argparse.SUPPRESS)
    p.add_argument("--grad-accum-dtype", help=argparse.SUPPRESS)
    p.add_argument("--expected", help=argparse.SUPPRESS)
    p.add_argument("--universal", action="store_true", help="the universal-checkpoint matrix (both directions)")
    p.add_argument("--reuse", action="store_true", help="the matrix and --pipeline: take the runs already in "
                   "--out-dir (a DeepSpeed case's expected.json, a resume's losses) instead of running them again")
    p.add_argument("--pipeline", action="store_true", help="the pipeline-checkpoint matrix (with --fixture: a "
                   "pipeline fixture)")
    p.add_argument("--ds-venv", help="DeepSpeed's venv (default benchmarks/.ds-venv)")
    p.add_argument("--results", default=str(HERE.parent / "docs" / "results" / "deepspeed_checkpoints"))
    p.add_argument("--stage", type=int, default=2)
    p.add_argument("--precision", default="fp32")
    p.add_argument("--save")
    p.add_argument("--out")
    p.add_argument("--before", type=int, default=3, help="steps before the checkpoint")
    p.add_argument("--after", type=int, default=3, help="steps after it")
    p.add_argument("--precisions", default="fp32,bf16", help="of fp32, bf16, fp16 (fp16 needs a device DeepSpeed "
                   "computes fp16 on)")
    p.add_argument("--fixture", help="write one case (2 ranks, stage 2, bf16; --pipeline: 2 stages, ZeRO 1, fp32, "
                   "or ZeRO 0 with --stage 0; "
                   "--autotp: the HF LLaMA on 2 AutoTP ranks, ZeRO 1, fp32) "
                   "into this folder")
    p.add_argument("--out-dir", default=str(HERE.parent / "runs" / "ds-checkpoints"))
    args = p.parse_args()
    if args.worker:
        return worker(args)
    if args.zerotrain:
        if args.zerotrain_autotp:
            return zerotrain_autotp_worker(args)
        return zerotrain_pipe_worker(args) if args.pipe else zerotrain_worker(args)
    if args.ds_universal:
        return universal_worker(args)
    if args.pipe_worker:
        return pipe_worker(args)
    if args.autotp_worker:
        return autotp_worker(args)
    if args.ds_reversed_worker:
        return ds_reversed_worker(args)
    if args.autotp_case_worker:
        return autotp_case_worker(args)
    import common
    from compare_zero import ensure_deepspeed

    if args.ds_venv:
        common.DS_VENV = Path(args.ds_venv).resolve()

    python = ensure_deepspeed()
    if python is None:
        raise SystemExit("DeepSpeed is not available")
    if args.fixture:
        folder = Path(args.fixture)
        shutil.rmtree(folder, ignore_errors=True)
        if args.pipeline:  # 2 pipeline stages, ZeRO 1 (0 with --stage 0), fp32
            folder.mkdir(parents=True)
            deepspeed_job(python, "--pipe-worker", 2, folder / "expected.json", "--stage", 0 if args.stage == 0 else 1,
                          "--precision", "fp32",
                          "--save", folder, "--before", args.before, "--after", args.after)
        elif args.autotp:  # AutoTP on 2 tensor ranks, ZeRO 1, fp32, the HF LLaMA
            folder.mkdir(parents=True)
            deepspeed_job(python, "--autotp-case-worker", 2, folder / "expected.json", "--stage", 1, "--precision",
                          "fp32", "--save", folder, "--before", args.before, "--after", args.after)
        else:
            deepspeed_case(python, 2, "bf16", 2, folder, args.before, args.after)
        for script in folder.glob("*.py"):  # DeepSpeed's own scripts, which it copies beside its checkpoints
            script.unlink()
        return
    if args.universal:
        return universal_matrix(python, args)
    if args.autotp:
        folder = Path(args.out_dir) / "autotp"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        data = deepspeed_job(python, "--autotp-worker", 2, folder / "autotp.json", "--save", folder)
        out = Path(args.results)
        out.mkdir(parents=True, exist_ok=True)
        (out / "autotp.json").write_text(json.dumps(data, indent=1))
        lines = [f"`python benchmarks/deepspeed_checkpoints.py --autotp`: DeepSpeed {data['deepspeed']} (torch "
                 f"{data['torch']}, transformers {data['transformers'] or 'not installed'}, CPU, gloo, 2 processes), "
                 "`tensor_parallel.autotp_size` 2 at ZeRO 1, one training step and `save_checkpoint`:", "",
                 "| model | DeepSpeed |", "|---|---|"]
        lines += [f"| {label} | {said} |" for label, said in data["tries"].items()]
        data["resumes"] = autotp_resumes(python, Path(args.out_dir) / "autotp-case", args.before, args.after)
        (out / "autotp.json").write_text(json.dumps(data, indent=1))
        lines += ["", f"The LLaMA trained {args.before} steps by DeepSpeed's AutoTP (2 tensor ranks, ZeRO 1, fp32) and "
                  f"saved; its next {args.after} losses resumed by zerotrain against DeepSpeed's own resume (max "
                  "relative difference):", "", "| zerotrain resume | next losses vs DeepSpeed's resume |", "|---|---|"]
        lines += [f"| {r['run']} | {r['relative']:.1e} |" for r in data["resumes"]]
        (out / "autotp.md").write_text("\n".join(lines) + "\n")
        return print("\n".join(lines))
    if args.pipeline:
        rows = pipe_matrix(python, args)
        exp = json.loads((Path(args.out_dir) / "pipe2-stage1-fp32" / "expected.json").read_text())
        return write_results(args, "pipeline", exp, rows, "`python benchmarks/deepspeed_checkpoints.py --pipeline`: "
                             "DeepSpeed {deepspeed} (torch {torch}, CPU, gloo) trains a GPT of pipeline layers {model} "
                             "with its PipelineModule engine on 2 stages for {k} steps and saves (`layer_*` files, one "
                             "`mp_rank_SS` per stage); zerotrain resumes the folder on a pipeline of 2 stages, of 1 "
                             "stage (1 process, and 2 data ranks), and as a plain model of the same layers, and trains "
                             "the next {n} steps, compared with DeepSpeed's own resume of the folder (max relative "
                             "difference of the step's loss).")
    matrix(python, args)


def matrix(python: Path, args) -> None:
    """DeepSpeed's global_stepK folders for ranks 1, 2 x ZeRO 1-3 x the precisions, each resumed by
    zerotrain on the same layout, at another stage, and on another data-parallel size."""
    rows, k, n = [], args.before, args.after
    for nproc in (1, 2):
        for stage in (1, 2, 3):
            for precision in args.precisions.split(","):
                folder = Path(args.out_dir) / f"ranks{nproc}-stage{stage}-{precision}"
                if args.reuse and (folder / "expected.json").exists():
                    exp = json.loads((folder / "expected.json").read_text())
                else:
                    shutil.rmtree(folder, ignore_errors=True)
                    exp = deepspeed_case(python, stage, precision, nproc, folder, k, n)
                ds = exp["next_losses_resumed"]
                for z_stage, z_ranks in ((stage, nproc), (3 if stage != 3 else 0, nproc), (stage, 3 - nproc)):
                    z = zerotrain_resume(folder, exp, z_stage, z_ranks, reuse=args.reuse)
                    rel = max(abs(a - b) / abs(b) for a, b in zip(z, ds))
                    label = f"zerotrain, stage {z_stage}, {z_ranks} rank(s)"
                    rows.append({"deepspeed_stage": stage, "deepspeed_ranks": nproc, "precision": precision,
                                 "run": label, "losses": z, "deepspeed_resume": ds,
                                 "deepspeed_uninterrupted": exp["next_losses_uninterrupted"], "relative": rel})
                    print(f"DeepSpeed {nproc} rank(s) ZeRO-{stage} {precision} -> {label}: next losses within "
                          f"{rel:.1e} of DeepSpeed's resume", flush=True)
    write_results(args, "matrix", exp, rows, f"`python benchmarks/deepspeed_checkpoints.py`: DeepSpeed "
                  "{deepspeed} (torch {torch}, CPU, gloo) trains zerotrain's GPT {model} for {k} steps on 1 or 2 "
                  "ranks and saves `global_step{k}/`; zerotrain resumes that folder on the same layout, at another "
                  "ZeRO stage, and on another data-parallel size, and trains the next {n} steps, compared with "
                  "DeepSpeed's own resume of the folder (max relative difference of the mean loss over ranks).")


def write_results(args, name: str, exp: dict, rows: list[dict], intro: str) -> None:
    """<results>/<name>.json (raw losses) and <name>.md (the table)."""
    out = Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    data = {"deepspeed": exp["deepspeed"], "torch": exp["torch"], "k": args.before, "n": args.after,
            "model": exp["model"], "rows": rows}
    (out / f"{name}.json").write_text(json.dumps(data, indent=1))
    lines = [intro.format(**data), "", "| DeepSpeed run | precision | resume | next losses vs DeepSpeed's resume |",
             "|---|---|---|---|"]
    lines += [f"| ZeRO {r['deepspeed_stage']}, {r.get('deepspeed_ranks', 2)} rank(s) | {r['precision']} | "
              f"{r['run']} | {r.get('note') or format(r['relative'], '.1e')} |" for r in rows]
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")
    print(f"worst: {max((r['relative'] for r in rows if 'note' not in r), default=0.0):.1e}; written to {out}")


def universal_matrix(python: Path, args) -> None:
    """Both directions of the universal format for 2 ranks x ZeRO 1-3 x the precisions."""
    rows, k, n = [], args.before, args.after
    for stage in (1, 2, 3):
        for precision in args.precisions.split(","):
            folder = Path(args.out_dir) / f"universal-stage{stage}-{precision}"
            shutil.rmtree(folder, ignore_errors=True)
            exp = deepspeed_case(python, stage, precision, 2, folder, k, n)
            ds = exp["next_losses_resumed"]
            from common import DS_VENV, venv_env

            converted = folder / "ds-universal" / f"global_step{k}_universal"
            r = subprocess.run([str(python), "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder",
                                str(folder / f"global_step{k}"), "--output_folder", str(converted),
                                "--inject_missing_state", "--num_extract_workers", "1", "--num_merge_workers", "1"],
                               env=venv_env(DS_VENV), capture_output=True, text=True, timeout=900)
            if r.returncode != 0:
                raise SystemExit(f"ds_to_universal failed:\n{(r.stdout + r.stderr)[-4000:]}")
            common_args = ("--stage", stage, "--precision", precision, "--after", n)
            runs = {"DeepSpeed resumes its own universal folder (stage %d, 2 ranks)" % stage: deepspeed_job(
                python, "--ds-universal", 2, folder / "ds-resumes-ds-universal.json", "--save", converted.parent,
                *common_args)["losses"]}
            other = 3 if stage != 3 else 1
            for z_stage, z_ranks in ((stage, 2), (other, 1)):
                label = f"zerotrain resumes DeepSpeed's universal folder at stage {z_stage}, {z_ranks} rank(s)"
                runs[label] = zerotrain_resume(converted.parent, exp, z_stage, z_ranks, "--universal", "--expected",
                                               folder, name="-ds-universal")
            zt = folder / "zerotrain-ckpt"
            zerotrain_resume(folder, exp, stage, 2, "--save-zt", zt, name="-save")
            mine = folder / "zt-universal" / f"global_step{k}_universal"
            env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(SRC))
            r = subprocess.run([sys.executable, "-m", "zerotrain.cli", "convert", "--to", "deepspeed-universal",
                                str(zt), str(mine)], env=env, capture_output=True, text=True, timeout=900)
            if r.returncode != 0:
                raise SystemExit(f"zerotrain convert failed:\n{(r.stdout + r.stderr)[-4000:]}")
            for d_stage, d_ranks in ((stage, 2), (other, 1)):
                label = f"DeepSpeed resumes zerotrain's convert output at stage {d_stage}, {d_ranks} rank(s)"
                runs[label] = deepspeed_job(python, "--ds-universal", d_ranks,
                                            folder / f"ds-resumes-zt-universal-{d_stage}-{d_ranks}.json", "--save",
                                            mine.parent, "--stage", d_stage, "--precision", precision, "--after",
                                            n)["losses"]
            for label, losses in runs.items():
                rel = max(abs(a - b) / abs(b) for a, b in zip(losses, ds))
                rows.append({"deepspeed_stage": stage, "precision": precision, "run": label, "losses": losses,
                             "deepspeed_resume": ds, "relative": rel})
                print(f"DeepSpeed ZeRO-{stage} {precision}, 2 ranks, step {k}: {label}: next losses within "
                      f"{rel:.1e} of DeepSpeed's resume", flush=True)
    write_results(args, "universal", exp, rows, "`python benchmarks/deepspeed_checkpoints.py --universal`: "
                  "DeepSpeed {deepspeed} (torch {torch}, CPU, gloo) trains zerotrain's GPT {model} for {k} steps on "
                  "2 ranks and saves; each resume trains the next {n} steps, compared with DeepSpeed's own resume of "
                  "that `global_step` folder (max relative difference of the mean loss over ranks).")


if __name__ == "__main__":
    main()
