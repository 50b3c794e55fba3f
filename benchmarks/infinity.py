"""ZeRO-Infinity at 1.23B parameters: one GPT on 2 ranks of this machine, parameters and optimizer on NVMe.

    python benchmarks/infinity.py [--nvme-path DIR] [--layers 24] [--steps 3] [--global-batch 2]
        [--dtype bf16] [--resume-dp 1,4] [--floor] [--record FILE] [--skip-cpu] [--skip-trainer]
        [--skip-resume] [--skip-same-resume] [--only-trainer]

The model: zerotrain's GPT, n_embd 2048, 24 layers, 16 heads, vocabulary 8192, 64 positions
(1.23B parameters), built under `zerotrain.zero.Init()`, bf16, AdamW, ZeRO stage 3 with
`offload_param` and `offload_optimizer` on nvme, zerotrain's default prefetch, live and reuse
windows, micro batch 1 x 64 tokens, a global batch of `--global-batch` sequences (2: one per rank
of a 2-rank job; more: accumulated). Sample j of step s is drawn from seed 1000 + s * batch + j
whatever the job's size, so every size trains on the same batches. One job at a time (each takes
most of the machine), a torchrun of 2 processes unless said:

  nvme       3 steps; every rank's peak resident memory (VmHWM) in initialize and in the steps
             (VmHWM reset between them); seconds per step; the swap folders must be gone after
             the normal exit
  cpu        the same with `offload_optimizer: cpu` (and parameters on cpu): the losses of
             `nvme` must equal these to 1e-5 relative. At 24 layers this job holds the fp32 masters
             and moments in RAM, about 10 GiB per rank: more than this machine can give two ranks
             beside anything else, so run the parity at fewer layers (`--layers 8 --skip-resume`)
  kill       nvme again, a checkpoint after step 1, then every rank SIGKILLs itself
  resume     from that checkpoint to step 3: its losses must equal `nvme`'s bit for bit; the
             swap folders the killed job left must be cleared at its start
  train-dpN  with `--floor`, before each resume-dp: `nvme` on N processes, no checkpoint. In bf16
             gradients are reduced in bf16, so N ranks round every update otherwise than 2: its
             losses' distance from `nvme`'s is what the data size alone changes, and its peaks
             what N ranks need to train (1 rank holds the whole gradient partition)
  resume-dpN the killed job's checkpoint resumed on each data-parallel size N of `--resume-dp`
             (1 and 4 processes) to step 3, the global batch kept by gradient accumulation
             (`--global-batch 4` lets 1, 2 and 4 ranks share it): its losses must equal `nvme`'s
             to 1e-5 relative, or to train-dpN's distance where that is larger; every rank's peak
             RSS must stay at most the `nvme` job's largest, or with `--floor` train-dpN's where
             that is larger (one rank holds what two split); the load's own peak is measured
             apart (VmHWM reset before and after it), and what each step leaves resident is
             printed as anonymous memory and mapped file pages
  consolidate  `zerotrain consolidate` of the resumed run's final checkpoint, its peak RSS
             (under 2 GiB is the target) and its output against the trained weights (the bf16
             rounding of each consolidated fp32 master equals the module's weight)
  trainer    the model saved as a folder, then `zerotrain train --model_name_or_path` at stage
             3 + NVMe for 3 steps: the trainer's ranks' peak RSS

Target: peak RSS per rank at most 3 GiB in `nvme`, `resume` and `trainer`; in `resume-dp` at
most `nvme`'s, or its own size's from scratch where that is larger. `--record FILE` writes every
job's figures (per-rank peaks by phase, losses, times) as one JSON (docs/results/infinity/).
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
from common import reset_peak_rss, status_kib  # noqa: E402

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
    return {"train_batch_size": args.global_batch, "train_micro_batch_size_per_gpu": 1, "gradient_clipping": 1.0,
            "bf16": {"enabled": args.dtype == "bf16"}, "zero_optimization": zero,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}}}


# ---- worker: one rank of a torchrun job ------------------------------------------------------

def _peak_kib(since_reset: bool) -> int:
    """VmHWM, then a reset (when `since_reset`) so that the next phase's peak is its own."""
    peak = status_kib("VmHWM")
    if since_reset and not reset_peak_rss():
        raise SystemExit("cannot reset VmHWM (/proc/self/clear_refs): the phases' peaks would mix")
    return peak


