"""The DeepSpeed config from the options: "auto" and absent keys filled, contradictions refused."""

from __future__ import annotations

import dataclasses
import json

import pytest

from zerotrain.config import load_config
from zerotrain.errors import ConfigError
from zerotrain.trainer.args import TrainingArguments
from zerotrain.trainer.ds_config import build_deepspeed_config, check_no_auto_left, data_parallel_size, fill_schedule


def build(ds, explicit=(), world=2, **options):
    """(the options with what the config adopted, the config, whether its scheduler drives the LR)"""
    args = TrainingArguments(output_dir="o", deepspeed=ds, **options)
    given = dataclasses.asdict(args)
    built = build_deepspeed_config(args, set(explicit) | set(options), world, hidden_size=64, block_size=32)
    assert dataclasses.asdict(args) == given  # the build writes into no option
    return dataclasses.replace(args, **built.adopted), built.config, built.uses_ds_scheduler


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


def test_the_build_returns_what_it_adopts():
    ds = {"train_micro_batch_size_per_gpu": 4, "gradient_clipping": 2.0, "bf16": {"enabled": True},
          "tensor_parallel": {"autotp_size": 2},
          "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "betas": [0.8, 0.9], "eps": 1e-6, "weight_decay": 0.1}}}
    built = build_deepspeed_config(TrainingArguments(output_dir="o", deepspeed=ds), set(), 2, None, None)
    assert built.adopted == {"tensor_parallel_size": 2, "per_device_train_batch_size": 4, "max_grad_norm": 2.0,
                             "bf16": True, "learning_rate": 0.003, "weight_decay": 0.1, "adam_beta1": 0.8,
                             "adam_beta2": 0.9, "adam_epsilon": 1e-6}
    triad = TrainingArguments(output_dir="o", deepspeed={"train_batch_size": 24}, per_device_train_batch_size=4)
    assert build_deepspeed_config(triad, {"per_device_train_batch_size"}, 2, None, None).adopted == \
        {"gradient_accumulation_steps": 3}  # DeepSpeed's triad: the two given imply the third
    assert build_deepspeed_config(TrainingArguments(output_dir="o", learning_rate=0.1), set(), 2, None, None).adopted \
        == {}


def test_train_batch_size_must_add_up(tmp_path):
    (tmp_path / "ds.json").write_text(json.dumps({"train_batch_size": 30}), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"train_batch_size=30 vs .* = 16"):
        build(str(tmp_path / "ds.json"), per_device_train_batch_size=8)
    with pytest.raises(ConfigError, match="config file not found"):
        build(str(tmp_path / "none.json"))


# HF's documented ZeRO-3 config (transformers' DeepSpeed guide), as users copy it
HF_ZERO3 = {
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
             "hysteresis": 2, "min_loss_scale": 1},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                 "warmup_num_steps": "auto"}},
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                          "offload_param": {"device": "cpu", "pin_memory": True}, "overlap_comm": True,
                          "contiguous_gradients": True, "sub_group_size": 1e9, "reduce_bucket_size": "auto",
                          "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto",
                          "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
                          "stage3_gather_16bit_weights_on_model_save": True},
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 2000,
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "wall_clock_breakdown": False,
}


@pytest.mark.parametrize("kind", ["WarmupLR", "WarmupDecayLR"])
def test_hf_zero3_config_with_no_warmup_has_no_warmup(kind):
    import torch

    from zerotrain.schedules import build_scheduler

    ds = json.loads(json.dumps(HF_ZERO3))
    ds["scheduler"]["type"] = kind
    if kind == "WarmupDecayLR":
        ds["scheduler"]["params"]["total_num_steps"] = "auto"
    _, cfg, uses = build(ds, learning_rate=0.01)
    fill_schedule(cfg, 0, 4)  # warmup_steps 0, warmup_ratio 0: no warmup
    check_no_auto_left(cfg)
    loaded = load_config(cfg, world_size=2)
    assert loaded.scheduler.params["warmup_num_steps"] == 0
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    sched = build_scheduler(kind, opt, loaded.scheduler.params)
    lrs = [opt.param_groups[0]["lr"]]
    for _ in range(4):
        sched.step()
        lrs.append(opt.param_groups[0]["lr"])
    expected = [0.01] * 5 if kind == "WarmupLR" else [0.01, 0.0075, 0.005, 0.0025, 0.0]
    assert lrs == pytest.approx(expected, abs=1e-12)


