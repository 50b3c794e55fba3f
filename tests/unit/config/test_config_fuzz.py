"""Property-based fuzzing of the config loader: whatever a user (or a broken file) feeds it,
the only failure is a ConfigError with a one-line message, never another exception.
Strategies and checks live in tests/fuzzing.py, shared with harness/fuzz_inputs.py."""

from __future__ import annotations

import json

from fuzzing import config_case, config_file_case, config_file_contents, configs, one_line, plausible, python_configs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(configs, python_configs), st.integers(1, 4))
def test_any_dict_gives_a_config_or_a_config_error(config, world_size):
    err = config_case(config, world_size)
    assert one_line(err), err


@settings(max_examples=200, deadline=None)
@given(config_file_contents)
def test_any_file_gives_a_config_or_a_config_error(tmp_path_factory, content):
    err = config_file_case(tmp_path_factory.mktemp("fuzz") / "ds.json", content)
    assert one_line(err), err


@settings(max_examples=100, deadline=None)
@given(configs)
def test_json_round_trip_of_any_dict_behaves_the_same(tmp_path_factory, config):
    err = config_file_case(tmp_path_factory.mktemp("fuzz") / "ds.json", json.dumps(config, allow_nan=True))
    assert one_line(err), err


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plausible, st.integers(1, 4))
def test_plausible_configs_with_wrong_values_give_config_errors(config, world_size):
    err = config_case(config, world_size)
    assert one_line(err), err