def _resident() -> dict:
    """What the process holds now, GiB: anonymous memory (heap, tensors) and mapped file pages
    (a checkpoint read through mmap counts here while its pages are mapped)."""
    return {k: round(status_kib(f) / (1 << 20), 3) for k, f in (("anon", "RssAnon"), ("file", "RssFile"))}


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
    init = {"s": time.perf_counter() - t0, "hwm_kib": _peak_kib(since_reset=True)}
    start, load = 0, None
    if args.load:  # the load's own peak: VmHWM reset before it and after it
        t = time.perf_counter()
        engine.load_checkpoint(args.load)
        load = {"s": time.perf_counter() - t, "hwm_kib": _peak_kib(since_reset=True), "after": _resident()}
        start = engine.global_steps
    if rank == 0:
        print(f"  initialized in {init['s']:.1f} s, VmHWM {init['hwm_kib'] / (1 << 20):.2f} GiB"
              + (f"; loaded in {load['s']:.1f} s, VmHWM {load['hwm_kib'] / (1 << 20):.2f} GiB (now anon "
                 f"{load['after']['anon']:.2f}, file {load['after']['file']:.2f})" if load else ""),
              flush=True)
    accumulate = args.global_batch // world
    losses, times, resident = [], [], []
    for step in range(start, args.steps):
        t = time.perf_counter()
        total = torch.zeros(1)
        for micro in range(accumulate):
            g = torch.Generator().manual_seed(1000 + step * args.global_batch + micro * world + rank)
            x = torch.randint(0, 8192, (1, args.seq), generator=g)
            loss = engine(x, labels=x)
            engine.backward(loss)
            engine.step()
            total += loss.detach().float()
        engine.comm.all_reduce(total)  # a world of one has no process group: the facade's collectives
        losses.append(total.item() / args.global_batch)
        times.append(time.perf_counter() - t)
        resident.append(_resident())
        if rank == 0:
            print(f"  step {step + 1}: loss {losses[-1]:.6f}, {times[-1]:.1f} s, VmHWM {status_kib('VmHWM') / (1 << 20):.2f} GiB"
                  f" (now anon {resident[-1]['anon']:.2f}, file {resident[-1]['file']:.2f})", flush=True)
        if args.save and engine.global_steps == args.save_at:
            engine.save_checkpoint(args.save)
            if args.kill:
                os.kill(os.getpid(), signal.SIGKILL)
    train = {"hwm_kib": _peak_kib(since_reset=False)}
    sums = {}
    if args.sums:  # after VmHWM is read: each weight gathered alone, summed in float64
        for name, p in engine.module.named_parameters():
            with zerotrain.zero.GatheredParameters([p]):
                sums[name] = p.detach().double().sum().item()
        if args.save:
            engine.save_checkpoint(args.save)
    phases = engine.comm.all_gather_object({"init": init["hwm_kib"], "load": load and load["hwm_kib"],
                                            "train": train["hwm_kib"]})  # every rank's peaks, phase by phase
    if rank == 0:
        peaks = [max(v for v in p.values() if v is not None) for p in phases]
        Path(args.out).write_text(json.dumps({"init": init, "load": load, "world": world, "phases": phases,
                                              "peaks_kib": peaks, "hwm_kib": max(peaks), "losses": losses,
                                              "times": times, "resident_after_steps": resident, "sums": sums,
                                              "params": sum(p.numel() for p in engine.module.parameters())}))
    engine.destroy()


# ---- parent ------------------------------------------------------------------------------

def _env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(SRC))


def _freeze_source(work: Path) -> None:
    """Every job runs the source as it was when the run started (edits meanwhile cannot mix)."""
    global SRC
    shutil.copytree(SRC, work / "src", ignore=shutil.ignore_patterns("__pycache__"))
    SRC = work / "src"


