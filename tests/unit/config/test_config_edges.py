"""Config edges that the loader's messages depend on (each found unpinned by
harness/mutation.py): unknown keys inside an "auto" filled with a block, the 60-character
cut of a shown value, batch sizes that work out to 0, base64 configs longer than a file name."""

import base64
import json

import pytest

from zerotrain.config import load_config, read_config, resolve_batch_sizes, tensor_parallel_size
from zerotrain.errors import ConfigError

BASE = {"train_batch_size": 8}


def message(fn) -> str:
    with pytest.raises(ConfigError) as info:
        fn()
    return str(info.value)


def test_unknown_key_inside_an_auto_filled_block_is_named_with_a_suggestion():
    # "auto" is filled after the keys are checked, so pydantic is the one to find these
    assert message(lambda: load_config({**BASE, "zero_optimization": {"stage": 1, "offload_param": "auto"}},
                                       auto_values={"zero_optimization.offload_param": {"devise": "cpu"}})) == \
        "zero_optimization.offload_param.devise: unknown key, did you mean device?"
    metrics = "data_efficiency.data_sampling.curriculum_learning.curriculum_metrics"
    assert message(lambda: load_config(  # through a dict of blocks, keyed by the user's metric name
        {**BASE, "data_efficiency": {"data_sampling": {"curriculum_learning": {"curriculum_metrics": "auto"}}}},
        auto_values={metrics: {"seqlen": {"index_to_sampl_path": "x"}}})) == \
        f"{metrics}.seqlen.index_to_sampl_path: unknown key, did you mean index_to_sample_path?"
    # an unknown key is reported first, and the other problems of the file with it, one line each
    assert message(lambda: load_config({**BASE, "fp16": "auto"},
                                       auto_values={"fp16": {"enabled": "yes please", "loss_scale_windw": 2}})) == \
        "2 problems in the DeepSpeed config:\n  fp16.loss_scale_windw: unknown key, did you mean loss_scale_window?" \
        '\n  fp16.enabled: should be true or false, got "yes please"'


def test_shown_values_are_cut_at_60_characters():
    assert message(lambda: load_config({"train_batch_size": "x" * 58})) == \
        f'train_batch_size: should be an integer, got "{"x" * 58}"'  # 60 with the quotes: whole
    assert message(lambda: load_config({"train_batch_size": "x" * 59})) == \
        f'train_batch_size: should be an integer, got "{"x" * 56}...'  # 61: 57 and "..."
    assert message(lambda: load_config({"train_batch_size": {1, 2}})) == \
        "train_batch_size: should be an integer, got {1, 2}"  # not JSON: its repr


def test_batch_sizes_that_work_out_to_zero_name_the_one_to_set():
    assert message(lambda: resolve_batch_sizes(1, 1, None, 2)) == (
        "gradient_accumulation_steps works out to 0 from train_batch_size 1, world size 2 and the other batch "
        "settings; raise train_batch_size or set gradient_accumulation_steps yourself")
    assert message(lambda: resolve_batch_sizes(None, None, 1, 2)) == \
        "train_batch_size or train_micro_batch_size_per_gpu is needed; give one of them"
    assert resolve_batch_sizes(2, 1, None, 2) == (2, 1, 1)


def test_base64_config_longer_than_a_file_name():
    config = {**BASE, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01,
                                                                "betas": [0.9, 0.95], "eps": 1e-8}},
              "zero_optimization": {"stage": 2, "reduce_bucket_size": 500000000, "overlap_comm": True,
                                    "allgather_bucket_size": 500000000, "contiguous_gradients": True}}
    text = base64.urlsafe_b64encode(json.dumps(config).encode()).decode()
    assert len(text) > 255  # Path.exists() raises ENAMETOOLONG for it: still a base64 config
    assert read_config(text) == config


def test_a_metric_difficulty_that_is_no_number_is_shown():
    assert message(lambda: load_config({**BASE, "data_efficiency": {"data_sampling": {"curriculum_learning": {
        "enabled": True, "curriculum_metrics": {"seqlen": {"difficulty_type": "value", "min_difficulty": "x"}}}}}})) \
        == ("data_efficiency.data_sampling.curriculum_learning.curriculum_metrics.seqlen.min_difficulty: "
            "should be a number, got 'x'")


