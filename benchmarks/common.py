"""What the benchmark and harness scripts share: paths, printing, ports, peak memory, quiet
subprocesses, one torchrun job in a framework's venv, and killing a launched job whole.

Scripts in benchmarks/ import it as `common` (their folder is on sys.path when run as a
script); those in harness/ put benchmarks/ on sys.path first. compare_zero.py keeps what only
DeepSpeed's venv needs (`ensure_deepspeed`, `warm_deepspeed`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SRC = REPO / "src"
DS_VENV = HERE / ".ds-venv"  # DeepSpeed's venv, made by compare_zero.ensure_deepspeed()


def say(msg: str) -> None:
    print(msg, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- peak memory (Linux: /proc/self) -------------------------------------------------------

def status_kib(field: str) -> int:
    """A field of /proc/self/status in KiB (VmHWM: the peak resident set, VmRSS: now); -1 if absent."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def reset_peak_rss() -> bool:
    """Writing 5 to clear_refs resets VmHWM to the current RSS."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


# ---- processes -----------------------------------------------------------------------------

def run_quiet(cmd: list, env=None, timeout=None) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], env=env, capture_output=True, text=True, timeout=timeout)


def run_job(cmd: list, env: dict, log: Path, timeout: float) -> int | None:
    """Run a launcher (torchrun) in a session of its own, its output to `log`; its exit code, or
    None when it ran past `timeout` and was killed with every rank below it (a timeout of
    subprocess.run kills only the launcher and leaves the ranks running)."""
    with open(log, "w") as f:
        proc = subprocess.Popen([str(c) for c in cmd], env=env, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        finally:  # timed out, or this script interrupted: no rank outlives it
            if proc.poll() is None:
                kill_job(proc.pid)
                proc.wait()


def venv_env(venv_prefix: Path) -> dict:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env["TORCH_EXTENSIONS_DIR"] = str(venv_prefix / "torch_extensions")  # one per venv
    env["DS_ACCELERATOR"] = "cpu"
    env.pop("RANK", None)
    return env


def describe(src: Path) -> str:
    """The commit the source tree is at, and whether it has uncommitted changes."""
    r = run_quiet(["git", "-C", src, "describe", "--always", "--dirty"])
    where = r.stdout.strip() if r.returncode == 0 else "not a git checkout"
    return f"source {src} (git {where}), copied for this run"


def import_gpt(framework: str):
    """zerotrain's GPT. The DeepSpeed venv has no zerotrain installed: there the model files
    are loaded from src/ under a bare package, without running zerotrain/__init__.py (which
    would import the engine into DeepSpeed's process and count against its memory)."""
    if framework == "deepspeed" and "zerotrain" not in sys.modules:
        pkg = types.ModuleType("zerotrain")
        pkg.__path__ = [str(Path(os.environ.get("COMPARE_ZERO_SRC", SRC)) / "zerotrain")]
        sys.modules["zerotrain"] = pkg
    from zerotrain.models import GPT, GPTConfig
    return GPT, GPTConfig


def launch_worker(python: Path, script: str, nproc: int, framework: str, worker_args: list, log_dir: Path,
                  src: Path, label: str, timeout: int = 1800) -> dict | None:
    """One torchrun job of `script --worker ... --out FILE` in the framework's venv (zerotrain's
    jobs run the `src` snapshot): the JSON it wrote, with wall_s added; None, and the first
    rank's traceback printed, when it failed. compare_zero, compare_tp and compare_pipeline
    launch through it."""
    out = log_dir / f"{label.replace(' ', '-').replace(':', '-')}-{time.monotonic_ns()}.json"
    cmd = [python, "-m", "torch.distributed.run", "--nproc_per_node", nproc, "--master_port", free_port(),
           script, *worker_args, "--out", out]
    env = venv_env(DS_VENV if framework == "deepspeed" else Path(sys.prefix))
    env["COMPARE_ZERO_SRC"] = str(src)
    if framework != "deepspeed":  # ahead of the editable install: every job runs the same snapshot
        env["PYTHONPATH"] = str(src) + os.pathsep + env.get("PYTHONPATH", "")
    start = time.perf_counter()
    r = run_quiet(cmd, env=env, timeout=timeout)
    if r.returncode != 0 or not out.exists():
        text = r.stdout + r.stderr
        at = text.find("Traceback")  # the first rank's own traceback, not torchrun's summary
        lines = text[at:].splitlines()[:40] if at >= 0 else text.strip().splitlines()[-25:]
        tail = "\n".join(lines)
        say(f"  {label}: FAILED (exit {r.returncode}); its output:\n{tail}")
        return None
    res = json.loads(out.read_text())
    res["wall_s"] = time.perf_counter() - start
    return res


# ---- killing a launched job whole (Linux: reads /proc) -------------------------------------
# torchrun starts each rank in a session of its own, so a SIGKILL to the launcher's process
# group misses scripts whose ranks do not die with their launcher; these find every process
# below the launcher and kill each one's group.

def _stat_fields(pid: int | str) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()  # state, ppid, ... (the name may hold spaces)


def descendants(pid: int) -> list[int]:
    """Every process below pid."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                children.setdefault(int(_stat_fields(entry)[1]), []).append(int(entry))
    found, todo = [], list(children.get(pid, []))
    while todo:
        found.append(todo.pop())
        todo += children.get(found[-1], [])
    return found


def alive(pid: int) -> bool:
    """Whether pid runs (a zombie waiting for its reaper does not count)."""
    try:
        return _stat_fields(pid)[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def kill_job(pid: int, timeout: float = 30.0) -> None:
    """SIGKILL the launcher `pid` (a session leader) and everything below it. The launcher
    is stopped first so that it cannot start or reap ranks while they are being found.
    Raises if any process below it is still alive after `timeout`; the caller reaps pid."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGSTOP)
    below = descendants(pid)
    groups = {pid}
    for p in below:
        with contextlib.suppress(ProcessLookupError):
            groups.add(os.getpgid(p))
    for group in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in below):
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {[p for p in below if alive(p)]} of the job survived SIGKILL")
        time.sleep(0.01)
