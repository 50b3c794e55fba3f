"""Config loading: defaults, every key, batch triad (spec §5), error messages."""

import json
import math
import sys

import pytest

from zerotrain.config import (
    OffloadOptimizerConfig,
    OffloadParamConfig,
    ZeroTrainConfig,
    load_config,
    resolve_batch_sizes,
)
from zerotrain.errors import ConfigError

BASE = {"train_batch_size": 8}


def load(extra=None, world_size=1, **kw):
    return load_config({**BASE, **(extra or {})}, world_size=world_size, **kw)


def attr(obj, dotted):
    for part in dotted.split("."):
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    return obj


CURRICULUM = {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": 8, "max_difficulty": 64,
              "schedule_type": "fixed_linear", "schedule_config": {"total_curriculum_step": 10, "difficulty_step": 8}}
METRIC = {"index_to_sample_path": "s", "index_to_metric_path": "m", "difficulty_type": "value",
          "clustering_type": "single_cluster", "min_difficulty": 1, "max_difficulty": 99.5,
          "schedule_type": "fixed_root",
          "schedule_config": {"total_curriculum_step": 5, "difficulty_step": 1, "root_degree": 2}}
DATA_EFF = {  # off at the top: with it on, random-LTD is refused
    "enabled": False, "seed": 7,
    "data_sampling": {
        "enabled": True, "num_epochs": 3, "num_workers": 2, "pin_memory": True,
        "curriculum_learning": {"enabled": True, "data_cluster_path": "/c", "curriculum_metrics": {"seqlen": METRIC}},
        "dynamic_batching": {"enabled": True, "lr_scaling_method": "sqrt", "min_batch_size": 2, "max_batch_size": 9,
                             "sequence_picking_order": "random", "max_tokens": 4096, "verbose": True}},
    "data_routing": {
        "enabled": True,
        "random_ltd": {"enabled": True, "total_layer_num": 24, "random_ltd_layer_num": 22,
                       "random_ltd_layer_id": list(range(1, 23)), "model_mask_name": "attention_mask",
                       "model_type": "decoder", "hidden_state_order": "batch_seq_dim",
                       "random_ltd_schedule": {"min_value": 128, "max_value": 2048, "schedule_type": "fixed_linear",
                                               "schedule_config": {"require_steps": 100, "seq_per_step": 16}},
                       "layer_token_lr_schedule": {"enabled": False, "total_layer_tokens": 10,
                                                   "warmup_type": "linear", "warmup_layer_tokens": 5}}},
}

DEFAULTS = {
    "steps_per_print": None, "wall_clock_breakdown": False, "gradient_clipping": 1.0,
    "prescale_gradients": False, "gradient_predivide_factor": 1.0, "optimizer": None, "scheduler": None,
    "curriculum_learning": None, "progressive_layer_drop": None, "data_efficiency": None,
    "zero_allow_untested_optimizer": False, "zero_force_ds_cpu_optimizer": False,
    "fp16.enabled": False, "fp16.auto_cast": False, "fp16.loss_scale": 0.0, "fp16.initial_scale_power": 16,
    "fp16.loss_scale_window": 1000, "fp16.hysteresis": 2, "fp16.consecutive_hysteresis": False,
    "fp16.min_loss_scale": 1.0, "fp16.fp16_master_weights_and_grads": False,
    "bf16.enabled": False, "bf16.immediate_grad_update": False, "bf16.check_grad_overflow": True,
    "bf16.bf16_master_weights_and_grads": False, "bf16.bf16_optimizer_states": False,
    "zero_optimization.stage": 0, "zero_optimization.contiguous_gradients": True,
    "zero_optimization.overlap_comm": True, "zero_optimization.reduce_bucket_size": 25 * 2**20 // 4,
    "zero_optimization.allgather_bucket_size": 500_000_000, "zero_optimization.reduce_scatter": True,
    "zero_optimization.allgather_partitions": True, "zero_optimization.prefetch_bucket_size": None,
    "zero_optimization.param_persistence_threshold": 100_000,
    "zero_optimization.model_persistence_threshold": sys.maxsize,
    "zero_optimization.max_live_parameters": 1_000_000_000, "zero_optimization.max_reuse_distance": None,
    "zero_optimization.gather_16bit_weights_on_model_save": False, "zero_optimization.sub_group_size": 2**20,
    "zero_optimization.round_robin_gradients": False, "zero_optimization.offload_optimizer": None,
    "zero_optimization.offload_param": None, "zero_optimization.elastic_checkpoint": False,
    "zero_optimization.ignore_unused_parameters": True, "zero_optimization.legacy_stage1": False,
    "zero_optimization.load_from_fp32_weights": True, "zero_optimization.zero_hpz_partition_size": 1,
    "zero_optimization.zero_quantized_weights": False, "zero_optimization.zero_quantized_gradients": False,
    "zero_optimization.mics_shard_size": -1, "zero_optimization.mics_hierarchical_params_gather": False,
    "zero_optimization.zero_quantized_nontrainable_weights": False, "zero_optimization.use_multi_rank_bucket_allreduce": True,
    "zero_optimization.memory_efficient_linear": True, "zero_optimization.pipeline_loading_checkpoint": False,
    "zero_optimization.override_module_apply": True, "zero_optimization.log_trace_cache_warnings": False,
}


@pytest.mark.parametrize("path,expected", DEFAULTS.items(), ids=list(DEFAULTS))
def test_defaults(path, expected):
    assert attr(load(), path) == expected


