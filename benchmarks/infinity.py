"""ZeRO-Infinity at 1.23B parameters: one GPT on 2 ranks of this machine, parameters and optimizer on NVMe.

    python benchmarks/infinity.py [--nvme-path DIR] [--layers 24] [--steps 3] [--skip-cpu] [--skip-trainer] [--skip-resume] [--only-trainer]

The model: zerotrain's GPT, n_embd 2048, 24 layers, 16 heads, vocabulary 8192, 64 positions
(1.23B parameters), built under `zerotrain.zero.Init()`, bf16, AdamW, ZeRO stage 3 with
`offload_param` and `offload_optimizer` on nvme, zerotrain's default prefetch, live and reuse
windows, micro batch 1 x 64 tokens per rank. One job
at a time (each takes most of the machine), every job a torchrun of 2 processes:

  nvme       3 steps; peak resident memory per rank (VmHWM) at the end of initialize and of the
             run; seconds per step; the swap folders must be gone after the normal exit
  cpu        the same with `offload_optimizer: cpu` (and parameters on cpu): the losses of
             `nvme` must equal these to 1e-5 relative. At 24 layers this job holds the fp32 masters
             and moments in RAM, about 10 GiB per rank: more than this machine can give two ranks
             beside anything else, so run the parity at fewer layers (`--layers 8 --skip-resume`)
  kill       nvme again, a checkpoint after step 1, then every rank SIGKILLs itself
  resume     from that checkpoint to step 3: its losses must equal `nvme`'s bit for bit; the
             swap folders the killed job left must be cleared at its start
  consolidate  `zerotrain consolidate` of the resumed run's final checkpoint, its peak RSS
             (under 2 GiB is the target) and its output against the trained weights (the bf16
             rounding of each consolidated fp32 master equals the module's weight)
  trainer    the model saved as a folder, then `zerotrain train --model_name_or_path` at stage
             3 + NVMe for 3 steps: the trainer's ranks' peak RSS

Target: peak RSS per rank at most 3 GiB in `nvme`, `resume` and `trainer`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import status_kib  # noqa: E402

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
GIB = 1 << 30
RSS_TARGET_GIB = 3  # the target: peak RSS per rank of the nvme, resume and trainer jobs




def model_config(args) -> dict:
    return {"vocab_size": 8192, "n_positions": args.seq, "n_embd": 2048, "n_layer": args.layers, "n_head": 16}


def ds_config(args, offload: str, nvme: str) -> dict:
    # the prefetch, live and reuse windows are zerotrain's defaults (measured on the model: about
    # two typical modules), as a user gets them
    zero = {"stage": 3, "stage3_param_persistence_threshold": 0,
            "offload_optimizer": {"device": offload, **({"nvme_path": nvme} if offload == "nvme" else {})},
            "offload_param": {"device": offload, **({"nvme_path": nvme} if offload == "nvme" else {})}}
    return {"train_batch_size": 2, "train_micro_batch_size_per_gpu": 1, "gradient_clipping": 1.0,
            "bf16": {"enabled": True}, "zero_optimization": zero,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}}}


# ---- worker: one rank of a torchrun job ------------------------------------------------------

def worker(args) -> None:
    import torch

    import zerotrain
    from zerotrain.models import GPT, GPTConfig

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    t0 = time.perf_counter()
    torch.manual_seed(0)
    config = ds_config(args, args.offload, args.nvme_path)
    with zerotrain.zero.Init(config_dict_or_path=config):  # chunks kept in the config's bf16, as DeepSpeed's
        model = GPT(GPTConfig(**model_config(args)))
    engine, *_ = zerotrain.initialize(model=model, config=config)
    start = 0
    if args.load:
        engine.load_checkpoint(args.load)
        start = engine.global_steps
    init = {"s": time.perf_counter() - t0, "hwm_kib": status_kib("VmHWM")}
    if rank == 0:
        print(f"  initialized in {init['s']:.1f} s, VmHWM {init['hwm_kib'] / (1 << 20):.2f} GiB", flush=True)
    losses, times = [], []
    for step in range(start, args.steps):
        g = torch.Generator().manual_seed(1000 + step * world + rank)
        x = torch.randint(0, 8192, (1, args.seq), generator=g)
        t = time.perf_counter()
        loss = engine(x, labels=x)
        engine.backward(loss)
        engine.step()
        mean = loss.detach().float().reshape(1)
        torch.distributed.all_reduce(mean)
        losses.append(mean.item() / world)
        times.append(time.perf_counter() - t)
        if rank == 0:
            print(f"  step {step + 1}: loss {losses[-1]:.6f}, {times[-1]:.1f} s, VmHWM {status_kib('VmHWM') / (1 << 20):.2f} GiB",
                  flush=True)
        if args.save and engine.global_steps == args.save_at:
            engine.save_checkpoint(args.save)
            if args.kill:
                os.kill(os.getpid(), signal.SIGKILL)
    hwm = status_kib("VmHWM")
    sums = {}
    if args.sums:  # after VmHWM is read: each weight gathered alone, summed in float64
        for name, p in engine.module.named_parameters():
            with zerotrain.zero.GatheredParameters([p]):
                sums[name] = p.detach().double().sum().item()
        if args.save:
            engine.save_checkpoint(args.save)
    if rank == 0:
        Path(args.out).write_text(json.dumps({"init": init, "hwm_kib": hwm, "losses": losses, "times": times,
                                              "params": sum(p.numel() for p in engine.module.parameters()),
                                              "sums": sums}))
    engine.destroy()


# ---- parent ------------------------------------------------------------------------------

def _env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(SRC))


def _freeze_source(work: Path) -> None:
    """Every job runs the source as it was when the run started (edits meanwhile cannot mix)."""
    global SRC
    shutil.copytree(SRC, work / "src", ignore=shutil.ignore_patterns("__pycache__"))
    SRC = work / "src"


def torchrun(args, offload: str, out: Path, **flags) -> tuple[int, float]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           __file__, "--worker", "--offload", offload, "--out", str(out), "--nvme-path", args.nvme_path,
           "--layers", str(args.layers), "--steps", str(args.steps), "--seq", str(args.seq)]
    for k, v in flags.items():
        cmd += [f"--{k.replace('_', '-')}"] + ([] if v is True else [str(v)])
    t = time.perf_counter()
    code = subprocess.run(cmd, env=_env()).returncode
    return code, time.perf_counter() - t


def _swap_left(nvme: str) -> list[str]:
    return sorted(p.name for p in Path(nvme).glob("zerotrain-*"))


def _children_peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / (1 << 20)


def _fits(r: dict) -> bool:
    return r["hwm_kib"] <= RSS_TARGET_GIB * (1 << 20)


def _line(name: str, r: dict) -> str:
    per = sum(r["times"][1:]) / max(1, len(r["times"]) - 1) if len(r["times"]) > 1 else r["times"][0]
    return (f"{name:<9} {r['params'] / 1e9:6.3f}B  init {r['init']['s']:6.1f} s, peak RSS by the end of "
            f"initialize {r['init']['hwm_kib'] / (1 << 20):5.2f} GiB, at the end {r['hwm_kib'] / (1 << 20):5.2f} GiB "
            f"per rank (rank 0); {per:6.1f} s/step; losses {['%.6f' % x for x in r['losses']]}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--offload", default="nvme")
    p.add_argument("--out")
    p.add_argument("--nvme-path", default=None)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--save")
    p.add_argument("--save-at", type=int, default=1)
    p.add_argument("--kill", action="store_true")
    p.add_argument("--load")
    p.add_argument("--sums", action="store_true")
    p.add_argument("--skip-cpu", action="store_true")
    p.add_argument("--skip-trainer", action="store_true")
    p.add_argument("--only-trainer", action="store_true", help="only the trainer job")
    p.add_argument("--skip-resume", action="store_true", help="stop after nvme (and cpu): no kill, resume, "
                   "consolidate or trainer")
    args = p.parse_args()
    if args.worker:
        worker(args)
        return 0
    work = Path(tempfile.mkdtemp(prefix="zt-infinity-", dir=args.nvme_path and str(Path(args.nvme_path).parent)))
    _freeze_source(work)
    args.nvme_path = args.nvme_path or str(work / "swap")
    Path(args.nvme_path).mkdir(parents=True, exist_ok=True)
    ok = True
    try:
        if args.only_trainer:
            return _done(_trainer(args, work))
        results = {}
        code, _ = torchrun(args, "nvme", work / "nvme.json")
        results["nvme"] = json.loads((work / "nvme.json").read_text())
        print(_line("nvme", results["nvme"]) + f" (peak target <= {RSS_TARGET_GIB} GiB)", flush=True)
        left = _swap_left(args.nvme_path)
        print(f"swap folders after a normal exit: {left or 'none'}")
        ok &= code == 0 and not left and _fits(results["nvme"])
        if not args.skip_cpu:
            code, _ = torchrun(args, "cpu", work / "cpu.json")
            results["cpu"] = json.loads((work / "cpu.json").read_text())
            print(_line("cpu", results["cpu"]), flush=True)
            rel = max(abs(a - b) / abs(b) for a, b in zip(results["nvme"]["losses"], results["cpu"]["losses"]))
            print(f"nvme vs cpu offload: largest relative loss difference {rel:.2e} (target 1e-5)")
            ok &= rel <= 1e-5
        if args.skip_resume:
            return _done(ok)
        ckpt = work / "ckpt"
        code, _ = torchrun(args, "nvme", work / "kill.json", save=ckpt, save_at=1, kill=True)
        left = _swap_left(args.nvme_path)
        print(f"kill: exit {code} after the checkpoint at step 1; swap folders left by the kill: {len(left)}")
        code, _ = torchrun(args, "nvme", work / "resume.json", load=ckpt, sums=True, save=work / "final")
        results["resume"] = json.loads((work / "resume.json").read_text())
        print(_line("resume", results["resume"]) + f" (peak target <= {RSS_TARGET_GIB} GiB)", flush=True)
        same = results["resume"]["losses"] == results["nvme"]["losses"][1:]
        print(f"resumed losses equal the uninterrupted run's bit for bit: {same}; swap folders now: "
              f"{_swap_left(args.nvme_path) or 'none'}")
        ok &= code == 0 and same and not _swap_left(args.nvme_path) and _fits(results["resume"])
        ok &= _consolidate(work, results["resume"]["sums"])
        if not args.skip_trainer:
            ok &= _trainer(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return _done(ok)


def _done(ok: bool) -> int:
    print("all targets met" if ok else "TARGETS MISSED (see above)")
    return 0 if ok else 1


def _measured(cmd: list, cwd: Path) -> tuple[subprocess.CompletedProcess, float]:
    """Run `cmd` in a shell that reports its own peak RSS (GNU time is not installed here)."""
    probe = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
             "print('PEAK_KIB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
             "sys.exit(r.returncode)")
    proc = subprocess.run([sys.executable, "-c", probe, *cmd], cwd=cwd, env=_env(), capture_output=True, text=True)
    peak = next(int(line.split()[1]) for line in proc.stderr.splitlines() if line.startswith("PEAK_KIB"))
    return proc, peak / (1 << 20)


def _consolidate(work: Path, sums: dict) -> bool:
    import torch
    from safetensors import safe_open

    out = work / "consolidated.safetensors"
    proc, peak = _measured([sys.executable, "-m", "zerotrain", "consolidate", str(work / "final"), str(out)], work)
    if proc.returncode != 0:
        print("consolidate failed:", proc.stdout[-2000:], proc.stderr[-2000:])
        return False
    worst = 0.0
    with safe_open(str(out), framework="pt") as f:
        for name, want in sums.items():
            got = f.get_tensor(name).to(torch.bfloat16).double().sum().item()
            worst = max(worst, abs(got - want))
    print(f"consolidate: peak RSS {peak:.2f} GiB (target < 2), {out.stat().st_size / GIB:.2f} GiB written; "
          f"largest |sum(bf16(consolidated)) - sum(trained)| over the parameters: {worst:.3g}")
    return peak < 2 and worst == 0.0


def _trainer(args, work: Path) -> bool:
    """The model saved as a folder (one process, whole: this part is not measured), then
    `zerotrain train` from it at stage 3 + NVMe."""
    save = ("import sys, torch; sys.path.insert(0, sys.argv[2]);"
            "from zerotrain.trainer.model.build import _build_ours, save_model; from pathlib import Path;"
            "import json; spec = json.loads(sys.argv[3]); torch.manual_seed(0);"
            "m, info = _build_ours({'zerotrain_model': 'gpt', **spec}, 'clm', None, None); m = m.bfloat16();"
            "save_model(Path(sys.argv[1]), m, info, m.state_dict())")
    subprocess.run([sys.executable, "-c", save, str(work / "model"), str(SRC), json.dumps(model_config(args))],
                   check=True, env=_env())
    words = "the quick brown fox jumps over the lazy dog and keeps running far away".split()
    (work / "train.txt").write_text("\n".join(" ".join(words[i % 7:] + words[: i % 7]) * 6 for i in range(64)))
    cfg = ds_config(args, "nvme", args.nvme_path)
    cfg.update(train_batch_size="auto", train_micro_batch_size_per_gpu="auto", optimizer={"type": "AdamW",
               "params": {"lr": "auto", "weight_decay": "auto"}})
    (work / "ds.json").write_text(json.dumps(cfg))
    before = _children_peak_gib()
    proc, peak = _measured([sys.executable, "-m", "zerotrain", "train", "--nproc_per_node", "2",
                            "--model_name_or_path", "model", "--train_file", "train.txt", "--deepspeed", "ds.json",
                            "--output_dir", "out", "--max_steps", str(args.steps), "--block_size", str(args.seq),
                            "--per_device_train_batch_size", "1", "--bf16", "--save_strategy", "no",
                            "--report_to", "none", "--logging_steps", "1"], work)
    print(proc.stdout[-1500:])
    if proc.returncode != 0:
        print("zerotrain train failed:", proc.stderr[-3000:])
        return False
    print(f"trainer from a saved folder: peak RSS of its largest process {peak:.2f} GiB (target <= {RSS_TARGET_GIB}; "
          f"earlier jobs' peak {before:.2f})")
    return peak <= RSS_TARGET_GIB


if __name__ == "__main__":
    sys.exit(main())
