"""Ctrl-C and SIGTERM: every rank stops at the same optimizer step, with a checkpoint to resume.

    signal on any rank ─► noted (not raised) while the loop runs
    next step boundary ─► the per-step all-reduce carries every rank's note
                       ─► all ranks stop together: save checkpoint-<step> (--save_on_interrupt)
                       ─► TrainingInterrupted: one line naming it and the command that resumes,
                          exit code 130 (SIGINT) or 143 (SIGTERM), no traceback

torchrun's agent passes a Ctrl-C on to its ranks as the same signal and gives them 30 s to
exit; a signal while the run is still loading (nothing to save yet) is raised at once. The
step that stops skips its scheduled evaluation and save (the interrupt's checkpoint replaces
the save).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys
import threading

from ...errors import TrainingInterrupted

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# what a rank adds to the step's all-reduce: a SIGTERM anywhere outweighs any count of SIGINTs
_WEIGHT = {signal.SIGINT: 1.0, signal.SIGTERM: 1e6}


class Interrupted(KeyboardInterrupt):
    """A signal that arrived before the loop, when there is nothing to save."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise(signum, frame):
    raise Interrupted(signum)


@contextlib.contextmanager
def raising_on_signals():
    """SIGTERM as well as SIGINT interrupts the loading phase with a Python exception, while the
    block runs (main thread only: signal handlers cannot be set elsewhere)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in _SIGNALS}
    for sig in _SIGNALS:
        signal.signal(sig, _raise)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class StopRequest:
    """Notes SIGINT / SIGTERM while training, for the loop to act on at a step boundary."""

    def __init__(self):
        self.signum = 0

    def _note(self, signum, frame):
        if not self.signum or signum == signal.SIGTERM:
            self.signum = signum

    @contextlib.contextmanager
    def deferred(self):
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {sig: signal.getsignal(sig) for sig in _SIGNALS}
        for sig in _SIGNALS:
            signal.signal(sig, self._note)
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def weight(self) -> float:
        """This rank's share of the step's all-reduced stop value."""
        return _WEIGHT.get(self.signum, 0.0)

    @staticmethod
    def agreed(total: float) -> int:
        """The signal all ranks act on, from the all-reduced stop value (0: none)."""
        return 0 if total == 0 else signal.SIGTERM if total >= _WEIGHT[signal.SIGTERM] else signal.SIGINT


def launch_command() -> list[str]:
    """The command that started this job: our launcher's or torchrun's (this rank's parent,
    whose command line Linux shows), else this process's own."""
    if os.environ.get("TORCHELASTIC_RUN_ID"):
        try:
            parts = open(f"/proc/{os.getppid()}/cmdline", "rb").read().decode().split("\0")
            if parts and parts[-1] == "":
                parts.pop()
            if parts:
                return _readable(parts)
        except OSError:
            pass
    return _readable(list(getattr(sys, "orig_argv", sys.argv)))


def _readable(argv: list[str]) -> list[str]:
    """`python /venv/bin/zerotrain train ...` -> `zerotrain train ...` (what the user typed)."""
    if len(argv) > 1 and os.path.basename(argv[1]) in ("zerotrain", "torchrun") and "python" in os.path.basename(argv[0]):
        return [os.path.basename(argv[1]), *argv[2:]]
    return argv


def resume_command(argv: list[str], resume: bool = True) -> str:
    """`argv` without its resume / overwrite options, plus --resume_from_checkpoint latest
    (resume false: plus --overwrite_output_dir, to start again in the same folder)."""
    out, skip = [], False
    for i, item in enumerate(argv):
        if skip:
            skip = False
            continue
        name = item.split("=", 1)[0]
        if name in ("--resume_from_checkpoint", "--overwrite_output_dir"):
            value_follows = "=" not in item and i + 1 < len(argv) and not argv[i + 1].startswith("--")
            skip = value_follows and (name == "--resume_from_checkpoint" or
                                      argv[i + 1].lower() in ("true", "false", "1", "0", "yes", "no"))
            continue
        out.append(item)
    return shlex.join(out + (["--resume_from_checkpoint", "latest"] if resume else ["--overwrite_output_dir"]))


def interrupted(signum: int, step: int, total: int, checkpoint: str | None, saved_now: bool,
                several_nodes: bool) -> TrainingInterrupted:
    """The one line a stopped run ends with: where it stopped, what to resume from, and how."""
    name = signal.Signals(signum).name
    if checkpoint is None:
        where = "no checkpoint was saved (save_on_interrupt is false); rerun from the start with"
    else:
        where = f"{'saved' if saved_now else 'the last checkpoint is'} {checkpoint}; resume with"
    nodes = " (on every node, each with its own --node_rank)" if several_nodes else ""
    command = resume_command(launch_command(), resume=checkpoint is not None)
    return TrainingInterrupted(f"interrupted by {name} at step {step} of {total}: {where}: {command}{nodes}",
                               signum, checkpoint)