# (config fragment, attribute path, expected value): one non-default value for every key.
NON_DEFAULT = [
    ({"steps_per_print": 5}, "steps_per_print", 5),
    ({"wall_clock_breakdown": True}, "wall_clock_breakdown", True),
    ({"gradient_clipping": 0}, "gradient_clipping", 0.0),
    ({"prescale_gradients": True}, "prescale_gradients", True),
    ({"gradient_predivide_factor": 2}, "gradient_predivide_factor", 2.0),
    ({"optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95]}}}, "optimizer.params.betas", [0.9, 0.95]),
    ({"optimizer": {"type": "AdamW"}}, "optimizer.type", "AdamW"),
    ({"optimizer": {"type": "AdamW"}}, "optimizer.params", {}),
    ({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 3}}}, "scheduler.params.warmup_num_steps", 3),
    ({"scheduler": {"type": "WarmupLR"}}, "scheduler.type", "WarmupLR"),
    ({"zero_allow_untested_optimizer": True}, "zero_allow_untested_optimizer", True),
    ({"zero_force_ds_cpu_optimizer": True}, "zero_force_ds_cpu_optimizer", True),
    ({"fp16": {"enabled": True}}, "fp16.enabled", True),
    ({"fp16": {"auto_cast": True}}, "fp16.auto_cast", True),
    ({"fp16": {"loss_scale": 128}}, "fp16.loss_scale", 128.0),
    ({"fp16": {"initial_scale_power": 8}}, "fp16.initial_scale_power", 8),
    ({"fp16": {"loss_scale_window": 50}}, "fp16.loss_scale_window", 50),
    ({"fp16": {"hysteresis": 4}}, "fp16.hysteresis", 4),
    ({"fp16": {"consecutive_hysteresis": True}}, "fp16.consecutive_hysteresis", True),
    ({"fp16": {"min_loss_scale": 0.25}}, "fp16.min_loss_scale", 0.25),
    ({"bf16": {"enabled": True}}, "bf16.enabled", True),
    ({"bfloat16": {"enabled": True}}, "bf16.enabled", True),
    ({"bf16": {"immediate_grad_update": True}}, "bf16.immediate_grad_update", True),
    ({"bf16": {"check_grad_overflow": False}}, "bf16.check_grad_overflow", False),
    ({"zero_optimization": {"stage": 2}}, "zero_optimization.stage", 2),
    ({"zero_optimization": {"contiguous_gradients": False}}, "zero_optimization.contiguous_gradients", False),
    ({"zero_optimization": {"overlap_comm": True}}, "zero_optimization.overlap_comm", True),
    ({"zero_optimization": {"reduce_bucket_size": 5e8}}, "zero_optimization.reduce_bucket_size", 500_000_000),
    ({"zero_optimization": {"reduce_bucket_size": 1000}}, "zero_optimization.reduce_bucket_size", 1000),
    ({"zero_optimization": {"allgather_bucket_size": 0}}, "zero_optimization.allgather_bucket_size", 0),
    ({"zero_optimization": {"reduce_scatter": False}}, "zero_optimization.reduce_scatter", False),
    ({"zero_optimization": {"allgather_partitions": False}}, "zero_optimization.allgather_partitions", False),
    ({"zero_optimization": {"prefetch_bucket_size": 7}}, "zero_optimization.prefetch_bucket_size", 7),
    ({"zero_optimization": {"param_persistence_threshold": 7}}, "zero_optimization.param_persistence_threshold", 7),
    ({"zero_optimization": {"model_persistence_threshold": 7}}, "zero_optimization.model_persistence_threshold", 7),
    ({"zero_optimization": {"max_live_parameters": 7}}, "zero_optimization.max_live_parameters", 7),
    ({"zero_optimization": {"max_reuse_distance": 7}}, "zero_optimization.max_reuse_distance", 7),
    ({"zero_optimization": {"gather_16bit_weights_on_model_save": True}},
     "zero_optimization.gather_16bit_weights_on_model_save", True),
    ({"zero_optimization": {"sub_group_size": 1e5}}, "zero_optimization.sub_group_size", 100_000),
    ({"zero_optimization": {"sub_group_size": 1e9}}, "zero_optimization.sub_group_size", 2**20),
    ({"zero_optimization": {"sub_group_size": 0}}, "zero_optimization.sub_group_size", 2**20),
    ({"zero_optimization": {"round_robin_gradients": True}}, "zero_optimization.round_robin_gradients", True),
    ({"zero_optimization": {"elastic_checkpoint": True}}, "zero_optimization.elastic_checkpoint", True),
    ({"zero_optimization": {"ignore_unused_parameters": False}}, "zero_optimization.ignore_unused_parameters", False),
    ({"zero_optimization": {"legacy_stage1": True}}, "zero_optimization.legacy_stage1", True),
    ({"zero_optimization": {"zero_hpz_partition_size": 2}}, "zero_optimization.zero_hpz_partition_size", 2),
    ({"zero_optimization": {"use_multi_rank_bucket_allreduce": False}},
     "zero_optimization.use_multi_rank_bucket_allreduce", False),
    ({"zero_optimization": {"memory_efficient_linear": False}}, "zero_optimization.memory_efficient_linear", False),
    ({"zero_optimization": {"pipeline_loading_checkpoint": True}},
     "zero_optimization.pipeline_loading_checkpoint", True),
    ({"zero_optimization": {"override_module_apply": False}}, "zero_optimization.override_module_apply", False),
    ({"zero_optimization": {"log_trace_cache_warnings": True}}, "zero_optimization.log_trace_cache_warnings", True),
    ({"curriculum_learning": {"enabled": False}}, "curriculum_learning.enabled", False),
    ({"curriculum_learning": CURRICULUM}, "curriculum_learning.curriculum_type", "seqlen"),
    ({"curriculum_learning": {**CURRICULUM, "curriculum_type": "vocab"}}, "curriculum_learning.curriculum_type",
     "vocab"),
    ({"zero_optimization": {"load_from_fp32_weights": False}}, "zero_optimization.load_from_fp32_weights", False),
    ({"dataloader_drop_last": True}, "dataloader_drop_last", True),
    ({"curriculum_learning": CURRICULUM}, "curriculum_learning.min_difficulty", 8),
    ({"curriculum_learning": CURRICULUM}, "curriculum_learning.max_difficulty", 64),
    ({"curriculum_learning": CURRICULUM}, "curriculum_learning.schedule_type", "fixed_linear"),
    ({"curriculum_learning": CURRICULUM}, "curriculum_learning.schedule_config.total_curriculum_step", 10),
    ({"curriculum_learning": CURRICULUM}, "curriculum_learning.schedule_config.difficulty_step", 8),
    ({"curriculum_learning": {**CURRICULUM, "schedule_type": "fixed_root",
                              "schedule_config": {"total_curriculum_step": 10, "difficulty_step": 8, "root_degree": 2}}},
     "curriculum_learning.schedule_config.root_degree", 2),
    ({"curriculum_learning": {**CURRICULUM, "schedule_type": "fixed_discrete",
                              "schedule_config": {"difficulty": [8, 64], "max_step": [5]}}},
     "curriculum_learning.schedule_config.difficulty", [8, 64]),
    ({"curriculum_learning": {**CURRICULUM, "schedule_type": "fixed_discrete",
                              "schedule_config": {"difficulty": [8, 64], "max_step": [5]}}},
     "curriculum_learning.schedule_config.max_step", [5]),
    ({"curriculum_learning": {**CURRICULUM, "schedule_type": "custom", "schedule_config": None}},
     "curriculum_learning.schedule_type", "custom"),
    ({"progressive_layer_drop": {"enabled": True}}, "progressive_layer_drop.theta", 0.5),
    ({"progressive_layer_drop": {"enabled": True}}, "progressive_layer_drop.gamma", 0.001),
    ({"progressive_layer_drop": {"enabled": True, "theta": 0.2, "gamma": 0.01}}, "progressive_layer_drop.theta", 0.2),
    ({"progressive_layer_drop": {"enabled": True, "theta": 0.2, "gamma": 0.01}}, "progressive_layer_drop.gamma", 0.01),
    ({"progressive_layer_drop": {"enabled": True}}, "progressive_layer_drop.enabled", True),
]


