"""DeepSpeed's monitor blocks through the engine (Train/Samples/train_loss, lr, loss_scale at
step = samples). W&B twice: a fake module that pins wandb's call shape, and the real package in
offline mode, its run file read back from disk."""

from __future__ import annotations

import csv
import importlib.util

import pytest
import torch

import zerotrain
from zerotrain.errors import ConfigError
from zerotrain.monitor.tensorboard import read_scalars

SGD = {"type": "SGD", "params": {"lr": 0.1}}


def train(config: dict, steps: int = 3):
    torch.manual_seed(0)
    engine, *_ = zerotrain.initialize(model=torch.nn.Linear(3, 1), config={"train_batch_size": 4,
                                                                           "train_micro_batch_size_per_gpu": 2,
                                                                           "optimizer": SGD, **config})
    losses = []
    for _ in range(steps * 2):
        loss = engine(torch.randn(2, 3).to(engine.module.weight.dtype)).float().pow(2).mean()
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return engine, [sum(losses[i:i + 2]) / 2 for i in range(0, len(losses), 2)]


def read_csv(path):
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    return rows[0], [(int(s), float(v)) for s, v in rows[1:]]


def test_the_monitor_blocks_write_deepspeeds_events(tmp_path, fake_wandb):
    fake = fake_wandb
    engine, losses = train({
        "csv_monitor": {"enabled": True, "output_path": str(tmp_path), "job_name": "csvjob"},
        "tensorboard": {"enabled": True, "output_path": str(tmp_path), "job_name": "tbjob"},
        "wandb": {"enabled": True, "team": "t", "group": "g", "project": "p"},
        "fp16": {"enabled": False}})
    steps = [4, 8, 12]  # samples trained so far
    header, rows = read_csv(tmp_path / "csvjob" / "Train_Samples_train_loss.csv")
    assert header == ["step", "Train/Samples/train_loss"]
    assert rows == [(s, pytest.approx(v, rel=1e-6)) for s, v in zip(steps, losses)]
    assert read_csv(tmp_path / "csvjob" / "Train_Samples_lr.csv")[1] == [(s, pytest.approx(0.1)) for s in steps]
    scalars = read_scalars(tmp_path / "tbjob")
    assert [s for s, _ in scalars["Train/Samples/train_loss"]] == steps and "Train/Samples/loss_scale" not in scalars
    assert fake.inits == [{"project": "p", "group": "g", "entity": "t"}]
    assert [s for s, _ in fake.logged] == steps
    assert fake.logged[0][1] == {"Train/Samples/train_loss": pytest.approx(losses[0], rel=1e-6),
                                 "Train/Samples/lr": pytest.approx(0.1)}
    engine.destroy()
    assert fake.finished == 1


def test_the_wandb_block_writes_an_offline_run_with_the_engines_metrics(offline_wandb):
    engine, losses = train({"wandb": {"enabled": True, "project": "zt-offline", "group": "g"},
                            "fp16": {"enabled": False}})
    engine.destroy()  # finishes the run
    recs = offline_wandb.records()
    assert [e.get("exit_code", 0) for e in offline_wandb.of_type(recs, "exit")] == [0]  # finished once
    [run] = offline_wandb.of_type(recs, "run")
    assert (run["project"], run["run_group"]) == ("zt-offline", "g")
    logged = offline_wandb.history(recs)
    assert [s for s, _ in logged] == [4, 8, 12]  # samples trained so far
    for (_, item), loss in zip(logged, losses):
        assert item["Train/Samples/train_loss"] == pytest.approx(loss, rel=1e-6)
        assert item["Train/Samples/lr"] == pytest.approx(0.1) and "Train/Samples/loss_scale" not in item


def test_fp16_adds_the_loss_scale(tmp_path):
    _, _ = train({"csv_monitor": {"enabled": True, "output_path": str(tmp_path), "job_name": "j"},
                  "fp16": {"enabled": True, "initial_scale_power": 4}}, steps=1)
    assert read_csv(tmp_path / "j" / "Train_Samples_loss_scale.csv")[1] == [(4, 16.0)]


def test_a_missing_package_is_one_line_naming_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr("importlib.util.find_spec",
                        lambda name, *a: None if name in ("wandb", "comet_ml") else real(name, *a))
    for block, extra in (("wandb", "wandb"), ("comet", "comet")):
        with pytest.raises(ConfigError) as err:
            train({block: {"enabled": True}}, steps=0)
        assert "pip install zerotrain[" + extra + "]" in str(err.value) and "\n" not in str(err.value)
    train({"wandb": {"enabled": False}, "csv_monitor": {"enabled": False}}, steps=0)  # off: nothing asked
