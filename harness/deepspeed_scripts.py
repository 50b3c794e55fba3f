"""Real DeepSpeed training scripts, written by others, run under zerotrain with one changed import.

    python harness/deepspeed_scripts.py --from DIR [--ref REF] [--only NAME ...]
                                        [--nprocs 1 2] [--timeout S] [--keep]
    python harness/deepspeed_scripts.py            # fetches the files from raw GitHub URLs

DIR is a checkout of microsoft/DeepSpeedExamples or a git directory of one (bare or not), e.g.
what the `fetch` tool gives for github:microsoft/DeepSpeedExamples; the files are read with
`git show REF:path` (REF default: the pinned COMMIT). Without --from each file is downloaded
from raw.githubusercontent.com at COMMIT. Nothing of the scripts enters this repository: they
are written to a temporary folder and run there.

Each script gets exactly these changes, and no others:
  1. the import: `import deepspeed` -> `import zerotrain as deepspeed`, `import deepspeed.X as Y`
     -> `import zerotrain.X as Y`, `from deepspeed[.X] import Y` -> `from zerotrain[.X] import Y`;
  2. its stand-ins, listed in SCRIPTS with the reason for each: data downloads and hub
     downloads replaced by offline data (harness/deepspeed_scripts_standins/: torchvision's
     datasets, transforms and models, which torchvision being absent here forces, and
     zt_offline.py for a `datasets.load_dataset` and an `AutoTokenizer.from_pretrained`), and
     direct CUDA calls and device-memory asserts that a machine without a GPU cannot meet,
     each left as it is where the accelerator is a GPU;
  3. arguments (and, for a script whose config is a file, a copy of that file) that shrink
     steps and sizes, so that it runs on CPU in seconds.
Packages a script imports that this venv lacks (HelloDeepSpeed's fire, loguru, pytz, sh) are
pip-installed into harness/.scripts-deps on first use (git-ignored) and put on PYTHONPATH.

Each script runs through `zerotrain launch --num_gpus N` on 1 and 2 processes (gloo on CPU).
A run passes when it exits 0. Results: harness/deepspeed_scripts_results/<name>.json (the
command, exit code, seconds, first error line, the losses printed, the log's tail) and
results.md (the table).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STANDINS = ROOT / "harness" / "deepspeed_scripts_standins"
DEPS = ROOT / "harness" / ".scripts-deps"
RESULTS = ROOT / "harness" / "deepspeed_scripts_results"
REPO = "microsoft/DeepSpeedExamples"
COMMIT = "83757d9c937daabd1089a08051061706cb73900d"  # master, 2025-02-11
# Imported by the scripts, absent from this venv: HelloDeepSpeed's requirements.txt (sh 1.x
# API) and tensorboard for torch.utils.tensorboard (HelloDeepSpeed, GAN), with their own
# imports; --no-deps so that nothing the venv has is shadowed.
DEPS_PINS = ["fire", "termcolor", "loguru", "pytz", "sh<2", "tensorboard", "tensorboard-data-server",
             "protobuf", "absl-py", "grpcio", "markdown", "werkzeug", "markupsafe"]
CUDA_ONLY = ("the script calls CUDA directly and this machine has none: DeepSpeed's accelerator "
             "call instead (the same device on a GPU machine)")
DEVICE_MEMORY = ("the script asserts that the accelerator's allocated memory falls after offload_states and "
                 "rises after reload_states; without a GPU the accelerator's memory is the host's, where the "
                 "states stay, so the assert runs only where the accelerator is not the CPU (unchanged on a GPU)")

TORCHVISION = ("torchvision (not installed here) -> harness/deepspeed_scripts_standins/vision/torchvision: "
               "{what}; data only, no download")

# name -> the script, the files beside it it imports, its tiny arguments, and its stand-ins:
# (file, exact text, replacement, why). `args` may hold {nprocs}; `config` is (name, json).
SCRIPTS: dict[str, dict] = {
    "hello_bert": {
        "path": "training/HelloDeepSpeed/train_bert_ds.py",
        "args": ["--checkpoint_dir", "ckpt", "--max_seq_length", "32", "--num_layers", "1",
                 "--num_heads", "2", "--ff_dim", "32", "--h_dim", "16", "--batch_size", "2",
                 "--num_iterations", "5", "--checkpoint_every", "100", "--log_every", "1"],
        "edits": [
            ("import deepspeed\n", "import deepspeed\nimport zt_offline\n",
             "makes the offline stand-ins below importable"),
            ('datasets.load_dataset("wikitext",', 'zt_offline.load_dataset("wikitext",',
             "wikitext-2 is downloaded from the hub: 200 generated lines with a 'text' column instead"),
            ("AutoTokenizer.from_pretrained(tokenizer)", "zt_offline.tokenizer(tokenizer)",
             "roberta-base's tokenizer is downloaded from the hub: a word-level tokenizer over the "
             "stand-in's words with RoBERTa's special tokens instead"),
        ],
        "loss": r"Loss: ([0-9.]+)",
    },
    "pipeline_alexnet": {
        "path": "training/pipeline_parallelism/train.py",
        "siblings": ["training/pipeline_parallelism/ds_config.json"],
        "args": ["--deepspeed_config", "ds_tiny.json", "--backend", "gloo", "--steps", "3",
                 "-p", "{nprocs}"],
        "edits": [
            ("torch.cuda.set_device(args.local_rank)",
             "deepspeed.get_accelerator().set_device(args.local_rank)", CUDA_ONLY),
        ],
        "config": ("ds_config.json", "ds_tiny.json",
                   {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2, "steps_per_print": 1}),
        "paths": ["vision"],
        "standins": [TORCHVISION.format(what="CIFAR10 (64 random 32x32 images), the transforms it "
                                             "composes, AlexNet (a small net with AlexNet's "
                                             "features/avgpool/classifier layout)")],
        "loss": None,  # the script prints every 10 steps; the engine's lines are kept
    },
    "cifar10": {
        "path": "training/cifar/cifar10_deepspeed.py",
        # --moe-param-group: the optimizer groups go through moe.utils' split (no experts here)
        "args": ["--epochs", "1", "--log-interval", "2", "--dtype", "fp32", "--stage", "0", "--moe-param-group"],
        "paths": ["vision"],
        "standins": [TORCHVISION.format(what="CIFAR10 (64 random 32x32 images) and the transforms")],
        "loss": r"loss:\s+([0-9.]+)",
    },
    "offload_states": {
        "path": "training/offload_states/offload_states.py",
        "args": ["--hidden_dim", "16", "--dtype", "torch.float32", "--iteration", "2", "--warmup", "0"],
        "edits": [
            ("assert alloc_after_offload < alloc_before_offload,",
             'assert get_accelerator().device_name() == "cpu" or alloc_after_offload < alloc_before_offload,',
             DEVICE_MEMORY),
            ("assert alloc_after_offload < get_accelerator().memory_allocated(",
             'assert get_accelerator().device_name() == "cpu" or alloc_after_offload < '
             'get_accelerator().memory_allocated(', DEVICE_MEMORY),
        ],
        "loss": None,
    },
    "gan": {
        "path": "training/gan/gan_deepspeed_train.py",
        "siblings": ["training/gan/gan_model.py", "training/gan/utils.py",
                     "training/gan/gan_deepspeed_config.json"],
        "args": ["--dataset", "fake", "--deepspeed_config", "ds_tiny.json", "--batchSize", "8",
                 "--imageSize", "64", "--nz", "8", "--ngf", "4", "--ndf", "4", "--workers", "0",
                 "--epochs", "1", "--outf", "out", "--tensorboard_path", "tb"],
        "edits": [
            ("torch.cuda.set_device(args.local_rank)",
             "deepspeed.get_accelerator().set_device(args.local_rank)", CUDA_ONLY),
            ("torch.cuda.synchronize()", "deepspeed.get_accelerator().synchronize()", CUDA_ONLY),
            ('torch.device("cuda", args.local_rank)',
             "torch.device(deepspeed.get_accelerator().device_name(args.local_rank))", CUDA_ONLY),
        ],
        "config": ("gan_deepspeed_config.json", "ds_tiny.json",
                   {"train_batch_size": "{batch}", "steps_per_print": 1}),
        "paths": ["vision"],
        "standins": [TORCHVISION.format(what="FakeData (64 random images) and the transforms")],
        "loss": r"Loss_D: ([0-9.]+)",
    },
}

_IMPORTS = [
    (re.compile(r"^(\s*)import deepspeed(\s*(#.*)?)$", re.M), r"\1import zerotrain as deepspeed\2"),
    (re.compile(r"^(\s*)import deepspeed\.([\w.]+) as ", re.M), r"\1import zerotrain.\2 as "),
    (re.compile(r"^(\s*)from deepspeed(\.[\w.]+)? import ", re.M), r"\1from zerotrain\2 import "),
]


def change_imports(text: str) -> tuple[str, int]:
    """The one change the migration asks for; returns the new text and how many lines changed."""
    total = 0
    for pattern, repl in _IMPORTS:
        text, n = pattern.subn(repl, text)
        total += n
    return text, total


def _reader(source: Path | None, ref: str):
    if source is None:
        def read(path: str) -> bytes:
            url = f"https://raw.githubusercontent.com/{REPO}/{ref}/{path}"
            with urllib.request.urlopen(url, timeout=60) as r:
                return r.read()
        return read, f"https://github.com/{REPO} @ {ref}"
    if (source / ".git").exists() or (source / "HEAD").exists():
        git_dir = source / ".git" if (source / ".git").exists() else source
        commit = subprocess.run(["git", "--git-dir", str(git_dir), "rev-parse", ref], check=True,
                                capture_output=True, text=True).stdout.strip()

        def read(path: str) -> bytes:
            return subprocess.run(["git", "--git-dir", str(git_dir), "show", f"{commit}:{path}"],
                                  check=True, capture_output=True).stdout
        return read, f"{source} @ {commit}"
    return (lambda path: (source / path).read_bytes()), f"{source} (a checkout, commit not known)"


def prepare(name: str, spec: dict, read, into: Path) -> dict:
    """Write the script (changed as the docstring says) and its siblings into `into`."""
    into.mkdir(parents=True, exist_ok=True)
    changes = {"imports": 0, "edits": [], "standins": list(spec.get("standins", []))}
    for path in [spec["path"], *spec.get("siblings", [])]:
        data = read(path)
        if path.endswith(".py"):
            text = data.decode()
            if path == spec["path"]:  # the stand-ins, on the script as published
                for old, new, why in spec.get("edits", []):
                    count = text.count(old)
                    if not count:
                        raise SystemExit(f"{name}: stand-in text {old!r} not in {path}")
                    text = text.replace(old, new)
                    changes["edits"].append({"from": old, "to": new, "times": count, "why": why})
            text, n = change_imports(text)
            changes["imports"] += n
            data = text.encode()
        (into / Path(path).name).write_bytes(data)
    return changes


def _config(spec: dict, into: Path, nprocs: int) -> None:
    if "config" not in spec:
        return
    src, dst, overrides = spec["config"]
    cfg = json.loads((into / src).read_text())
    for k, v in overrides.items():
        # the GAN's batch is a script argument too: keep the file's batch equal to it per process
        cfg[k] = 8 * nprocs if v == "{batch}" else v
    (into / dst).write_text(json.dumps(cfg, indent=1))


_ERROR = re.compile(r"^(?:\[rank\d+\]:\s*)?([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)\b.*)$")


def first_error(log: str) -> str | None:
    """The first exception line a traceback ends with (or the first error-looking line)."""
    for line in log.splitlines():
        m = _ERROR.match(line.rstrip())
        if m and not line.startswith((" ", "\t")):
            return m.group(1)[:300]
    return None


def _deps() -> Path:
    if not any(DEPS.glob("fire-*.dist-info")):
        print(f"installing {' '.join(DEPS_PINS)} into {DEPS} (HelloDeepSpeed's imports)", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(DEPS),
                        *DEPS_PINS],
                       check=True)
    return DEPS


def run_one(name: str, spec: dict, work: Path, nprocs: int, timeout: int, src: Path) -> dict:
    _config(spec, work, nprocs)
    args = [a.replace("{nprocs}", str(nprocs)) for a in spec["args"]]
    launcher = Path(sys.executable).with_name("zerotrain")
    cmd = [str(launcher), "launch", "--num_gpus", str(nprocs), "--master_port", str(29700 + nprocs),
           Path(spec["path"]).name, *args]
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               PYTHONPATH=os.pathsep.join([str(src), str(STANDINS), *(str(STANDINS / p) for p in spec.get("paths", [])),
                                           str(_deps()), str(work)]))
    start = time.time()
    try:
        p = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
        rc, log = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        rc = None
        log = ((e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")) + \
              ((e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or ""))
    seconds = round(time.time() - start, 1)
    log = log.replace(str(work), ".")  # the temporary folder's name says nothing
    losses = [float(x) for x in re.findall(spec["loss"], log)] if spec.get("loss") else []
    # what zerotrain's engine logs every steps_per_print, whatever the script prints
    engine_losses = [float(x) for x in re.findall(r"\[zerotrain\] step=\d+ loss=([0-9.]+)", log)]
    status = "pass" if rc == 0 else ("timeout" if rc is None else "fail")
    return {"nprocs": nprocs, "status": status, "rc": rc, "seconds": seconds,
            "command": " ".join(cmd[1:]).replace(str(launcher), "zerotrain"),
            "first_error": None if rc == 0 else (first_error(log) or "(no error line; see log_tail)"),
            "losses": losses, "engine_losses": engine_losses, "log_tail": log[-4000:]}


def _cell(run: dict) -> str:
    if run["status"] == "pass":
        shown = ", ".join(f"{x:.4g}" for x in (run["losses"] or run["engine_losses"])[:6])
        return f"pass ({run['seconds']} s)" + (f"; losses {shown}" if shown else "")
    err = (run["first_error"] or "").replace("|", "\\|")
    return f"**{run['status']}**: `{err[:160]}`"


def write_table(records: list[dict], into: Path, command: str) -> Path:
    commits = sorted({r["commit"][:12] for r in records}) or [COMMIT[:12]]
    lines = [f"`{command}`: scripts of {REPO} at {', '.join(commits)}; "
             "stand-ins as the script's SCRIPTS lists them.", "",
             "| script | stand-ins | 1 process | 2 processes |", "| --- | --- | --- | --- |"]
    for rec in records:
        whys = [e["why"] for e in rec["changes"]["edits"]]
        kinds = ["imports"] + (["data/hub"] if rec["changes"]["standins"] or any(
            "hub" in w or "offline" in w for w in whys) else []) + (["device"] if CUDA_ONLY in whys or DEVICE_MEMORY in whys else [])
        runs = {r["nprocs"]: r for r in rec["runs"]}
        lines.append(f"| `{rec['path']}` | {', '.join(kinds)} | "
                     f"{_cell(runs[1]) if 1 in runs else '-'} | {_cell(runs[2]) if 2 in runs else '-'} |")
    out = into / "results.md"
    out.write_text("\n".join(lines) + "\n")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--from", dest="source", type=Path, help="DeepSpeedExamples checkout or git directory")
    ap.add_argument("--ref", default=COMMIT, help="commit to read the scripts at (default: the pinned one)")
    ap.add_argument("--only", nargs="*", default=[], help="run only these names: " + ", ".join(SCRIPTS))
    ap.add_argument("--nprocs", nargs="*", type=int, default=[1, 2])
    ap.add_argument("--timeout", type=int, default=300, help="seconds per run")
    ap.add_argument("--zerotrain-src", type=Path, default=ROOT / "src")
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = ap.parse_args(argv)

    read, source = _reader(args.source, args.ref)
    args.results.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="zt-ds-scripts-"))
    records = []
    try:
        for name, spec in SCRIPTS.items():
            if args.only and name not in args.only:
                continue
            rec = {"name": name, "repo": REPO, "path": spec["path"], "commit": args.ref,
                   "source": source, "args": spec["args"], "config_overrides": spec.get("config", [None, None, None])[2]}
            runs = []
            for n in args.nprocs:
                work = tmp / f"{name}-{n}"
                rec["changes"] = prepare(name, spec, read, work)
                run = run_one(name, spec, work, n, args.timeout, args.zerotrain_src.resolve())
                print(f"{name:18s} {n} proc: {run['status']:7s} {run['seconds']:6.1f}s "
                      f"{run['first_error'] or ''} {run['losses'][:4]}", flush=True)
                runs.append(run)
            rec["runs"] = runs
            (args.results / f"{name}.json").write_text(json.dumps(rec, indent=1) + "\n")
            records.append(rec)
        # the table covers every stored result, so a run with --only updates its rows
        stored = [json.loads(p.read_text()) for p in sorted(args.results.glob("*.json"))]
        order = list(SCRIPTS)
        stored.sort(key=lambda r: order.index(r["name"]) if r["name"] in order else len(order))
        shown_cmd = "python harness/deepspeed_scripts.py" + (" --from DIR" if args.source else "")
        print(write_table(stored, args.results, shown_cmd).read_text())
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
