"""DeepSpeed writes small checkpoints; zerotrain resumes them and must continue as DeepSpeed does.

    python benchmarks/deepspeed_checkpoints.py                  # the matrix, into runs/ds-checkpoints/
    python benchmarks/deepspeed_checkpoints.py --universal      # the universal-checkpoint matrix
    python benchmarks/deepspeed_checkpoints.py --fixture DIR    # one case, as the test fixture

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
Results: docs/results/deepspeed_checkpoints/universal.json and universal.md (--results DIR).
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


def zerotrain_resume(folder: Path, expected: dict, stage: int, nproc: int, *extra, name: str = "") -> list[float]:
    """zerotrain resumes the DeepSpeed folder at `stage` on `nproc` ranks: its next losses.
    `extra`: --universal (load with load_universal), --save-zt DIR (save its own checkpoint)."""
    out = folder / f"zerotrain{name}-stage{stage}-ranks{nproc}.json"
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
    p.add_argument("--save-zt", help=argparse.SUPPRESS)
    p.add_argument("--expected", help=argparse.SUPPRESS)
    p.add_argument("--universal", action="store_true", help="the universal-checkpoint matrix (both directions)")
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
    p.add_argument("--fixture", help="write one case (2 ranks, stage 2, bf16) into this folder")
    p.add_argument("--out-dir", default=str(HERE.parent / "runs" / "ds-checkpoints"))
    args = p.parse_args()
    if args.worker:
        return worker(args)
    if args.zerotrain:
        return zerotrain_worker(args)
    if args.ds_universal:
        return universal_worker(args)
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
        deepspeed_case(python, 2, "bf16", 2, folder, args.before, args.after)
        for script in folder.glob("*.py"):  # DeepSpeed's own scripts, which it copies beside its checkpoints
            script.unlink()
        return
    if args.universal:
        return universal_matrix(python, args)
    worst = 0.0
    for nproc in (1, 2):
        for stage in (1, 2, 3):
            for precision in args.precisions.split(","):
                folder = Path(args.out_dir) / f"ranks{nproc}-stage{stage}-{precision}"
                shutil.rmtree(folder, ignore_errors=True)
                exp = deepspeed_case(python, stage, precision, nproc, folder, args.before, args.after)
                ds = exp["next_losses_resumed"]
                for z_stage, z_ranks in ((stage, nproc), (3 if stage != 3 else 0, nproc), (stage, 3 - nproc)):
                    z = zerotrain_resume(folder, exp, z_stage, z_ranks)
                    rel = max(abs(a - b) / abs(b) for a, b in zip(z, ds))
                    worst = max(worst, rel) if (z_stage, z_ranks) == (stage, nproc) else worst
                    print(f"DeepSpeed {nproc} rank(s) ZeRO-{stage} {precision} -> zerotrain {z_ranks} rank(s) "
                          f"stage {z_stage}: next losses within {rel:.1e} of DeepSpeed's resume", flush=True)
    print(f"same layout: worst {worst:.1e}")


def universal_table(data: dict) -> str:
    """universal.md: the command, the versions and one row per resume."""
    lines = ["`python benchmarks/deepspeed_checkpoints.py --universal`: DeepSpeed "
             f"{data['deepspeed']} (torch {data['torch']}, CPU, gloo) trains zerotrain's GPT {data['model']} for "
             f"{data['k']} steps on 2 ranks and saves; each resume trains the next {data['n']} steps, compared with "
             "DeepSpeed's own resume of that `global_step` folder (max relative difference of the mean loss over "
             "ranks).", "",
             "| DeepSpeed run | precision | resume | next losses vs DeepSpeed's resume |", "|---|---|---|---|"]
    lines += [f"| ZeRO {r['deepspeed_stage']}, 2 ranks | {r['precision']} | {r['run']} | {r['relative']:.1e} |"
              for r in data["rows"]]
    return "\n".join(lines) + "\n"


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
    out = Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    data = {"deepspeed": exp["deepspeed"], "torch": exp["torch"], "k": k, "n": n, "model": exp["model"], "rows": rows}
    (out / "universal.json").write_text(json.dumps(data, indent=1))
    (out / "universal.md").write_text(universal_table(data))
    print(f"worst: {max(r['relative'] for r in rows):.1e}; written to {out}")


if __name__ == "__main__":
    main()
