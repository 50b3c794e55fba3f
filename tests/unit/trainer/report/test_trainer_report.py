"""What a run writes for people to read: metrics.jsonl, TensorBoard events, the report_to
sinks (W&B as a fake module, and the real one offline), the plot."""

from __future__ import annotations

import pytest
from trainer_helpers import options, run

from zerotrain.errors import ConfigError
from zerotrain.trainer.plan import Options
from zerotrain.trainer.preflight import preflight
from zerotrain.monitor.tensorboard import read_scalars


def losses(records):
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def test_metrics_go_to_jsonl_and_tensorboard(tmp_path):
    _, recs = run(options(tmp_path, report_to="tensorboard", eval_strategy="steps", eval_steps=3))
    scalars = read_scalars(tmp_path / "out" / "tensorboard")
    assert [(s, pytest.approx(v)) for s, v in scalars["loss"]] == sorted(losses(recs).items())
    assert [s for s, _ in scalars["eval_loss"]] == [3, 6] and "tokens_per_s" in scalars


def test_plot_command_writes_a_png(tmp_path):
    from zerotrain.cli import main

    run(options(tmp_path, eval_strategy="steps", eval_steps=2))
    assert main(["plot", str(tmp_path / "out")]) == 0
    png = tmp_path / "out" / "plot.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_token_ticks_are_short_enough_not_to_run_together():
    from zerotrain.trainer.report.plot import token_label

    ticks = [0, 500, 2_500, 20_000, 1_000_000, 1_500_000, 2_000_000, 150_000_000, 2_000_000_000]
    assert [token_label(t) for t in ticks] == ["0", "500", "2.5k", "20k", "1.0M", "1.5M", "2.0M", "150M", "2.0B"]
    assert all(len(token_label(t)) <= 5 for t in range(0, 10**10, 7_654_321))


@pytest.mark.parametrize("extra", [{"bf16": True, "gradient_accumulation_steps": 2}, {"lora_rank": 4}])
def test_the_banner_estimate_is_what_a_step_measures_and_says_what_it_covers(tmp_path, capsys, extra):
    """bf16 micro-steps accumulate in an fp32 copy, which the estimate counts; LoRA's frozen base
    is said beside the model states rather than hidden."""
    from trainer_helpers import Capture

    from zerotrain.zero.estimate import human_bytes, total_bytes

    cap = Capture()
    run(options(tmp_path, max_steps=1, **extra), callbacks=[cap])
    out = capsys.readouterr().out
    after_a_step = human_bytes(total_bytes(cap.trainer.engine.memory_breakdown()))
    assert f"model states per process: estimated {after_a_step} after a step" in out
    frozen = sum(p.numel() * p.element_size() for p in cap.trainer.model.parameters() if not p.requires_grad)
    assert ("(trained weights, their gradients, fp32 masters and optimizer state; not activations"
            + (f", nor the {human_bytes(frozen)} of frozen weights)" if frozen else ")")) in out
    assert bool(frozen) is ("lora_rank" in extra)


def test_report_to_takes_several_sinks(tmp_path, fake_wandb):
    fake = fake_wandb
    _, recs = run(options(tmp_path, report_to=["csv", "wandb"], max_steps=3))
    losses = [(r["step"], r["loss"]) for r in recs if "loss" in r]
    rows = (tmp_path / "out" / "csv" / "loss.csv").read_text(encoding="utf-8").split()
    assert rows[0] == "step,loss" and [tuple(map(float, r.split(","))) for r in rows[1:]] == \
        [(s, pytest.approx(v)) for s, v in losses]
    assert [s for s, values in fake.logged if "loss" in values] == [s for s, _ in losses]
    assert fake.inits[0]["dir"] == str(tmp_path / "out") and fake.finished == 1
    with pytest.raises(ConfigError, match=r"^report_to mlflow: the mlflow package is not installed; pip install "
                                          r"zerotrain\[mlflow\]"):
        preflight(Options.parse(options(tmp_path, report_to="mlflow")), 1)
    with pytest.raises(ConfigError, match="did you mean tensorboard"):
        Options.parse(options(tmp_path, report_to="tensorbord"))


def test_report_to_wandb_writes_an_offline_run_under_the_output_dir(tmp_path, offline_wandb, monkeypatch):
    monkeypatch.setenv("WANDB_PROJECT", "zt-trainer")
    monkeypatch.delenv("WANDB_DIR")  # wandb.init gets dir=OUTPUT_DIR from the trainer
    _, metrics = run(options(tmp_path, report_to="wandb", max_steps=3))
    recs = offline_wandb.records(tmp_path / "out")
    assert [e.get("exit_code", 0) for e in offline_wandb.of_type(recs, "exit")] == [0]  # finished once
    [run_record] = offline_wandb.of_type(recs, "run")
    assert run_record["project"] == "zt-trainer" and run_record["display_name"] == "out"
    losses = [(r["step"], r["loss"]) for r in metrics if "loss" in r]
    assert [(s, item["loss"]) for s, item in offline_wandb.history(recs) if "loss" in item] == \
        [(s, pytest.approx(v, rel=1e-6)) for s, v in losses] and len(losses) == 3