def test_hf_zero3_config_trains_with_the_cli(tmp_path):
    from trainer_helpers import Capture, options, run

    path = tmp_path / "ds_zero3.json"
    path.write_text(json.dumps(HF_ZERO3), encoding="utf-8")
    capture = Capture()
    results, _ = run(options(tmp_path, deepspeed=str(path), max_steps=2), callbacks=[capture])
    zero = capture.trainer.engine.config.zero_optimization
    hidden = 64  # gpt-tiny
    assert results["global_step"] == 2
    assert (zero.reduce_bucket_size, zero.prefetch_bucket_size, zero.param_persistence_threshold) == \
        (hidden * hidden, int(0.9 * hidden * hidden), 10 * hidden)


def test_python_trainer_fills_what_the_cli_fills(tmp_path):
    import torch

    from zerotrain import Trainer, TrainingArguments
    from zerotrain.models import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2))
    data = [{"input_ids": torch.randint(0, 64, (16,))} for _ in range(8)]
    ds = {"zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                                "stage3_param_persistence_threshold": "auto"},
          "curriculum_learning": {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": 8,
                                  "max_difficulty": "auto", "schedule_type": "fixed_linear",
                                  "schedule_config": {"total_curriculum_step": 4, "difficulty_step": 8}},
          "train_micro_batch_size_per_gpu": "auto", "gradient_clipping": "auto"}
    args = TrainingArguments(output_dir=str(tmp_path / "out"), deepspeed=ds, per_device_train_batch_size=2,
                             max_steps=1, report_to="none", disable_tqdm=True, save_strategy="no")
    trainer = Trainer(model, args, data)
    zero = trainer.engine.config.zero_optimization
    assert (zero.reduce_bucket_size, zero.prefetch_bucket_size, zero.param_persistence_threshold) == (1024, 921, 320)
    assert trainer.engine.config.curriculum_learning.max_difficulty == 16
    trainer.engine.destroy()


def test_one_reader_for_both_routes(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text('{"gradient_clipping": 1.0, "gradient_clipping": 2.0}', encoding="utf-8")
    with pytest.raises(ConfigError, match="key 'gradient_clipping' appears twice"):
        build(str(path))
    path.write_text('{\n  // hjson, as DeepSpeed reads it\n  "gradient_clipping": "auto",\n}', encoding="utf-8")
    _, cfg, _ = build(str(path), max_grad_norm=0.5)
    assert cfg["gradient_clipping"] == 0.5


def test_misspelt_auto_key_is_an_unknown_key():
    for ds, message in (({"gradient_cliping": "auto"}, "gradient_cliping: unknown key, did you mean gradient_clipping?"),
                        ({"zero_optimization": {"stage": 2, "reduce_bucket_sise": "auto"}},
                         "zero_optimization.reduce_bucket_sise: unknown key, did you mean reduce_bucket_size?")):
        _, cfg, _ = build(ds)
        fill_schedule(cfg, 0, 10)
        with pytest.raises(ConfigError) as err:
            check_no_auto_left(cfg)
        assert str(err.value) == message


def test_the_batch_counts_data_parallel_ranks_of_pipeline_x_tensor():
    args = TrainingArguments(output_dir="o", pipeline_parallel_size=2, tensor_parallel_size=2)
    assert data_parallel_size(args, set(), 8) == 2
    with pytest.raises(ConfigError) as e:
        data_parallel_size(args, set(), 6)
    assert str(e.value) == ("--pipeline_parallel_size 2 with --tensor_parallel_size 2: the 6 processes are not a "
                            "multiple of 4; launch a multiple of 4 (data parallel x pipeline x tensor)")
    with pytest.raises(ConfigError, match="^--tensor_parallel_size 2: the 3 processes are not a multiple of 2;"):
        data_parallel_size(TrainingArguments(output_dir="o", tensor_parallel_size=2), set(), 3)
