"""initialize says what runs, once, on rank 0, with the lines the trainer's banner prints."""

import torch

import zerotrain
from zerotrain.engine import summary
from zerotrain.trainer.report.banner import banner

from engine_helpers import mlp

CONFIG = {"train_batch_size": 8, "gradient_accumulation_steps": 2, "zero_optimization": {"stage": 1},
          "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}},
          "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 5, "warmup_max_lr": 3e-4}},
          "gradient_clipping": 0.5, "comms_logger": {"enabled": True}}


def _messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "zerotrain"]


def test_initialize_logs_the_run_once(zerotrain_log):
    engine, *_ = zerotrain.initialize(model=mlp(), config=CONFIG)
    logged = [m for m in _messages(zerotrain_log) if m.startswith("zerotrain: ")]
    assert len(logged) == 1
    lines = logged[0].splitlines()
    assert lines[0].startswith("zerotrain: Sequential, ") and "trained)" in lines[0]
    assert lines[1] == "  1 process on 1 node | ZeRO stage 1 | offload: optimizer none, parameters none | fp32"
    assert lines[2] == "  batch: 4 per process x 2 accumulation x 1 process = 8 per step"
    assert lines[3] == "  optimizer AdamW (lr 0.0003) | schedule WarmupLR | gradient clipping 0.5"
    assert lines[4] == "  features: none"
    assert lines[5].startswith("  model states per process: estimated ")
    assert lines[6] == "    (trained weights, their gradients, fp32 masters and optimizer state; not activations)"
    assert lines[7].startswith("  config keys accepted with no effect") and lines[7].endswith("comms_logger")
    # the notice is not logged a second time on its own
    assert not any(m.startswith("config keys accepted") for m in _messages(zerotrain_log))


def test_the_trainers_banner_is_the_same_renderer(zerotrain_log):
    with summary.told_elsewhere():
        engine, *_ = zerotrain.initialize(model=mlp(), config=dict(CONFIG, fp16={"enabled": True, "auto_cast": True}))
    messages = _messages(zerotrain_log)
    assert not any(m.startswith("zerotrain: ") for m in messages)  # the caller prints its own
    assert any(m.startswith("config keys accepted") for m in messages)  # named once, by initialize
    text = banner(engine, engine.module, "clm", 7, 1)
    assert text.splitlines()[0].endswith(", task clm")
    assert "= 8 per step | 7 steps" in text and "| fp16" in text and "features: fp16_auto_cast" in text
    assert "no effect" not in text
    assert text == summary.render(engine, task="clm", total_steps=7, nodes=1, notices=False)
    assert torch.float16 == engine.compute_dtype


def test_dynamic_batching_shows_the_configured_lr_not_a_steps_scaled_one(zerotrain_log):
    from zerotrain.schedules.variable_batch import VariableBatchSizeLR

    for keeps_base_lrs in (True, False):  # a schedule with base_lrs, and one the wrapper alone remembers
        engine, *_ = zerotrain.initialize(model=mlp(), config={k: v for k, v in CONFIG.items() if k != "scheduler"})
        constant = torch.optim.lr_scheduler.LambdaLR(engine.optimizer, lambda step: 1.0)
        if not keeps_base_lrs:
            del constant.base_lrs
        engine.lr_scheduler = VariableBatchSizeLR(constant, base_batch_size=2, batch_sizes=[8])
        assert engine.optimizer.param_groups[0]["lr"] == 4 * 3e-4  # this step's size scales it
        assert "  optimizer AdamW (lr 0.0003) | schedule VariableBatchSizeLR" in summary.render(engine, notices=False)
