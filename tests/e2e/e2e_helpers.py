"""Helpers for the end-to-end tests: `zerotrain` in subprocesses, small data files, run folders."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from zerotrain.trainer.report.metrics_log import read_metrics

WORDS = "def class return import self if else for in while print value data list dict none true".split()


def env(tmp_path: Path) -> dict:
    e = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "ZEROTRAIN_ERROR_DIR")}
    e.update(OMP_NUM_THREADS="1", XDG_CACHE_HOME=str(tmp_path / "xdg"), TOKENIZERS_PARALLELISM="false")
    return e


def zerotrain(tmp_path: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zerotrain", *args], cwd=tmp_path, env=env(tmp_path),
                          capture_output=True, text=True, timeout=timeout)


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    return proc


def text_file(path: Path, n: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    path.write_text("".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 24))) + "\n" for _ in range(n)),
                    encoding="utf-8")
    return path


def metrics(run_dir: Path) -> list[dict]:
    return read_metrics(run_dir)  # skips a line torn by the SIGKILL


def state(run_dir: Path) -> dict:
    return json.loads((run_dir / "trainer_state.json").read_text())


COMMON = ["--cache_dir", "cache", "--disable_tqdm", "--logging_steps", "1", "--per_device_train_batch_size", "4"]


def wait_for_no_process_with(cwd: Path, *argv: str, timeout: float = 10.0) -> bool:
    """True once no process running in `cwd` has `argv` in a row on its command line."""
    def alive() -> bool:
        for proc in Path("/proc").iterdir():
            try:
                args = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
                here = os.readlink(proc / "cwd")
            except OSError:
                continue
            if here == str(cwd) and any(args[i:i + len(argv)] == list(argv) for i in range(len(args))):
                return True
        return False

    deadline = time.time() + timeout
    while alive():
        if time.time() > deadline:
            return False
        time.sleep(0.1)
    return True