@pytest.mark.parametrize("fragment,path,expected", NON_DEFAULT, ids=[c[1] for c in NON_DEFAULT])
def test_non_default_values(fragment, path, expected):
    assert attr(load(fragment), path) == expected


def test_data_efficiency_every_key():
    de = load({"data_efficiency": DATA_EFF}).data_efficiency
    flat_expected = {
        "enabled": False, "seed": 7, "data_sampling.enabled": True, "data_sampling.num_epochs": 3,
        "data_sampling.num_workers": 2, "data_sampling.pin_memory": True,
        "data_sampling.curriculum_learning.enabled": True,
        "data_sampling.curriculum_learning.data_cluster_path": "/c",
        "data_sampling.dynamic_batching.lr_scaling_method": "sqrt",
        "data_sampling.dynamic_batching.min_batch_size": 2, "data_sampling.dynamic_batching.max_batch_size": 9,
        "data_sampling.dynamic_batching.sequence_picking_order": "random",
        "data_sampling.dynamic_batching.max_tokens": 4096, "data_sampling.dynamic_batching.verbose": True,
        "data_routing.enabled": True, "data_routing.random_ltd.total_layer_num": 24,
        "data_routing.random_ltd.random_ltd_layer_num": 22,
        "data_routing.random_ltd.random_ltd_layer_id": list(range(1, 23)),
        "data_routing.random_ltd.model_mask_name": "attention_mask", "data_routing.random_ltd.model_type": "decoder",
        "data_routing.random_ltd.hidden_state_order": "batch_seq_dim",
        "data_routing.random_ltd.random_ltd_schedule.min_value": 128,
        "data_routing.random_ltd.random_ltd_schedule.max_value": 2048,
        "data_routing.random_ltd.random_ltd_schedule.schedule_config.require_steps": 100,
        "data_routing.random_ltd.random_ltd_schedule.schedule_config.seq_per_step": 16,
        "data_routing.random_ltd.layer_token_lr_schedule.total_layer_tokens": 10,
        "data_routing.random_ltd.layer_token_lr_schedule.warmup_type": "linear",
        "data_routing.random_ltd.layer_token_lr_schedule.warmup_layer_tokens": 5,
    }
    for path, expected in flat_expected.items():
        assert attr(de, path) == expected, path
    metric = de.data_sampling.curriculum_learning.curriculum_metrics["seqlen"]
    for key, value in METRIC.items():
        got = getattr(metric, key)
        assert (got.model_dump(exclude_none=True) if key == "schedule_config" else got) == value, key
    assert isinstance(metric.min_difficulty, int) and isinstance(metric.max_difficulty, float)


def test_data_efficiency_defaults():
    de = load({"data_efficiency": {}}).data_efficiency
    assert (de.enabled, de.seed) == (False, 1234)
    ds = de.data_sampling
    assert (ds.enabled, ds.num_epochs, ds.num_workers, ds.pin_memory) == (False, 1000, 0, False)
    assert ds.curriculum_learning.enabled is False and ds.curriculum_learning.curriculum_metrics is None
    db = ds.dynamic_batching
    assert (db.enabled, db.lr_scaling_method, db.min_batch_size, db.max_batch_size,
            db.sequence_picking_order, db.max_tokens, db.verbose) == (False, "linear", 1, None, "dataloader", None, False)
    assert de.data_routing.enabled is False and de.data_routing.random_ltd.enabled is False
    assert de.data_routing.random_ltd.layer_token_lr_schedule.enabled is False


@pytest.mark.parametrize("fragment,match", [
    ({"data_sampling": {"curriculum_learning": {"enabled": True}}},
     r"data_efficiency\.data_sampling\.curriculum_learning\.curriculum_metrics is missing"),
    ({"data_sampling": {"dynamic_batching": {"enabled": True}}},
     r"data_efficiency\.data_sampling\.dynamic_batching\.max_tokens is missing"),
    *[({"data_sampling": {"curriculum_learning": {"enabled": True, "curriculum_metrics": {"m": metric}}}},
       rf"^data_efficiency\.data_sampling\.curriculum_learning\.curriculum_metrics\.m\.{line}$")
      for metric, line in [
          ({}, "difficulty_type is missing: needed when curriculum learning is enabled"),
          ({"difficulty_type": "value"}, "clustering_type is missing: needed when curriculum learning is enabled"),
          ({"difficulty_type": "value", "clustering_type": "single_cluster", "min_difficulty": 1,
            "max_difficulty": 2}, "schedule_type is missing: needed when curriculum learning is enabled"),
          ({"difficulty_type": "value", "clustering_type": "schedule_based", "min_difficulty": 1,
            "max_difficulty": 2, "schedule_type": "custom"},
           "index_to_sample_path is missing: needed by clustering_type schedule_based"),
          ({"difficulty_type": "value", "clustering_type": "schedule_based", "min_difficulty": 1,
            "max_difficulty": 2, "schedule_type": "custom", "index_to_sample_path": "s"},
           "index_to_metric_path is missing: needed by clustering_type schedule_based with difficulty_type value"),
          ({"difficulty_type": "percentile", "max_difficulty": 50.5},
           "max_difficulty: should be an integer percentile with difficulty_type percentile, got 50.5")]],
    ({"data_routing": {"random_ltd": {"layer_token_lr_schedule": {"enabled": True}}}}, r"not implemented"),
    ({"data_routing": {"random_ltd": {"random_ltd_schedule": {"schedule_type": "fixed_root"}}}},
     r"random_ltd_schedule\.schedule_type: should be 'fixed_linear'"),
    ({"data_sampling": {"curriculum_learning": {"enabled": True, "curriculum_metrics": {
        "seqlen": {"difficulty_type": "rank"}}}}}, r"curriculum_metrics\.seqlen\.difficulty_type: should be"),
    ({"data_routing": {"random_ltd": {"random_ltd_schedule": {"schedule_config": {"require_step": 1}}}}},
     r"schedule_config\.require_step: unknown key, did you mean require_steps\?"),
    ({"data_sampling": {"curriculum_learning": {"enabled": True, "curriculum_metrics": {
        "seqlen": {"min_dificulty": 1}}}}},  # named on its own line, with the metric's missing keys
     r"(?m)^  data_efficiency\.data_sampling\.curriculum_learning\.curriculum_metrics\.seqlen\.min_dificulty: "
     r"unknown key, did you mean min_difficulty\?$"),
    ({"data_sampling": {"dynamic_batching": {"enabld": True}}}, r"dynamic_batching\.enabld: unknown key"),
    ({"data_sampling": {"dynamic_batching": {"lr_scaling_method": "cubic"}}},
     r"^data_efficiency\.data_sampling\.dynamic_batching\.lr_scaling_method: should be 'linear', 'sqrt' or 'none'"),
    ({"data_sampling": {"dynamic_batching": {"sequence_picking_order": "length"}}},
     r"dynamic_batching\.sequence_picking_order: should be 'random', 'seqlen' or 'dataloader'"),
    ({"data_sampling": {"dynamic_batching": {"min_batch_size": 5, "max_batch_size": 4}}},
     r"^data_efficiency\.data_sampling\.dynamic_batching\.min_batch_size: 5 is above max_batch_size 4"),
    ({"data_routing": {"enabled": True, "random_ltd": {"enabled": True}}},
     r"^data_efficiency\.data_routing\.random_ltd\.total_layer_num is missing: needed when random-LTD is enabled$"),
    ({"enabled": False, "data_routing": {"enabled": False, "random_ltd": {"enabled": True, "total_layer_num": 2}}},
     r"^data_efficiency\.data_routing\.random_ltd\.random_ltd_layer_num is missing"),  # its own switch, as DeepSpeed
])
def test_data_efficiency_errors(fragment, match):
    fragment = {"enabled": True, **fragment}
    with pytest.raises(ConfigError, match=match):
        load({"data_efficiency": fragment})


