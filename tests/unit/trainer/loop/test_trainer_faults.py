"""The trainer under non-finite steps: a run that keeps skipping stops with one line and a
checkpoint of the last good state, which resumes."""

from __future__ import annotations

import json
import re

import pytest

from zerotrain.errors import NonFiniteStepsError

from trainer_helpers import options, run


def test_consecutive_skips_stop_the_run_and_save_the_last_good_state(tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"max_consecutive_skipped_steps": 3, "train_micro_batch_size_per_gpu": "auto",
                              "gradient_clipping": 0.0}))
    # lr 1e30: the first step is finite and blows the weights up, every later loss is NaN
    values = options(tmp_path, deepspeed=str(ds), learning_rate=1e30, max_grad_norm=0.0, max_steps=10,
                     save_strategy="steps", save_steps=100)
    with pytest.raises(NonFiniteStepsError) as err:
        run(values)
    message = str(err.value)
    assert "\n" not in message
    assert "3 optimizer steps in a row" in message and "after step 1" in message
    folder = tmp_path / "out" / "checkpoint-4"
    assert message.endswith(f"saved that state to {folder}")
    assert (tmp_path / "out" / "latest").read_text().strip() == "checkpoint-4"
    # it resumes (and, the weights being non-finite still, stops again after three more skips)
    with pytest.raises(NonFiniteStepsError, match="step 7: .*saved that state to .*checkpoint-7"):
        run({**values, "resume_from_checkpoint": "latest"})


@pytest.mark.parametrize("written, message", [
    ({"data_parallel_size": 2}, "written by 2 data-parallel ranks and this run has 1; resume with 2 data-parallel ranks"),
    ({"data_parallel_size": None, "world_size": 2}, "written by 2 processes and this run has 1; resume with 2 processes"),
])
def test_resume_with_another_data_parallel_size_is_refused(tmp_path, monkeypatch, written, message):
    # the second row: a checkpoint from before the data-parallel size was recorded names its processes
    from zerotrain.errors import ConfigError
    from zerotrain.trainer.loop.trainer import Trainer

    state = Trainer._state

    def faked(self):
        out = {**state(self), **written}
        return {k: v for k, v in out.items() if v is not None}

    monkeypatch.setattr(Trainer, "_state", faked)
    values = options(tmp_path, max_steps=2, save_strategy="steps", save_steps=2)
    run(values)
    monkeypatch.undo()
    with pytest.raises(ConfigError, match=re.escape(message)):
        run({**values, "resume_from_checkpoint": "latest", "max_steps": 4})
