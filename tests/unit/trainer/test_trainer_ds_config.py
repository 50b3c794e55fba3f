"""The DeepSpeed config from the options: "auto" and absent keys filled, contradictions refused."""

from __future__ import annotations

import json

import pytest

from zerotrain.config import load_config
from zerotrain.errors import ConfigError
from zerotrain.trainer.args import TrainingArguments
from zerotrain.trainer.ds_config import build_deepspeed_config, check_no_auto_left, fill_schedule


def build(ds, explicit=(), world=2, **options):
    args = TrainingArguments(output_dir="o", deepspeed=ds, **options)
    config, uses = build_deepspeed_config(args, set(explicit) | set(options), world, hidden_size=64, block_size=32)
    return args, config, uses


def test_auto_and_absent_keys_come_from_the_options():
    ds = {"train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto", "gradient_clipping": "auto",
          "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                    "weight_decay": "auto"}},
          "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                            "warmup_num_steps": "auto", "total_num_steps": "auto"}},
          "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                                "stage3_param_persistence_threshold": "auto"},
          "curriculum_learning": {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": 8,
                                  "max_difficulty": "auto", "schedule_type": "fixed_linear",
                                  "schedule_config": {"total_curriculum_step": 4, "difficulty_step": 8}}}
    _, cfg, uses = build(ds, per_device_train_batch_size=3, gradient_accumulation_steps=2, learning_rate=0.01,
                         max_grad_norm=0.5, adam_beta2=0.95, weight_decay=0.1, bf16=True)
    assert uses
    assert (cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"], cfg["train_batch_size"]) \
        == (3, 2, 12)
    assert cfg["gradient_clipping"] == 0.5 and cfg["bf16"]["enabled"] and not cfg["fp16"]["enabled"]
    assert cfg["optimizer"]["params"] == {"lr": 0.01, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}
    assert cfg["scheduler"]["params"]["warmup_max_lr"] == 0.01
    assert cfg["zero_optimization"]["reduce_bucket_size"] == 64 * 64
    assert cfg["zero_optimization"]["stage3_param_persistence_threshold"] == 640
    assert cfg["curriculum_learning"]["max_difficulty"] == 32
    with pytest.raises(ConfigError, match="scheduler.params.warmup_num_steps"):
        check_no_auto_left(cfg)
    fill_schedule(cfg, 5, 100)
    check_no_auto_left(cfg)
    loaded = load_config(cfg, world_size=2)
    assert loaded.zero_optimization.stage == 3 and loaded.scheduler.params["total_num_steps"] == 100


def test_without_a_file_the_options_make_the_whole_config():
    _, cfg, uses = build(None, optim="sgd", learning_rate=0.1, weight_decay=0.01)
    assert not uses
    assert cfg["optimizer"] == {"type": "SGD", "params": {"lr": 0.1, "weight_decay": 0.01}}
    _, cfg, _ = build(None, optim="adam")
    assert cfg["optimizer"]["params"]["adam_w_mode"] is False  # Adam with L2, not AdamW
    load_config(cfg, world_size=2)


def test_contradictions_with_options_the_user_set_are_one_error():
    ds = {"train_micro_batch_size_per_gpu": 4, "gradient_clipping": 2.0,
          "optimizer": {"type": "Adam", "params": {"lr": 0.1}}, "scheduler": {"type": "WarmupLR"}}
    with pytest.raises(ConfigError) as err:
        build(ds, per_device_train_batch_size=8, max_grad_norm=1.5, learning_rate=0.2, optim="adamw",
              lr_scheduler_type="cosine")
    text = str(err.value)
    for part in ("train_micro_batch_size_per_gpu=4 vs --per_device_train_batch_size 8",
                 "gradient_clipping=2.0 vs --max_grad_norm 1.5", "optimizer.params.lr=0.1 vs --learning_rate 0.2",
                 "optimizer.type=Adam vs --optim adamw", "scheduler.type=WarmupLR vs --lr_scheduler_type cosine"):
        assert part in text
    assert "\n" not in text


def test_values_the_user_left_at_defaults_follow_the_config():
    ds = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 3,
          "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "betas": [0.8, 0.9]}}}
    args, cfg, _ = build(ds)
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps, args.learning_rate) == (4, 3, 0.003)
    assert (args.adam_beta1, args.adam_beta2) == (0.8, 0.9)
    assert cfg["train_batch_size"] == 4 * 3 * 2


def test_train_batch_size_must_add_up(tmp_path):
    (tmp_path / "ds.json").write_text(json.dumps({"train_batch_size": 30}), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"train_batch_size=30 vs .* = 16"):
        build(str(tmp_path / "ds.json"), per_device_train_batch_size=8)
    with pytest.raises(ConfigError, match="config file not found"):
        build(str(tmp_path / "none.json"))
