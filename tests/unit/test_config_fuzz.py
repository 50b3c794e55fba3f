"""Property-based fuzzing of the config loader: whatever a user (or a broken file) feeds it,
the only failure is a ConfigError with a one-line message, never another exception."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zerotrain.config import load_config
from zerotrain.errors import ConfigError

KEYS = ["train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "steps_per_print",
        "gradient_clipping", "fp16", "bf16", "zero_optimization", "optimizer", "scheduler", "enabled", "stage",
        "type", "params", "lr", "loss_scale", "offload_optimizer", "device", "nvme_path", "curriculum_learning",
        "progressive_layer_drop", "theta", "min_difficulty", "schedule_type", "schedule_config", "data_efficiency",
        "token_budget", "train_tokens", "reduce_bucket_size", "stage3_prefetch_bucket_size", "bogus"]

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8), st.sampled_from(["auto", "cpu", "nvme", "Adam"]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.sampled_from(KEYS), inner, max_size=4)),
                      max_leaves=12)
configs = st.dictionaries(st.sampled_from(KEYS), values, max_size=6)


def only_config_errors(config, world_size: int = 1) -> None:
    try:
        load_config(config, world_size=world_size)
    except ConfigError as e:
        message = str(e)
        assert message and "\n" not in message, message


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs, st.integers(1, 4))
def test_any_dict_gives_a_config_or_a_config_error(config, world_size):
    only_config_errors(config, world_size)


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.binary(max_size=200), st.text(max_size=200)))
def test_any_file_gives_a_config_or_a_config_error(tmp_path_factory, content):
    path = tmp_path_factory.mktemp("fuzz") / "ds.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    only_config_errors(str(path))


@settings(max_examples=100, deadline=None)
@given(configs)
def test_json_round_trip_of_any_dict_behaves_the_same(tmp_path_factory, config):
    path = tmp_path_factory.mktemp("fuzz") / "ds.json"
    path.write_text(json.dumps(config, allow_nan=True), encoding="utf-8")
    only_config_errors(str(path))


# Plausible shapes with wrong values: these get past the unknown-key check and reach the
# per-field validation, the batch triad and the cross-block rules.
def block(keys: list[str]):
    return st.dictionaries(st.sampled_from(keys), scalars, max_size=len(keys))


plausible = st.fixed_dictionaries({}, optional={
    "train_batch_size": scalars, "train_micro_batch_size_per_gpu": scalars, "gradient_accumulation_steps": scalars,
    "gradient_clipping": scalars, "steps_per_print": scalars, "prescale_gradients": scalars,
    "fp16": block(["enabled", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
                   "min_loss_scale", "consecutive_hysteresis"]),
    "bf16": block(["enabled", "check_grad_overflow"]),
    "zero_optimization": st.one_of(scalars, st.fixed_dictionaries({}, optional={
        "stage": scalars, "reduce_bucket_size": scalars, "overlap_comm": scalars, "cpu_offload": scalars,
        "stage3_param_persistence_threshold": scalars, "sub_group_size": scalars,
        "offload_optimizer": block(["device", "nvme_path", "pin_memory", "buffer_count", "ratio"]),
        "offload_param": block(["device", "nvme_path", "pin_memory"])})),
    "optimizer": block(["type", "params"]), "scheduler": block(["type", "params"]),
    "curriculum_learning": block(["enabled", "curriculum_type", "min_difficulty", "max_difficulty",
                                  "schedule_type", "schedule_config"]),
    "progressive_layer_drop": block(["enabled", "theta", "gamma"]),
    "token_budget": block(["train_tokens", "lr_decay_tokens", "lr_decay_style", "warmup_steps", "min_lr"]),
})


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plausible, st.integers(1, 4))
def test_plausible_configs_with_wrong_values_give_config_errors(config, world_size):
    only_config_errors(config, world_size)
