"""A run that says what it does: the banner, Ctrl-C / SIGTERM at a step boundary with the
checkpoint named, a resume at or past max_steps, and the last step's checkpoint."""

from __future__ import annotations

import os
import signal

import pytest
from trainer_helpers import options, run

from zerotrain.errors import TrainingInterrupted
from zerotrain.trainer import TrainerCallback


class SignalAt(TrainerCallback):
    """Sends this process a signal during step `step` (between micro-batches, as a user would)."""

    def __init__(self, step: int, signum: int):
        self.step, self.signum = step, signum

    def on_step_end(self, trainer):
        if trainer.engine.global_steps == self.step:
            os.kill(os.getpid(), self.signum)


def losses(records):
    return [(r["step"], r["loss"]) for r in records if "loss" in r]


def test_ctrl_c_stops_at_the_step_with_a_checkpoint_and_resumes_identically(tmp_path):
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    reference, ref_recs = run(options(tmp_path, output_dir=str(tmp_path / "ref"), max_steps=8))
    with pytest.raises(TrainingInterrupted) as stop:
        run(options(tmp_path, max_steps=8), [SignalAt(3, signal.SIGINT)])
    out = tmp_path / "out"
    # noticed during step 3's callbacks, acted on at the end of step 4, where every rank agrees
    assert stop.value.exit_code == 130 and stop.value.checkpoint == str(out / "checkpoint-4")
    text = str(stop.value)
    assert text.startswith(f"interrupted by SIGINT at step 4 of 8: saved {out}/checkpoint-4; resume with: ")
    assert text.endswith("--resume_from_checkpoint latest") and "\n" not in text
    assert (out / "latest").read_text() == "checkpoint-4"
    _, recs = run(options(tmp_path, max_steps=8, resume_from_checkpoint="latest"))
    assert losses(recs) == losses(ref_recs)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers  # given back


def test_sigterm_without_save_on_interrupt_names_the_last_checkpoint(tmp_path):
    with pytest.raises(TrainingInterrupted) as stop:
        run(options(tmp_path, max_steps=8, save_strategy="steps", save_steps=2, save_on_interrupt=False),
            [SignalAt(4, signal.SIGTERM)])
    assert stop.value.exit_code == 143
    assert f"at step 5 of 8: the last checkpoint is {tmp_path / 'out'}/checkpoint-4; resume with" in str(stop.value)
    assert sorted(p.name for p in (tmp_path / "out").glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]


def test_the_last_step_has_a_checkpoint_and_a_finished_run_says_so_when_resumed(tmp_path, capsys):
    run(options(tmp_path, max_steps=5, save_strategy="steps", save_steps=2))
    assert sorted(p.name for p in (tmp_path / "out").glob("checkpoint-*")) == \
        ["checkpoint-2", "checkpoint-4", "checkpoint-5"]
    out = capsys.readouterr().out
    assert "zerotrain: GPT, 0.12M parameters (124,864 trained), task clm" in out
    assert "1 process on 1 node | ZeRO stage 0 | offload: optimizer none, parameters none | fp32" in out
    assert "batch: 4 per process x 1 accumulation x 1 process = 4 per step | 5 steps" in out
    assert "model states per process: estimated 1.91 MiB after a step; measured" in out
    results, _ = run(options(tmp_path, max_steps=5, save_strategy="steps", save_steps=2, resume_from_checkpoint="latest"))
    assert "the checkpoint is at step 5, max_steps is 5: nothing left to train; raise --max_steps" in \
        capsys.readouterr().out
    assert results["global_step"] == 5