def torchrun(args, offload: str, out: Path, nproc: int = 2, **flags) -> tuple[int, float]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
           __file__, "--worker", "--offload", offload, "--out", str(out), "--nvme-path", args.nvme_path,
           "--layers", str(args.layers), "--steps", str(args.steps), "--seq", str(args.seq),
           "--global-batch", str(args.global_batch), "--dtype", args.dtype]
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


def _gib(kib) -> str:
    return "-" if kib is None else f"{kib / (1 << 20):.2f}"


def _line(name: str, r: dict) -> str:
    per = sum(r["times"][1:]) / max(1, len(r["times"]) - 1) if len(r["times"]) > 1 else r["times"][0]
    ranks = "; ".join(f"rank {i}: {_gib(max(v for v in p.values() if v is not None))} (initialize "
                      f"{_gib(p['init'])}, load {_gib(p['load'])}, steps {_gib(p['train'])})"
                      for i, p in enumerate(r["phases"]))
    return (f"{name:<9} {r['params'] / 1e9:6.3f}B, {r['world']} rank(s): init {r['init']['s']:6.1f} s"
            + (f", load {r['load']['s']:.1f} s" if r["load"] else "") + f", {per:6.1f} s/step; "
            f"peak RSS GiB {ranks}; losses {['%.6f' % x for x in r['losses']]}")


def _floor(args, work: Path, nproc: int, train: dict) -> dict | None:
    """What the data size alone changes, no checkpoint involved: `nproc` ranks train the same
    steps from the same initial weights. Gradients are reduced in bf16 (the training dtype), so
    another number of ranks rounds each update otherwise, and the losses after the first
    update move apart by as much as the arithmetic allows."""
    name = f"train-dp{nproc}"
    code, _ = torchrun(args, "nvme", work / f"{name}.json", nproc=nproc)
    if code != 0 or not (work / f"{name}.json").is_file():
        print(f"{name}: the job failed (exit {code})", flush=True)
        return None
    r = json.loads((work / f"{name}.json").read_text())
    r["relative_loss_difference"] = [abs(a - b) / abs(b) for a, b in zip(r["losses"], train["losses"])]
    print(_line(name, r), flush=True)
    print(f"{name}: relative difference from the {train['world']}-rank run's losses, step by step: "
          f"{', '.join('%.2e' % x for x in r['relative_loss_difference'])} (no checkpoint: the arithmetic of "
          f"{nproc} rank(s))", flush=True)
    return r


def _ceiling(train: dict, floor: dict | None) -> int:
    """The peak a resume may reach: the training job's, or the largest rank's of its own size
    trained from scratch where that is larger (a rank of a smaller job holds a larger share)."""
    return max(train["hwm_kib"], floor["hwm_kib"]) if floor else train["hwm_kib"]


def _floors_beside(args, work: Path, sizes: list[int]) -> bool:
    """Train each size from scratch beside a recorded run: a rank of a smaller job holds a larger
    share of the model's states, so its resume is judged against the peak of a job of its own
    size that never stopped, as well as against the training job's."""
    record = json.loads(Path(args.floor_only).read_text())
    jobs, ok = record["jobs"], True
    try:
        for nproc in sizes:
            jobs[f"train-dp{nproc}"] = floor = _floor(args, work, nproc, jobs["nvme"])
            resumed = jobs.get(f"resume-dp{nproc}")
            if not (floor and resumed):
                ok = False
                continue
            under = resumed["hwm_kib"] <= _ceiling(jobs["nvme"], floor)
            print(f"resume-dp{nproc}: largest rank's peak {_gib(resumed['hwm_kib'])} GiB; training peaks: "
                  f"{_gib(jobs['nvme']['hwm_kib'])} GiB ({jobs['nvme']['world']} ranks), {_gib(floor['hwm_kib'])} "
                  f"GiB ({nproc} rank(s), from scratch): {'at most' if under else 'ABOVE'} its size's", flush=True)
            ok &= under
    finally:
        Path(args.floor_only).write_text(json.dumps(record, indent=1) + "\n")
        shutil.rmtree(work, ignore_errors=True)
    return ok