def test_default_world_is_one_rank():
    cfg = load_config(BASE)
    assert (cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps) == (8, 1)


def test_auto_inside_a_block_nothing_reads_is_left_alone():
    cfg = load_config({**BASE, "autotuning": {"enabled": "auto", "tuner": ["auto"]}})
    assert cfg.autotuning == {"enabled": "auto", "tuner": ["auto"]}


def test_comment_keys_are_named_by_their_dotted_path():
    cfg = load_config({**BASE, "_top": 1, "zero_optimization": {"_note": 1, "offload_param": {"_c": 2, "device": "cpu"}},
                       "autotuning": [{"_d": 1}, 2]})  # inside a list: the list's path
    assert cfg.comment_keys == ["_top", "zero_optimization._note", "zero_optimization.offload_param._c", "autotuning._d"]
    assert cfg.zero_optimization.offload_param.device == "cpu" and cfg.autotuning == [{}, 2]


def test_misspelt_key_whose_value_is_auto_is_named_as_unknown_inside_a_dict_of_blocks():
    metrics = "data_efficiency.data_sampling.curriculum_learning.curriculum_metrics"
    assert message(lambda: load_config({**BASE, "data_efficiency": {"data_sampling": {"curriculum_learning": {
        "curriculum_metrics": {"seqlen": {"min_dificulty": "auto"}}}}}})) == \
        f"{metrics}.seqlen.min_dificulty: unknown key, did you mean min_difficulty?"


def chain(levels: int):
    node = 1
    for _ in range(levels):
        node = {"x": node}
    return node


def test_configs_nested_past_32_levels_are_refused_by_their_top_key():
    deep = ": nested more than 32 levels deep (or contains itself); no setting is that deep"
    assert read_config({"zero_optimization": chain(31)}) == {"zero_optimization": chain(31)}  # 32 levels: fine
    assert message(lambda: read_config({"zero_optimization": chain(32)})) == "zero_optimization" + deep
    assert read_config({"a": [[[chain(28)]]]}) == {"a": [[[chain(28)]]]}  # lists count as levels too
    assert message(lambda: read_config({"b": 1, "a": [[[chain(29)]]]})) == "a" + deep
    itself = {"a": 1}
    itself["b"] = itself
    assert message(lambda: read_config(itself)) == "b" + deep
    loop: list = []
    loop.append(loop)
    assert message(lambda: read_config({"k": (loop,)})) == "k" + deep


def test_read_config_copies_all_the_way_down_and_names_what_it_cannot_read():
    given = {"train_batch_size": 8, "zero_optimization": {"stage": 2}}
    read_config(given)["zero_optimization"]["stage"] = 3
    assert given == {"train_batch_size": 8, "zero_optimization": {"stage": 2}}
    assert read_config('\n  {"train_batch_size": 2}') == {"train_batch_size": 2}  # blanks before the "{"
    assert message(lambda: read_config(5)) == "config should be a dict or a path to a JSON file, got int"


# ---- what `zerotrain config` shows and the notice at initialize names (config/report.py)
def test_sources_of_refused_but_off_no_effect_and_filled_keys_word_for_word():
    from zerotrain.config.report import rows

    cfg = load_config({**BASE, "amp": {"enabled": False}, "cuda_visible_devices": "0", "steps_per_print": "auto",
                       "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "eps": "auto"}},
                       "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme",
                                                                           "nvme_path": "/" + "n" * 57}}},
                      auto_values={"steps_per_print": 5, "optimizer.params.eps": 1e-8})
    got = {key: (value, source) for key, value, source in rows(cfg)}
    assert got["amp"] == ('{"enabled": false}', "user, no effect: apex AMP is not built")  # refused: first clause
    assert got["cuda_visible_devices"] == (  # no effect: the whole reason, past its ";"
        '"0"', "user, no effect: DeepSpeed ignores it too; set CUDA_VISIBLE_DEVICES in the environment")
    assert got["steps_per_print"] == ("5", "auto: the trainer fills it from its options")  # no TRAINER_FILLS entry
    assert got["optimizer.params.lr"] == ("0.001", "user")  # the trainer could fill it; the user did
    assert got["optimizer.params.eps"] == ("1e-08", "auto: the trainer fills it from adam_epsilon")
    assert got["zero_optimization.offload_param.nvme_path"] == (f'"/{"n" * 57}"', "user")  # 60 characters: whole
    assert not any(key in got for key in ("zero_optimization", "optimizer", "zero_optimization.offload_param"))
    cut = load_config({**BASE, "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme",
                                                                                   "nvme_path": "/" + "n" * 58}}})
    assert {key: value for key, value, _ in rows(cut)}["zero_optimization.offload_param.nvme_path"] == \
        f'"/{"n" * 55}...'


