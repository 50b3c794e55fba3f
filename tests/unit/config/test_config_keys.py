"""Every DeepSpeed key in exactly one class (acts / no effect / refused), the page that lists
them (docs/config-keys.md, generated from the schema), and what `zerotrain config` prints."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest

from zerotrain.cli import main
from zerotrain.config import EFFECTS, load_config
from zerotrain.config.report import key_table, no_effect_keys, notice, rows

PAGE = Path(__file__).resolve().parents[3] / "docs" / "config-keys.md"

# DeepSpeed 0.19.8's keys, read from its DeepSpeedConfig (top level: every key it looks up) and
# its pydantic models (zero_optimization, offload_*, fp16, bf16). Each must be a key here.
DEEPSPEED_TOP = """activation_checkpointing aio amp autotuning bf16 bfloat16 checkpoint comet comms_logger
communication_data_type compile compression_training csv_monitor curriculum_learning data_efficiency data_types
dataloader_drop_last datastates_ckpt disable_allgather disable_python_gc dump_state eigenvalue elasticity
expert_parallel flops_profiler fp16 gradient_accumulation_steps gradient_allreduce_op gradient_clipping
gradient_predivide_factor graph_harvesting hybrid_engine log_level managed_gradient_accumulation memory_breakdown
nebula optimizer pipeline prescale_gradients progressive_layer_drop quantize_training scheduler
seq_parallel_communication_data_type sequence_parallel_size sparse_attention sparse_gradients steps_per_print
tensor_parallel tensorboard timers torch_autocast train_batch_size train_micro_batch_size_per_gpu
use_data_before_expert_parallelism vocabulary_size wall_clock_breakdown wandb weight_quantization
zero_allow_untested_optimizer zero_force_ds_cpu_optimizer zero_optimization""".split()
DEEPSPEED_ZERO = """stage contiguous_gradients reduce_scatter reduce_bucket_size use_multi_rank_bucket_allreduce
allgather_partitions allgather_bucket_size overlap_comm compute_grad_norm load_from_fp32_weights elastic_checkpoint
offload_param offload_optimizer zenflow sub_group_size cpu_offload_param cpu_offload_use_pin_memory cpu_offload
stage3_prefetch_bucket_size stage3_param_persistence_threshold stage3_model_persistence_threshold
stage3_max_live_parameters stage3_max_reuse_distance stage3_gather_16bit_weights_on_model_save
stage3_module_granularity_threshold stage3_use_all_reduce_for_fetch_params stage3_allgather_sequential
stage3_gather_fp16_weights_on_model_save ignore_unused_parameters legacy_stage1 round_robin_gradients
parameter_alignment zero_hpz_partition_size zero_quantized_weights zero_quantized_nontrainable_weights
zero_quantized_gradients memory_efficient_linear pipeline_loading_checkpoint override_module_apply
log_trace_cache_warnings enable_sanity_checks save_muon_momentum_buffer_in_memory leaf_module mics_shard_size
mics_hierarchical_params_gather zeropp_loco_param""".split()
DEEPSPEED_BLOCKS = {
    "zero_optimization.offload_optimizer": "device nvme_path buffer_count pin_memory pipeline_read pipeline_write "
                                           "fast_init ratio super_offload cpuadam_cores_perc",
    "zero_optimization.offload_param": "device nvme_path buffer_count buffer_size max_in_cpu pin_memory",
    "fp16": "enabled auto_cast loss_scale initial_scale_power loss_scale_window hysteresis consecutive_hysteresis "
            "min_loss_scale fp16_master_weights_and_grads",
    "bf16": "enabled immediate_grad_update check_grad_overflow bf16_master_weights_and_grads bf16_optimizer_states",
}


def test_every_schema_key_has_one_class():
    table = key_table()
    unclassified = [key for key, effect, _ in table if effect not in EFFECTS]
    assert not unclassified, f"keys without a class: {unclassified}"
    assert len({key for key, _, _ in table}) == len(table)
    assert all(why for _, _, why in table), "every key says what zerotrain does with it"


def test_key_table_shows_a_key_without_a_class_as_such():
    # what makes the test above able to fail: a plain field (no acts/no_effect/refused)
    from zerotrain.config.base import Block, acts

    class Sample(Block):
        inner: Block | None = acts(None, "a block: opened up")
        plain: int = 0

    assert key_table(Sample, "x.") == [("x.plain", "UNCLASSIFIED", "")]


def _accepts(block: str, key: str) -> bool:
    from zerotrain.config.loader import _model_at
    from zerotrain.config.base import spellings

    model = _model_at(tuple(block.split(".")) if block else ())
    return any(key in spellings(name, model) for name in model.model_fields)


@pytest.mark.parametrize("block,keys", [("", DEEPSPEED_TOP), ("zero_optimization", DEEPSPEED_ZERO),
                                        *((b, k.split()) for b, k in DEEPSPEED_BLOCKS.items())])
def test_every_deepspeed_key_is_a_key_here(block, keys):
    missing = [k for k in keys if not _accepts(block, k)]
    assert not missing, f"DeepSpeed keys of {block or 'the top level'} zerotrain does not know: {missing}"


def test_keys_page_is_what_the_generator_writes():
    from zerotrain.config.keys_doc import render

    text, want = PAGE.read_text(encoding="utf-8"), render()
    page, lines = text.splitlines(), want.splitlines()
    differ = next((i for i, (a, b) in enumerate(zip(page, lines)) if a != b), min(len(page), len(lines)))
    assert text == want, (f"docs/config-keys.md differs from the schema at line {differ + 1}: "
                          f"{page[differ] if differ < len(page) else '(end of page)'!r}; write it again with "
                          "`python -m zerotrain.config.keys_doc > docs/config-keys.md`")


def test_keys_page_lists_every_key_with_its_class():
    text = PAGE.read_text(encoding="utf-8")
    wrong = [key for key, effect, why in key_table() if f"| `{key}` | {effect} | {why} |" not in text]
    assert not wrong, f"the keys page is missing, misclasses or gives another reason for: {wrong[:10]}"
    # the reason is zerotrain's own default where it chose one, else the key's description
    assert ("max_consecutive_skipped_steps", "acts", "100 (zerotrain's own key)") in key_table()


def test_typo_next_to_an_accepted_key_is_still_an_error():
    from zerotrain.errors import ConfigError

    for fragment, hint in (({"tensorbord": {}}, "did you mean tensorboard?"),
                           ({"zero_optimization": {"contiguous_gradient": True}}, "did you mean contiguous_gradients?"),
                           ({"zero_optimization": {"reduce_bucket_sise": "auto"}}, "did you mean reduce_bucket_size?"),
                           ({"gradient_cliping": "auto"}, "did you mean gradient_clipping?")):
        with pytest.raises(ConfigError, match="unknown key, " + hint):
            load_config({"train_batch_size": 8, **fragment})


def test_sources_of_the_values_in_force():
    cfg = load_config({"train_batch_size": 8, "_comment": "x",
                       "zero_optimization": {"stage": 2, "stage3_max_live_parameters": 5, "overlap_comm": False,
                                             "contiguous_gradients": True, "stage3_prefetch_bucket_size": "auto"}},
                      world_size=2)
    got = {key: (value, source) for key, value, source in rows(cfg)}
    assert got["train_batch_size"] == ("8", "user")
    assert got["train_micro_batch_size_per_gpu"][0] == "4" and got["train_micro_batch_size_per_gpu"][1].startswith("derived")
    assert got["zero_optimization.overlap_comm"] == ("false", "user")
    assert got["zero_optimization.reduce_bucket_size"] == (str(2**21), "zerotrain default: 8 MB of fp32 at stage 2 "
                                                                       "(DeepSpeed: 5e8)")
    assert got["zero_optimization.max_live_parameters"] == ("5", "user (no effect at stage 2)")
    assert got["zero_optimization.prefetch_bucket_size"][1].startswith("auto -> zerotrain default")
    assert got["zero_optimization.contiguous_gradients"][1].startswith("user, no effect: gradients always live")
    assert got["gradient_clipping"] == ("1.0", "DeepSpeed default")
    assert got["_comment"][1] == "user, no effect: a comment"
    assert no_effect_keys(cfg) == ["_comment", "zero_optimization.max_live_parameters (stage 2)",
                                   "zero_optimization.contiguous_gradients"]


def test_config_command(tmp_path, capsys):
    path = tmp_path / "ds.json"
    path.write_text('{"train_micro_batch_size_per_gpu": "auto", // HF style\n'
                    ' "zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": "auto"},\n'
                    ' "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}, "tensorboard": {"enabled": true},'
                    ' "dump_state": true,}')
    assert main(["config", str(path), "--world_size", "4"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines()[1:] if line.startswith("  ")}
    assert "auto: the trainer fills it from per_device_train_batch_size" in lines["train_micro_batch_size_per_gpu"]
    assert lines["train_batch_size"].split()[1] == "32"  # 8 (the trainer's default) x 4 ranks
    assert "auto -> DeepSpeed default" in lines["zero_optimization.gather_16bit_weights_on_model_save"]
    assert "auto: the trainer fills it from learning_rate" in lines["optimizer.params.lr"]
    assert lines["tensorboard.enabled"].split()[1:] == ["true", "user"]  # the monitor block acts
    assert "zerotrain default: overlap at every stage" in lines["zero_optimization.overlap_comm"]
    assert out.splitlines()[-1].startswith("config keys accepted with no effect")


def test_config_command_lists_refusals_and_exits_2(tmp_path, capsys):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_batch_size": 8, "sparse_attention": {"mode": "fixed"},
                                "zero_optimization": {"stage": 3, "zero_quantized_weights": True}}))
    assert main(["config", str(path)]) == 2
    captured = capsys.readouterr()
    assert "refused: sparse attention changes the model" in captured.out
    assert "zero_optimization.zero_quantized_weights" in captured.out and "refused: ZeRO++" in captured.out
    assert captured.err.strip().startswith("zerotrain: error: zero_optimization.zero_quantized_weights: ")
    path.write_text('{"train_batch_size": 8, "zero_optimization": {"stagee": 3}}')
    assert main(["config", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.strip() == (
        "zerotrain: error: zero_optimization.stagee: unknown key, did you mean stage?")


def test_keys_page_has_no_key_the_schema_lacks():
    import re

    from zerotrain.config import EFFECTS

    row = re.compile(r"^\| `([^`]+)` \| (" + "|".join(map(re.escape, EFFECTS)) + r") \|", re.M)
    listed = {m.group(1) for m in row.finditer(PAGE.read_text(encoding="utf-8"))}
    table = {key for key, _, _ in key_table()}
    assert listed == table  # both ways: a block's keys after another block's are walked too
    assert {"zero_optimization.offload_param.device", "wall_clock_breakdown",
            "data_efficiency.data_sampling.curriculum_learning.curriculum_metrics.<name>.difficulty_type"} <= table


def test_sources_word_for_word():
    raw = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": 1, "_c": 1,
           "zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": "auto"},
           "optimizer": {"type": "AdamW", "params": {"lr": "auto", "eps": 1e-8}},
           "sparse_attention": {"enabled": False}, "tensorboard": {"enabled": True}}
    cfg = load_config(raw, auto_values={"train_micro_batch_size_per_gpu": 2, "optimizer.params.lr": 1e-3})
    got = {key: (value, source) for key, value, source in rows(cfg)}
    assert got["_c"] == ("", "user, no effect: a comment")
    assert got["train_micro_batch_size_per_gpu"] == ("2", "auto: the trainer fills it from per_device_train_batch_size")
    assert got["optimizer.params.lr"] == ("0.001", "auto: the trainer fills it from learning_rate")
    assert got["optimizer.params.eps"] == ("1e-08", "user")
    # refused unless off: the first clause says what is not built
    assert got["sparse_attention"] == ('{"enabled": false}', "user, no effect: sparse attention changes the model "
                                                             "and is not built (DeepSpeed 0.19.8 removed it too)")
    assert got["max_consecutive_skipped_steps"] == ("100", "zerotrain default: 100 (zerotrain's own key)")
    assert got["zero_optimization.prefetch_bucket_size"] == (
        "null", "auto -> zerotrain default: about two typical modules of the model (DeepSpeed: 5e7, a small model "
                "whole), measured at initialize; zerotrain train and zerotrain.Trainer fill 0.9 x the model's hidden "
                "size squared")
    assert got["zero_optimization.max_reuse_distance"] == (
        "null", "zerotrain default: the prefetch window (DeepSpeed: 1e9, a small model whole), measured at initialize")
    assert notice(cfg) == ("config keys accepted with no effect in zerotrain (`zerotrain config FILE` says why): "
                           "_c, sparse_attention")
    assert notice(load_config({"train_batch_size": 8})) is None


def test_keys_page_counts_each_class():
    counts = collections.Counter(cls for _, cls, _ in key_table())
    text = PAGE.read_text(encoding="utf-8")
    assert f"{sum(counts.values())} keys in all" in text
    for cls, n in counts.items():
        assert f"- **{cls}** ({n})" in text, f"the keys page should say {cls} ({n})"