# --------------------------------------------------------------------------- batch triad

TRIAD_ROWS = [
    # (TB, MB, GA, world size) -> (TB, MB, GA)
    ((32, 4, 2, 4), (32, 4, 2)),
    ((32, 4, None, 1), (32, 4, 8)),
    ((32, 4, None, 2), (32, 4, 4)),
    ((32, 4, None, 4), (32, 4, 2)),
    ((32, None, 2, 1), (32, 16, 2)),
    ((32, None, 2, 2), (32, 8, 2)),
    ((32, None, 2, 4), (32, 4, 2)),
    ((None, 4, 2, 1), (8, 4, 2)),
    ((None, 4, 2, 2), (16, 4, 2)),
    ((None, 4, 2, 4), (32, 4, 2)),
    ((32, None, None, 1), (32, 32, 1)),
    ((32, None, None, 2), (32, 16, 1)),
    ((32, None, None, 4), (32, 8, 1)),
    ((None, 4, None, 1), (4, 4, 1)),
    ((None, 4, None, 2), (8, 4, 1)),
    ((None, 4, None, 4), (16, 4, 1)),
]


def triad(tb, mb, ga):
    keys = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    return {k: v for k, v in zip(keys, (tb, mb, ga)) if v is not None}


@pytest.mark.parametrize("given,expected", TRIAD_ROWS)
def test_batch_triad_rows(given, expected):
    *values, ws = given
    cfg = load_config(triad(*values), world_size=ws)
    got = (cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps)
    assert got == expected and all(type(v) is int for v in got)


@pytest.mark.parametrize("given,ws,match", [
    ((30, 4, None), 1, r"train_batch_size 30 != train_micro_batch_size_per_gpu 4 x gradient_accumulation_steps 7 "
                       r"x world size 1 = 28"),
    ((30, 4, 1), 2, r"train_batch_size 30 != train_micro_batch_size_per_gpu 4 x gradient_accumulation_steps 1 "
                    r"x world size 2 = 8"),
    ((33, None, None), 4, r"train_batch_size 33 != train_micro_batch_size_per_gpu 8 x gradient_accumulation_steps 1 "
                          r"x world size 4 = 32"),
    ((3, None, None), 4, r"train_micro_batch_size_per_gpu works out to 0 .*train_batch_size 3, world size 4"),
    ((8, 16, None), 1, r"gradient_accumulation_steps works out to 0"),
    ((8, 0, None), 1, r"train_micro_batch_size_per_gpu: should be a positive integer, got 0"),
    ((8, None, 0), 1, r"gradient_accumulation_steps: should be a positive integer, got 0"),
    ((-8, 4, None), 1, r"train_batch_size: should be a positive integer, got -8"),
    ((None, -4, None), 1, r"train_micro_batch_size_per_gpu: should be a positive integer, got -4"),
    ((8, 4, -1), 1, r"gradient_accumulation_steps: should be a positive integer, got -1"),
    ((None, None, 4), 1, r"train_batch_size or train_micro_batch_size_per_gpu is needed"),
    ((None, None, None), 2, r"train_batch_size or train_micro_batch_size_per_gpu is needed"),
])
def test_batch_triad_errors(given, ws, match):
    with pytest.raises(ConfigError, match=match):
        load_config(triad(*given), world_size=ws)


def test_batch_values_type_checked():
    with pytest.raises(ConfigError, match=r"^train_batch_size: should be a number, not true$"):
        load_config({"train_batch_size": True})
    with pytest.raises(ConfigError, match=r"^train_micro_batch_size_per_gpu: should be a whole number, got 2.5$"):
        load_config({"train_micro_batch_size_per_gpu": 2.5})


@pytest.mark.parametrize("ws", [0, -1, 1.5, True])
def test_bad_world_size(ws):
    with pytest.raises(ConfigError, match="world_size should be a positive integer"):
        load_config(BASE, world_size=ws)


def test_resolve_batch_sizes_is_pure():
    assert resolve_batch_sizes(64, 8, None, 4) == (64, 8, 2)


# --------------------------------------------------------------------------- files