def test_no_effect_keys_name_nested_blocks_and_keys_inside_a_dict_of_blocks():
    from zerotrain.config.report import no_effect_keys, notice

    cfg = load_config({**BASE, "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}},
                       "data_efficiency": {
                           "data_sampling": {"curriculum_learning": {"curriculum_metrics": {
                               "seqlen": {"difficulty_type": "value"}}}},
                           "data_routing": {"random_ltd": {"layer_token_lr_schedule": {"enabled": False}}}}})
    keys = ["zero_optimization.offload_param (stage 2)",
            "data_efficiency.data_routing.random_ltd.layer_token_lr_schedule"]
    assert no_effect_keys(cfg) == keys
    assert notice(cfg) == ("config keys accepted with no effect in zerotrain (`zerotrain config FILE` says why): "
                           + ", ".join(keys))


def test_tensor_parallel_size_is_read_before_the_rest_and_is_one_unless_the_block_asks():
    assert tensor_parallel_size(BASE) == 1
    assert tensor_parallel_size({**BASE, "tensor_parallel": {"autotp_size": 2}}) == 2
    assert tensor_parallel_size(json.dumps({"tensor_parallel": {"autotp_size": 4, "_note": "x"}})) == 4
    # a block that does not validate (load_config names what is wrong) or is off: 1
    for block in ({"autotp_size": "two"}, 3, {"autotp_size": 2, "enabled": False}, {"autotp_size": 2, "bogus": 1}):
        assert tensor_parallel_size({**BASE, "tensor_parallel": block}) == 1


def test_a_file_wins_over_base64_and_base64_is_one_line(tmp_path, monkeypatch):
    name = base64.urlsafe_b64encode(b'{"train_batch_size": 2}').decode().rstrip("=")
    assert read_config(name) == {"train_batch_size": 2}
    monkeypatch.chdir(tmp_path)
    (tmp_path / name).write_text('{"train_batch_size": 4}')
    assert read_config(name) == {"train_batch_size": 4}  # a file of that name is read, not decoded
    text = base64.urlsafe_b64encode(b'{"train_batch_size": 2, "gradient_clipping": 1.0}').decode()
    assert message(lambda: read_config(text[:16] + "\n" + text[16:])).endswith(": config file not found")
    twice = base64.urlsafe_b64encode(b'{"a": 1, "a": 2}').decode()
    assert message(lambda: read_config(twice)) == "base64 config: key 'a' appears twice in one object; keep one"
    (tmp_path / "bad.json").write_bytes(b'\xff{"a": 1}')
    assert message(lambda: read_config("bad.json")) == (
        "bad.json: cannot read config: 'utf-8' codec can't decode byte 0xff in position 0: invalid start byte")


def test_fill_auto_copies_what_it_passes_on():
    from zerotrain.config import fill_auto

    given, values = {"tensorboard": {"a": {"b": 1}}, "x": "auto"}, {"x": {"c": [1]}}
    out = fill_auto(given, values, opaque=("tensorboard",))
    out["tensorboard"]["a"]["b"] = 2
    out["x"]["c"].append(2)
    assert given == {"tensorboard": {"a": {"b": 1}}, "x": "auto"} and values == {"x": {"c": [1]}}


def test_autos_left_goes_on_past_a_defaulted_auto():
    from zerotrain.config import autos_left

    # an "auto" in a list is refused even inside a defaulting block (fill_auto raises for it too)
    assert autos_left({"zero_optimization": {"reduce_bucket_size": "auto", "offload_param": ["auto"]}}) == \
        ["zero_optimization.offload_param[0]"]


def test_a_block_switched_off_at_its_top_is_off_whatever_it_holds():
    cfg = load_config({**BASE, "sparse_attention": {"enabled": False, "block": {"enabled": True}}})
    assert cfg.sparse_attention == {"enabled": False, "block": {"enabled": True}}
