"""What the trainer logs: "tokens" as one definition everywhere, tokens_per_s over training time
only, and whatever the engine's features report through log_fields."""

from __future__ import annotations

import pytest
from trainer_helpers import Capture, options, run

import zerotrain.features as features
from zerotrain.engine.hooks import EngineFeature
from zerotrain.features.engine_methods import tokens_consumed
from zerotrain.trainer.loop import step as step_module
from zerotrain.trainer.loop import trainer as trainer_module
from zerotrain.monitor.tensorboard import read_scalars
from zerotrain.trainer import TrainerCallback


class Tokens(TrainerCallback):
    """At each optimizer step: the trainer's tokens next to the token budget's."""

    def __init__(self):
        self.pairs = []

    def on_step_end(self, trainer):
        self.pairs.append((trainer.tokens, tokens_consumed(trainer.engine)))


def test_tokens_are_positions_after_the_curriculum_cut_and_the_budget_agrees(tmp_path):
    budget = 700
    ds = {"curriculum_learning": {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": 8,
                                  "max_difficulty": 32, "schedule_type": "fixed_linear",
                                  "schedule_config": {"total_curriculum_step": 6, "difficulty_step": 8}},
          "token_budget": {"train_tokens": budget}}
    seen, capture = Tokens(), Capture()
    results, recs = run(options(tmp_path, line_by_line=True, deepspeed=ds, max_steps=50, report_to="tensorboard",
                                validation_split_percentage=0), [seen, capture])
    assert [a for a, _ in seen.pairs] == [b for _, b in seen.pairs]  # trainer == token budget, every step
    # recount from the samples: a batch is padded to its longest row, then cut at the step's seqlen
    t = capture.trainer
    lengths, order, batch = t.train_dataset["length"], t.sampler.indices(), t.args.per_device_train_batch_size
    total, expected = 0, []
    for k, r in enumerate(recs):
        total += batch * min(max(lengths[i] for i in order[k * batch:(k + 1) * batch]), r["seqlen"])
        expected.append(total)
    assert [r["tokens"] for r in recs] == expected
    assert expected[-2] < budget <= expected[-1] == results["tokens"]  # the budget stopped the run on it
    assert [v for _, v in read_scalars(tmp_path / "out" / "tensorboard")["tokens"]] == expected


class FakeTime:
    """perf_counter for the trainer's clock: 1 s per micro-batch, 1000 s per evaluation and save."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


def test_tokens_per_s_leaves_out_evaluation_and_saving(tmp_path, monkeypatch):
    fake = FakeTime()
    monkeypatch.setattr(step_module, "time", fake)
    real_run, real_eval, real_save = step_module.MicroBatches.run, trainer_module.evaluate, trainer_module.run_folder.rotate

    def slow(seconds, fn):
        def wrapped(*a, **k):
            fake.now += seconds
            return fn(*a, **k)
        return wrapped

    monkeypatch.setattr(step_module.MicroBatches, "run", slow(1.0, real_run))
    monkeypatch.setattr(trainer_module, "evaluate", slow(1000.0, real_eval))
    monkeypatch.setattr(trainer_module.run_folder, "rotate", slow(1000.0, real_save))
    results, recs = run(options(tmp_path, max_steps=6, gradient_accumulation_steps=2, logging_steps=2,
                                eval_strategy="steps", eval_steps=1, save_strategy="steps", save_steps=1))
    train = [r for r in recs if "loss" in r]
    assert len([r for r in recs if "eval_loss" in r]) == 6
    per_step = 2 * 4 * 32  # 2 micro-batches of 4 full blocks of 32 tokens, each 1 s
    assert [r["tokens_per_s"] for r in train] == [per_step // 2] * 3
    assert results["train_time_s"] == 12.0 and results["tokens_per_s"] == per_step // 2


class Reporter(EngineFeature):
    name = "reporter"

    def log_fields(self, engine) -> dict:
        return {"custom_rate": engine.global_steps * 0.5}


def test_whatever_a_feature_reports_is_logged(tmp_path, monkeypatch):
    monkeypatch.setattr(features, "FEATURES", features.FEATURES + (lambda cfg: Reporter(),))
    ds = {"progressive_layer_drop": {"enabled": True, "theta": 0.5, "gamma": 0.1}}
    _, recs = run(options(tmp_path, deepspeed=ds, report_to="tensorboard", validation_split_percentage=0))
    assert [r["custom_rate"] for r in recs] == [r["step"] * 0.5 for r in recs]
    assert 0.5 < recs[-1]["pld_theta"] < recs[0]["pld_theta"] <= 1.0
    scalars = read_scalars(tmp_path / "out" / "tensorboard")
    assert [v for _, v in scalars["custom_rate"]] == pytest.approx([r["custom_rate"] for r in recs])