def test_reads_json_file(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_batch_size": 16, "fp16": {"enabled": True}}))
    cfg = load_config(path, world_size=2)
    assert cfg.fp16.enabled and cfg.train_micro_batch_size_per_gpu == 8
    assert load_config(str(path)).train_batch_size == 16


def test_bad_json_names_file_line_column(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{\n  "train_batch_size": 8,\n  "fp16": {"enabled": true}}\n  "steps_per_print": 1\n}')
    with pytest.raises(ConfigError, match=r"config\.json:4:3: invalid JSON: Extra data"):
        load_config(path)


def test_hjson_as_deepspeed_reads_it(tmp_path):
    # DeepSpeed reads files with hjson: comments, trailing commas and line breaks between keys
    path = tmp_path / "ds.json"
    path.write_text('{\n  // the batch\n  "train_batch_size": 8,  # per step\n  "fp16": {"enabled": true,},\n'
                    '  /* a block\n     comment */\n  "steps_per_print": 1\n  "zero_optimization": {"stage": 2},\n}')
    cfg = load_config(path)
    assert (cfg.train_batch_size, cfg.fp16.enabled, cfg.steps_per_print, cfg.zero_optimization.stage) == (8, True, 1, 2)
    path.write_text('{"train_batch_size": 8, // one\n "train_batch_size": 16}')
    with pytest.raises(ConfigError, match=r"ds\.json: key 'train_batch_size' appears twice"):
        load_config(path)


def test_json_and_base64_strings():
    import base64

    text = '{"train_batch_size": 4, "fp16": {"enabled": true}}'
    assert load_config(text).train_batch_size == 4
    assert load_config(base64.urlsafe_b64encode(text.encode()).decode()).fp16.enabled


def test_missing_file(tmp_path):
    path = tmp_path / "nope.json"
    with pytest.raises(ConfigError, match=r"nope\.json: config file not found"):
        load_config(path)


def test_top_level_must_be_object(tmp_path):
    path = tmp_path / "list.json"
    path.write_text("[1, 2]")
    with pytest.raises(ConfigError, match=r"list\.json: the top level should be a JSON object, got list"):
        load_config(path)
    with pytest.raises(ConfigError, match="should be a dict or a path"):
        load_config([1, 2])


def test_duplicate_json_key(tmp_path):
    path = tmp_path / "dup.json"
    path.write_text('{"train_batch_size": 8, "train_batch_size": 16}')
    with pytest.raises(ConfigError, match=r"dup\.json: key 'train_batch_size' appears twice"):
        load_config(path)


def test_raw_keeps_original_and_input_untouched():
    given = {"train_batch_size": "auto", "zero_optimization": True}
    cfg = load_config(given, auto_values={"train_batch_size": 4})
    assert cfg.raw == {"train_batch_size": "auto", "zero_optimization": True}
    assert given == {"train_batch_size": "auto", "zero_optimization": True}
    cfg.raw["x"] = 1
    assert "x" not in given


# --------------------------------------------------------------------------- unknown and unsupported keys


@pytest.mark.parametrize("fragment,message", [
    ({"zero_optimization": {"stage3_prefetch_bucket_sise": 1}},
     "zero_optimization.stage3_prefetch_bucket_sise: unknown key, did you mean stage3_prefetch_bucket_size?"),
    ({"gradient_cliping": 1.0}, "gradient_cliping: unknown key, did you mean gradient_clipping?"),
    ({"fp16": {"loss_scale_windw": 10}}, "fp16.loss_scale_windw: unknown key, did you mean loss_scale_window?"),
    ({"zero_optimization": {"offload_optimizer": {"devise": "cpu"}}},
     "zero_optimization.offload_optimizer.devise: unknown key, did you mean device?"),
    ({"zero_optimization": {"offload_param": {"buffer_sise": 3}}},
     "zero_optimization.offload_param.buffer_sise: unknown key, did you mean buffer_size?"),
    ({"curriculum_learning": {**CURRICULUM, "schedule_config": {"total_curiculum_step": 3}}},
     "curriculum_learning.schedule_config.total_curiculum_step: unknown key, did you mean total_curriculum_step?"),
    ({"curriculum_learning": {"enabeld": True}}, "curriculum_learning.enabeld: unknown key, did you mean enabled?"),
    ({"bfloat16": {"enable": True}}, "bfloat16.enable: unknown key, did you mean enabled?"),
    ({"optimizer": {"type": "Adam", "param": {}}}, "optimizer.param: unknown key, did you mean params?"),
    ({"xyzzy": 1}, "xyzzy: unknown key"),
])
def test_unknown_keys(fragment, message):
    with pytest.raises(ConfigError) as info:
        load(fragment)
    assert str(info.value) == message


def test_unknown_key_suggests_alias_and_short_name():
    with pytest.raises(ConfigError, match=r"prefetch_bucket_sise: unknown key, did you mean prefetch_bucket_size\?$"):
        load({"zero_optimization": {"prefetch_bucket_sise": 1}})


@pytest.mark.parametrize("fragment,message", [
    ({"sparse_attention": {"mode": "fixed"}}, "sparse_attention: sparse attention changes the model"),
    ({"tensor_parallel": {"autotp_size": 2, "partition_config": {"layer_specs": []}}},
     "tensor_parallel.partition_config: custom partition rules are not built"),
    ({"tensor_parallel": {"kernel_inject": True}}, "tensor_parallel.replace_with_kernel_inject: kernel injection"),
    ({"compile": {"deepcompile": True}}, "compile: torch.compile of the engine"),
    ({"amp": {"enabled": True}}, "amp: apex AMP is not built"),
    ({"quantize_training": {"enabled": True}}, "quantize_training: quantized training (MoQ) is not built"),
    ({"compression_training": {"weight_quantization": {"shared_parameters": {"enabled": True}}}},
     "compression_training: compression training"),
    ({"data_types": {"keep_in_fp32_modules": ["lm_head"]}}, "data_types.keep_in_fp32_modules: every parameter"),
    ({"communication_data_type": "fp16"}, "communication_data_type: 'fp16': gradients are reduced in the training "
                                          "dtype (fp32); set it to 'fp32' or remove it"),
    ({"sparse_gradients": True}, "sparse_gradients: sparse gradients are not built"),
    ({"fp16": {"fp16_master_weights_and_grads": True}},
     "fp16.fp16_master_weights_and_grads: fp16 master weights are not built: zerotrain keeps fp32 master weights "
     "and gradients; remove it or set it to false"),
    ({"bf16": {"bf16_master_weights_and_grads": True}}, "bf16.bf16_master_weights_and_grads: bf16 master weights"),
    ({"bf16": {"bf16_optimizer_states": True}}, "bf16.bf16_optimizer_states: bf16 optimizer states are not built"),
    ({"zero_optimization": {"zero_quantized_weights": True}}, "zero_optimization.zero_quantized_weights: ZeRO++"),
    ({"zero_optimization": {"zero_quantized_gradients": True}}, "zero_optimization.zero_quantized_gradients: ZeRO++"),
    ({"zero_optimization": {"zero_quantized_nontrainable_weights": True}},
     "zero_optimization.zero_quantized_nontrainable_weights: quantized frozen weights"),
    ({"zero_optimization": {"mics_shard_size": 4}}, "zero_optimization.mics_shard_size: MiCS sharding is not built"),
    ({"zero_optimization": {"stage": 3, "offload_optimizer": {"ratio": 0.3}}},
     "zero_optimization.offload_optimizer.ratio: partial optimizer offload is not built"),
    ({"zero_optimization": {"zenflow": {"topk_ratio": 0.1}}}, "zero_optimization.zenflow: ZenFlow"),
    ({"bf16": {"enabled": True}, "zero_optimization": {"load_from_fp32_weights": False}},
     "zero_optimization.load_from_fp32_weights: rebuilding fp32 masters"),
])
def test_refused_by_name(fragment, message):
    with pytest.raises(ConfigError) as info:
        load(fragment)
    assert str(info.value).startswith(message), str(info.value)


def test_tag_validation_takes_deepspeeds_modes_in_any_case():
    assert load({"checkpoint": {"tag_validation": "warn"}}).checkpoint.tag_validation == "WARN"
    with pytest.raises(ConfigError, match=r"^checkpoint\.tag_validation: should be 'WARN', 'IGNORE' or 'FAIL', "
                                          r"got \"foo\"$"):
        load({"checkpoint": {"tag_validation": "foo"}})


def test_gradient_allreduce_op_reads_mean_or_sum_in_any_case():
    assert load().gradient_allreduce_op == "mean"  # DeepSpeed's default
    assert load({"gradient_allreduce_op": "SUM"}).gradient_allreduce_op == "sum"
    with pytest.raises(ConfigError, match="gradient_allreduce_op: should be 'mean' or 'sum', got \"max\""):
        load({"gradient_allreduce_op": "max"})


@pytest.mark.parametrize("fragment", [
    {"amp": {"enabled": False}}, {"amp": {"enabled": False, "opt_level": "O1"}},
    {"sparse_attention": {"enabled": False}}, {"tensor_parallel": {"enabled": False}},
    {"compile": {"enabled": False}}, {"pipeline": {"enabled": False}},
    {"compression_training": {"weight_quantization": {"shared_parameters": {"enabled": False}}}},
    {"communication_data_type": "fp32"},
    {"activation_checkpointing": {"partition_activations": True}}, {"aio": {"block_size": 1048576}},
    {"monitor_config": {"enabled": True}}, {"comms_logger": {"enabled": True}},
    {"flops_profiler": {"recompute_fwd_factor": 1.0}}, {"cuda_visible_devices": 0}, {"disable_allgather": True},
    {"seq_parallel_communication_data_type": "bf16"}, {"comms_config": {"verbose": False}},
    {"_comment": "why this config"}, {"zero_optimization": {"_note": "x", "contiguous_gradients": False}},
])
def test_accepted_with_no_effect(fragment):
    from zerotrain.config.report import no_effect_keys

    cfg = load(fragment)
    named = no_effect_keys(cfg)
    assert named and all(any(k.startswith(key) for k in named) for key in fragment if key != "zero_optimization")


def test_no_pydantic_noise():
    with pytest.raises(ConfigError) as info:
        load({"fp16": 3})
    assert str(info.value) == "fp16: should be a JSON object, got 3"
    assert "\n" not in str(info.value) and "pydantic" not in str(info.value)
    with pytest.raises(ConfigError, match=r"^optimizer\.type is missing$"):
        load({"optimizer": {"params": {}}})
    with pytest.raises(ConfigError, match=r"^curriculum_learning\.schedule_config\.difficulty\[1\]: should be an integer"):
        load({"curriculum_learning": {"enabled": False, "schedule_config": {"difficulty": [1, "x"]}}})


# --------------------------------------------------------------------------- "auto"


def test_auto_filled_from_dotted_paths():
    cfg = load_config({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
                       "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}},
                      world_size=2, auto_values={"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4,
                                                 "optimizer.params.lr": 3e-4, "unused.key": 1})
    assert (cfg.train_batch_size, cfg.gradient_accumulation_steps, cfg.optimizer.params["lr"]) == (16, 2, 3e-4)


def test_auto_without_value():
    with pytest.raises(ConfigError) as info:
        load_config({"train_batch_size": "auto"})
    assert str(info.value) == ("train_batch_size is 'auto', which only the Trainer fills in (zerotrain train, "
                               "zerotrain.Trainer: from per_device_train_batch_size x gradient_accumulation_steps "
                               "x processes); give a number")
    with pytest.raises(ConfigError, match=r"^optimizer\.params\.lr is 'auto'"):
        load({"optimizer": {"type": "AdamW", "params": {"lr": "auto"}}}, auto_values={"train_batch_size": 1})


def test_auto_value_is_validated():
    with pytest.raises(ConfigError, match=r"^gradient_clipping: should be greater than or equal to 0, got -1$"):
        load({"gradient_clipping": "auto"}, auto_values={"gradient_clipping": -1})


# --------------------------------------------------------------------------- precision


def test_fp16_and_bf16_both_on():
    with pytest.raises(ConfigError, match="fp16.enabled and bf16.enabled are both true"):
        load({"fp16": {"enabled": True}, "bf16": {"enabled": True}})
    with pytest.raises(ConfigError, match="both true"):
        load({"fp16": {"enabled": True}, "bfloat16": {"enabled": True}})


@pytest.mark.parametrize("value", [-1, math.inf, math.nan, True, "abc", None, [1]])
def test_loss_scale_rejected(value):
    with pytest.raises(ConfigError, match=r"^fp16\.loss_scale: should be a"):
        load({"fp16": {"loss_scale": value}})


@pytest.mark.parametrize("value,expected", [(0, 0.0), (1, 1.0), (2.0, 2.0), ("3", 3.0)])
def test_loss_scale_accepted(value, expected):
    assert load({"fp16": {"loss_scale": value}}).fp16.loss_scale == expected


@pytest.mark.parametrize("fp16,match", [
    ({"enabled": True, "loss_scale_window": 0}, r"fp16\.loss_scale_window: must be > 0"),
    ({"enabled": True, "min_loss_scale": 0}, r"fp16\.min_loss_scale: must be > 0"),
    ({"hysteresis": 0}, r"fp16\.hysteresis: should be greater than or equal to 1"),
])
def test_fp16_dynamic_limits(fp16, match):
    with pytest.raises(ConfigError, match=match):
        load({"fp16": fp16})


def test_fp16_dynamic_limits_only_when_used():
    assert load({"fp16": {"enabled": False, "loss_scale_window": 0}}).fp16.loss_scale_window == 0
    assert load({"fp16": {"enabled": True, "loss_scale": 8, "min_loss_scale": 0}}).fp16.min_loss_scale == 0


# --------------------------------------------------------------------------- ZeRO


def test_stage_4_rejected():
    with pytest.raises(ConfigError, match=r"^zero_optimization\.stage: should be less than or equal to 3, got 4$"):
        load({"zero_optimization": {"stage": 4}})
    with pytest.raises(ConfigError, match=r"zero_optimization\.stage: should be greater than or equal to 0"):
        load({"zero_optimization": {"stage": -1}})


@pytest.mark.parametrize("value,stage", [(True, 1), (False, 0)])
def test_zero_bool_form(value, stage):
    assert load({"zero_optimization": value}).zero_optimization.stage == stage


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_overlap_comm_resolution(stage):
    # zerotrain overlaps at every stage unless told not to (DeepSpeed: stage 3 only)
    zero = load({"zero_optimization": {"stage": stage}}).zero_optimization
    assert zero.overlap_comm is True and "overlap_comm" not in zero.given and "overlap_comm" in zero.settled
    for value in (True, False):
        assert load({"zero_optimization": {"stage": stage, "overlap_comm": value}}).zero_optimization.overlap_comm \
            is value


@pytest.mark.parametrize("stage,bucket", [(0, 25 * 2**20 // 4), (1, 25 * 2**20 // 4), (2, 2**21), (3, 2**21)])
def test_bucket_default_is_the_one_in_force(stage, bucket):
    zero = load({"zero_optimization": {"stage": stage}}).zero_optimization
    assert zero.reduce_bucket_size == bucket
    assert load({"zero_optimization": {"stage": stage, "reduce_bucket_size": "auto"}}).zero_optimization \
        .reduce_bucket_size == bucket
    assert load({"zero_optimization": {"stage": stage, "reduce_bucket_size": 1000}}).zero_optimization \
        .reduce_bucket_size == 1000


@pytest.mark.parametrize("json_key,field", [
    ("stage3_prefetch_bucket_size", "prefetch_bucket_size"),
    ("stage3_param_persistence_threshold", "param_persistence_threshold"),
    ("stage3_model_persistence_threshold", "model_persistence_threshold"),
    ("stage3_max_live_parameters", "max_live_parameters"),
    ("stage3_max_reuse_distance", "max_reuse_distance"),
    ("stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save"),
    ("stage3_gather_fp16_weights_on_model_save", "gather_16bit_weights_on_model_save"),
])
def test_stage3_aliases(json_key, field):
    value = True if "gather" in field else 1234
    zero = load({"zero_optimization": {"stage": 3, json_key: value}}).zero_optimization
    assert getattr(zero, field) == value


def test_alias_and_name_together_rejected():
    with pytest.raises(ConfigError, match="prefetch_bucket_size and stage3_prefetch_bucket_size set the same option"):
        load({"zero_optimization": {"prefetch_bucket_size": 1, "stage3_prefetch_bucket_size": 2}})


def test_cpu_offload_legacy():
    zero = load({"zero_optimization": {"stage": 2, "cpu_offload": True}}).zero_optimization
    assert isinstance(zero.offload_optimizer, OffloadOptimizerConfig) and zero.offload_optimizer.device == "cpu"
    assert load({"zero_optimization": {"cpu_offload": False}}).zero_optimization.offload_optimizer is None
    zero = load({"zero_optimization": {"stage": 3, "cpu_offload_param": True}}).zero_optimization
    assert isinstance(zero.offload_param, OffloadParamConfig) and zero.offload_param.device == "cpu"
    with pytest.raises(ConfigError, match=r"^zero_optimization\.cpu_offload is deprecated and conflicts with offload_optimizer"):
        load({"zero_optimization": {"cpu_offload": True, "offload_optimizer": {"device": "cpu"}}})


def test_offload_blocks():
    zero = load({"zero_optimization": {"stage": 3, "offload_optimizer": {}, "offload_param": {}}}).zero_optimization
    opt, par = zero.offload_optimizer, zero.offload_param
    assert (opt.device, opt.nvme_path, opt.buffer_count, opt.pin_memory, opt.pipeline_read, opt.pipeline_write,
            opt.fast_init, opt.ratio) == ("none", None, 4, True, False, False, False, 1.0)
    assert (par.device, par.nvme_path, par.buffer_count, par.buffer_size, par.max_in_cpu, par.pin_memory) == (
        "none", None, 5, 100_000_000, 1_000_000_000, True)
    zero = load({"zero_optimization": {"stage": 3, "offload_optimizer": {
        "device": "nvme", "nvme_path": "/nvme", "buffer_count": 8, "pin_memory": False, "pipeline_read": True,
        "pipeline_write": True, "fast_init": True, "ratio": 1},
        "offload_param": {"device": "nvme", "nvme_path": "/p", "buffer_count": 2, "buffer_size": 1e6,
                          "max_in_cpu": 10, "pin_memory": False}}}).zero_optimization
    opt, par = zero.offload_optimizer, zero.offload_param
    assert (opt.device, opt.nvme_path, opt.buffer_count, opt.pin_memory, opt.pipeline_read, opt.pipeline_write,
            opt.fast_init, opt.ratio) == ("nvme", "/nvme", 8, False, True, True, True, 1.0)
    assert (par.device, par.nvme_path, par.buffer_count, par.buffer_size, par.max_in_cpu, par.pin_memory) == (
        "nvme", "/p", 2, 1_000_000, 10, False)


@pytest.mark.parametrize("zero,match", [
    ({"offload_optimizer": {"device": "nvme"}}, r"offload_optimizer\.nvme_path is missing: device 'nvme'"),
    ({"stage": 3, "offload_param": {"device": "nvme"}}, r"offload_param\.nvme_path is missing"),
    ({"offload_optimizer": {"device": "gpu"}}, r"offload_optimizer\.device: should be 'none', 'cpu' or 'nvme'"),
    ({"stage": 3, "offload_optimizer": {"ratio": 1.5}}, r"offload_optimizer\.ratio: should be less than"),
    ({"reduce_bucket_size": 0}, r"reduce_bucket_size: should be greater than 0, got 0"),
    ({"reduce_bucket_size": 5.5e8 + 0.5}, r"reduce_bucket_size: should be a whole number"),
    ({"allgather_bucket_size": -1}, r"allgather_bucket_size: should be greater than or equal to 0"),
    ({"contiguous_gradients": "maybe"}, r"contiguous_gradients: should be true or false"),
    ({"stage": "two"}, r"stage: should be an integer"),
    ({"ignore_unused_parameters": 3}, r"ignore_unused_parameters: should be true or false"),
    ({"mics_shard_size": "x"}, r"mics_shard_size: should be an integer"),
])
def test_zero_errors(zero, match):
    with pytest.raises(ConfigError, match=r"^zero_optimization\." + match):
        load({"zero_optimization": zero})


# --------------------------------------------------------------------------- curriculum, PLD, scalars


def test_block_without_enabled():
    with pytest.raises(ConfigError) as info:
        load({"curriculum_learning": {"min_difficulty": 8}})
    assert str(info.value) == 'curriculum_learning.enabled is missing: add "enabled": true or false'
    with pytest.raises(ConfigError) as info:
        load({"progressive_layer_drop": {"theta": 0.5}})
    assert str(info.value) == 'progressive_layer_drop.enabled is missing: add "enabled": true or false'


def test_disabled_curriculum_skips_checks():
    cfg = load({"curriculum_learning": {"enabled": False, "schedule_type": "weird", "curriculum_type": "vocab"}})
    assert cfg.curriculum_learning.enabled is False


@pytest.mark.parametrize("change,match", [
    ({"curriculum_type": None}, r"curriculum_learning\.curriculum_type is missing"),
    ({"min_difficulty": None}, r"curriculum_learning\.min_difficulty is missing"),
    ({"max_difficulty": None}, r"curriculum_learning\.max_difficulty is missing"),
    ({"schedule_type": None}, r"curriculum_learning\.schedule_type is missing"),
    ({"schedule_type": "fixed_cubic"}, r"curriculum_learning\.schedule_type: should be one of fixed_linear, "
                                       r"fixed_root, fixed_discrete, custom, got 'fixed_cubic'"),
])
def test_curriculum_enabled_checks(change, match):
    block = {k: v for k, v in {**CURRICULUM, **change}.items() if v is not None}
    with pytest.raises(ConfigError, match=match):
        load({"curriculum_learning": block})


@pytest.mark.parametrize("pld,match", [
    ({"enabled": True, "theta": 1.5}, r"progressive_layer_drop\.theta: should be less than or equal to 1"),
    ({"enabled": True, "theta": -0.1}, r"progressive_layer_drop\.theta: should be greater than or equal to 0"),
    ({"enabled": True, "gamma": -1}, r"progressive_layer_drop\.gamma: should be greater than or equal to 0"),
])
def test_pld_ranges(pld, match):
    with pytest.raises(ConfigError, match=match):
        load({"progressive_layer_drop": pld})


@pytest.mark.parametrize("fragment,match", [
    ({"gradient_clipping": -0.5}, r"^gradient_clipping: should be greater than or equal to 0"),
    ({"gradient_predivide_factor": 0}, r"^gradient_predivide_factor: should be greater than 0"),
    ({"steps_per_print": 0}, r"^steps_per_print: should be greater than or equal to 1"),
    ({"wall_clock_breakdown": "sometimes"}, r"^wall_clock_breakdown: should be true or false"),
    ({"optimizer": {"type": 3}}, r"^optimizer\.type: should be a string, got 3$"),
    ({"scheduler": {"type": "WarmupLR", "params": []}}, r"^scheduler\.params: should be a JSON object"),
])
def test_scalar_errors(fragment, match):
    with pytest.raises(ConfigError, match=match):
        load(fragment)


def test_model_validate_direct_keeps_batch_fields_optional():
    # Without the loader nothing is resolved; the engine must go through load_config.
    cfg = ZeroTrainConfig.model_validate({"train_batch_size": 8})
    assert cfg.train_micro_batch_size_per_gpu is None and cfg.raw == {}


# ---- pieces the loader leans on (found unpinned by harness/mutation.py) -------------------
def test_base64_configs_of_every_padding_and_what_is_not_one(tmp_path):
    import base64

    from zerotrain.config import read_config

    for digits in ("1", "11", "111"):  # 23, 24, 25 bytes: 1, 0 and 2 "=" to add back
        text = base64.urlsafe_b64encode(f'{{"train_batch_size": {digits}}}'.encode()).decode().rstrip("=")
        assert read_config(text) == {"train_batch_size": int(digits)}
    spaced = base64.urlsafe_b64encode(b'  {"train_batch_size": 2}').decode()
    assert read_config(spaced) == {"train_batch_size": 2}  # leading blanks before the object are fine
    not_an_object = base64.urlsafe_b64encode(b"[1, 2]").decode()
    with pytest.raises(ConfigError, match=r": config file not found$"):
        read_config(not_an_object)  # decodes, but to no JSON object: read as a (missing) path


def test_is_off():
    from zerotrain.config.extras import is_off

    assert is_off(None) and is_off({"enabled": False}) and is_off({"a": {"enabled": False}, "b": {"enabled": False}})
    assert not is_off(3) and not is_off({}) and not is_off({"enabled": True}) and not is_off({"enabled": 0})
    assert not is_off({"a": {"enabled": False}, "b": {"enabled": True}})


def test_check_keys_names_the_first_unknown_key_and_skips_comments():
    from zerotrain.config.loader import check_keys

    assert check_keys({"train_batch_size": 8, "_c": {"anything": 1}, "zero_optimization": {"_note": 1}}) is None
    with pytest.raises(ConfigError, match=r"^zero_optimization.stagee: unknown key, did you mean stage\?$"):
        check_keys({"train_batch_size": 8, "zero_optimization": {"stagee": 1}})


def test_stage3_sizes_measured_from_the_model_are_settled_once():
    cfg = load_config({"train_batch_size": 8, "zero_optimization": {"stage": 3}})
    zero = cfg.zero_optimization
    assert zero.prefetch_bucket_size is None and zero.max_reuse_distance is None
    zero.settle_from_model(1234.0, 99)
    assert (zero.prefetch_bucket_size, zero.max_reuse_distance) == (1234, 99)
    assert zero.settled["prefetch_bucket_size"] == "zerotrain default: about two typical modules of this model"
    assert zero.settled["max_reuse_distance"] == "zerotrain default: the prefetch window"
    given = load_config({"train_batch_size": 8, "zero_optimization": {
        "stage": 3, "stage3_prefetch_bucket_size": 10, "stage3_max_reuse_distance": 20}}).zero_optimization
    given.settle_from_model(1234, 99)
    assert (given.prefetch_bucket_size, given.max_reuse_distance) == (10, 20)  # the user's values stand
    assert "prefetch_bucket_size" not in given.settled and "max_reuse_distance" not in given.settled


def test_unreadable_config_strings_are_one_line_each():
    from zerotrain.config import read_config

    for text, message in (
            ('{"a": 1' + "0" * 5000 + "}", "config string: invalid JSON: Exceeds the limit (4300 digits) for integer "
                                          "string conversion"),
            ("{a: " + "[" * 100000 + "}", "config string: invalid JSON: nested too deeply"),
            ("{" + '"a": {' * 100000 + "}", "config string: invalid JSON: nested too deeply")):
        with pytest.raises(ConfigError) as info:
            read_config(text)
        assert str(info.value) == message
    # a string too long to be a file name was an OSError from Path.exists() (found with mutmut's help)
    for text in ("[" * 100000, "A" * 300):
        with pytest.raises(ConfigError, match=r": cannot read config: File name too long$"):
            read_config(text)
    assert read_config("{a: [1, {b: 2}], c: 1.5}") == {"a": [1, {"b": 2}], "c": 1.5}  # hjson, as plain types
    assert type(read_config("{a: [1, {b: 2}]}")["a"][1]) is dict