def _resume_dp(args, work: Path, ckpt: Path, nproc: int, train: dict, floor: dict | None) -> tuple[bool, dict | None]:
    """The killed job's checkpoint resumed on `nproc` ranks: its losses against the uninterrupted
    run's (the same batches, summed in another order) and its peaks against that run's."""
    name = f"resume-dp{nproc}"
    code, _ = torchrun(args, "nvme", work / f"{name}.json", nproc=nproc, load=ckpt)
    if code != 0 or not (work / f"{name}.json").is_file():
        print(f"{name}: the job failed (exit {code})", flush=True)
        return False, None
    r = json.loads((work / f"{name}.json").read_text())
    diffs = [abs(a - b) / abs(b) for a, b in zip(r["losses"], train["losses"][1:])]
    # the target: 1e-5, or no further from the 2-rank run than `nproc` ranks that never stopped
    target = max([1e-5] + (floor["relative_loss_difference"][1:] if floor else []))
    under = r["hwm_kib"] <= _ceiling(train, floor)
    r["relative_loss_difference"] = diffs
    print(_line(name, r), flush=True)
    print(f"{name}: relative difference from the uninterrupted {train['world']}-rank losses, step by step: "
          f"{', '.join('%.2e' % x for x in diffs)} (target {target:.2e}); largest rank's peak {_gib(r['hwm_kib'])} "
          f"GiB against the training job's {_gib(train['hwm_kib'])}"
          + (f" and {_gib(floor['hwm_kib'])} of {nproc} rank(s) that never stopped" if floor else "")
          + f" ({'at most the larger' if under else 'ABOVE'})"
          + f"; swap folders now: {_swap_left(args.nvme_path) or 'none'}", flush=True)
    return max(diffs) <= target and under and len(diffs) == len(train["losses"]) - 1, r


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
                   "resume-dp, consolidate or trainer")
    p.add_argument("--skip-same-resume", action="store_true", help="no resume on 2 ranks and no consolidate")
    p.add_argument("--resume-dp", default="1,4", help="data-parallel sizes of resume-dp, comma-separated; '' for none")
    p.add_argument("--global-batch", type=int, default=2, help="sequences a step (a multiple of every job's size)")
    p.add_argument("--record", help="write every job's figures to this JSON file")
    p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16", help="the weights' dtype (fp32: gradients "
                   "reduced in fp32, so another data size rounds only at fp32's level)")
    p.add_argument("--floor-only", metavar="RECORD",
                   help="only the --floor jobs of --resume-dp's sizes, judged against the 2-rank job and the resumes "
                        "in RECORD (a --record file), which gets their figures")
    p.add_argument("--floor", action="store_true", help="before each resume-dp, the same data size trains the same steps "
                   "from scratch (train-dpN): how far that size's own arithmetic moves the losses, and its peaks")
    args = p.parse_args()
    sizes = [int(n) for n in args.resume_dp.split(",") if n.strip()]
    odd = [n for n in [2, *sizes] if args.global_batch % n]
    if odd:
        p.error(f"--global-batch {args.global_batch} is not a multiple of the job size(s) {odd}: pass one that is "
                "(4 for sizes 1, 2 and 4)")
    if args.worker:
        worker(args)
        return 0
    work = Path(tempfile.mkdtemp(prefix="zt-infinity-", dir=args.nvme_path and str(Path(args.nvme_path).parent)))
    _freeze_source(work)
    args.nvme_path = args.nvme_path or str(work / "swap")
    Path(args.nvme_path).mkdir(parents=True, exist_ok=True)
    if args.floor_only:
        return _done(_floors_beside(args, work, sizes))
    ok, results = True, {}
    try:
        if args.only_trainer:
            return _done(_trainer(args, work))
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
        for nproc in sizes:
            if args.floor:
                results[f"train-dp{nproc}"] = _floor(args, work, nproc, results["nvme"])
            fine, results[f"resume-dp{nproc}"] = _resume_dp(args, work, ckpt, nproc, results["nvme"],
                                                             results.get(f"train-dp{nproc}"))
            ok &= fine
        if not args.skip_same_resume:
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
        if args.record:
            Path(args.record).write_text(json.dumps({"args": {k: v for k, v in vars(args).items() if k != "worker"},
                                                     "jobs": results, "targets_met": bool(ok)}, indent=1) + "\n")
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
