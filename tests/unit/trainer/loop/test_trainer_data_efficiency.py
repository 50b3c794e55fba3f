"""zerotrain train with the data_efficiency block's sampling side: the curriculum by a metric
drawing the trainer's batches from `zerotrain analyze`'s index files, seqlen_truncate cutting
them, dynamic batching making token batches with the LR scaled, and a resume continuing the
same batches; what the trainer cannot honour is one line (a custom curriculum schedule from the
command line, which cannot set its function, while a Python callback can)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from trainer_helpers import Capture, options, run

from zerotrain.cli import main as cli
from zerotrain.data.indexed import IndexedFile
from zerotrain.data_efficiency import layer_averaged_length
from zerotrain.errors import ConfigError
from zerotrain.trainer import TrainerCallback


class Inputs(TrainerCallback):
    """Each training forward's input_ids, by the step it belongs to."""

    def __init__(self):
        self.seen: list[tuple[int, list[tuple[int, ...]]]] = []

    def on_train_begin(self, trainer):
        def record(module, args, kwargs):
            if module.training:
                ids = kwargs.get("input_ids", args[0] if args else None)
                self.seen.append((trainer.engine.global_steps, [tuple(r) for r in ids.tolist()]))
        trainer.model.register_forward_pre_hook(record, with_kwargs=True)


def analyzed(tmp_path) -> tuple[dict, str]:
    """The trainer's options (no held-out split) and `zerotrain analyze`'s folder over the same data."""
    values = options(tmp_path, validation_split_percentage=0, max_steps=6)
    save = str(tmp_path / "analysis")
    assert cli(["analyze", "--model_config", values["model_config"], "--train_file", values["train_file"],
                "--block_size", "32", "--cache_dir", values["cache_dir"], "--validation_split_percentage", "0",
                "--metrics", "vocab_rarity", "--save_path", save]) == 0
    return values, f"{save}/vocab_rarity/vocab_rarity"


def curriculum(metrics: dict, cluster_path=None, **extra) -> dict:
    block = {"enabled": True, "curriculum_metrics": metrics}
    if cluster_path is not None:
        block["data_cluster_path"] = str(cluster_path)
    return {"data_efficiency": {"enabled": True, "seed": 5, "data_sampling": {
        "enabled": True, **extra, "curriculum_learning": block}}}


def rarity_metric(prefix: str, low: int, high: int) -> dict:
    return {"index_to_sample_path": f"{prefix}_index_to_sample", "index_to_metric_path": f"{prefix}_index_to_metric",
            "difficulty_type": "value", "clustering_type": "schedule_based", "min_difficulty": low,
            "max_difficulty": high, "schedule_type": "fixed_linear",
            "schedule_config": {"total_curriculum_step": 4, "difficulty_step": 1}}


TRUNCATE = {"difficulty_type": "value", "clustering_type": "single_cluster", "min_difficulty": 8, "max_difficulty": 32,
            "schedule_type": "fixed_linear", "schedule_config": {"total_curriculum_step": 4, "difficulty_step": 8}}


def test_batches_follow_the_metric_and_seqlen_truncate_cuts_them(tmp_path):
    values, prefix = analyzed(tmp_path)
    rarity = IndexedFile(f"{prefix}_sample_to_metric").concatenated()
    low, high = int(np.percentile(rarity, 20)), int(rarity.max())
    ltd = {"enabled": True, "total_layer_num": 2, "random_ltd_layer_num": 1, "random_ltd_layer_id": [1],
           "model_mask_name": "attention_mask", "model_type": "decoder", "hidden_state_order": "batch_seq_dim",
           "random_ltd_schedule": {"min_value": 8, "max_value": 32, "schedule_type": "fixed_linear",
                                   "schedule_config": {"require_steps": 6, "seq_per_step": 8}}}
    ds = curriculum({"vocab_rarity": rarity_metric(prefix, low, high), "seqlen_truncate": TRUNCATE})
    ds["data_efficiency"]["data_routing"] = {"random_ltd": ltd}
    inputs, capture = Inputs(), Capture()
    _, recs = run({**values, "deepspeed": ds}, [inputs, capture])
    recs = [r for r in recs if "loss" in r]
    # the trainer's data, as the sampler indexes it (clm blocks of 32 tokens, analysed by `zerotrain analyze`)
    rows = {tuple(r): i for i, r in enumerate(capture.trainer.train_dataset["input_ids"])}
    lengths = [8, 16, 24, 32, 32, 32]  # fixed_linear 8 -> 32 over curriculum steps 1-4 (8 + 6 s, floored to 8s)
    assert [r["difficulty_seqlen_truncate"] for r in recs] == lengths
    assert [r["tokens"] for r in recs] == list(np.cumsum([4 * n for n in lengths]))  # data tokens after the cut
    assert [len(ids[0]) for _, ids in inputs.seen] == lengths
    for (step, ids), record in zip(inputs.seen, recs):
        assert step + 1 == record["step"]
        # each sample is one of the data's, cut to the step's length, and within the step's rarity
        found = [[i for row, i in rows.items() if row[:len(r)] == r] for r in ids]
        assert all(any(rarity[i] <= record["difficulty_vocab_rarity"] for i in cands) for cands in found)
    assert recs[0]["difficulty_vocab_rarity"] < high and (rarity > recs[0]["difficulty_vocab_rarity"]).sum() > 50
    reserved = [8, 8, 16, 16, 24, 24]  # random-LTD keeps 8 + 4 s at global step s, floored to 8s
    assert [r["ltd_seq"] for r in recs] == reserved
    assert [r["layer_tokens"] for r in recs] == list(np.cumsum(
        [4 * layer_averaged_length(n, k, 1, 2) for n, k in zip(lengths, reserved)]))
    described = capture.trainer.engine.features[0].describe()
    assert described == (f"curriculum by vocab_rarity (value {low} -> {high}, schedule_based), seqlen_truncate "
                         "(value 8 -> 32, single_cluster), batches through seqlen_truncate")


class Losses(TrainerCallback):
    def __init__(self):
        self.rows = []

    def on_step_end(self, trainer):
        record = trainer.last_log
        self.rows.append((record["step"], record["loss"], record["tokens"]))


def test_a_resume_continues_the_sampler_bit_for_bit(tmp_path):
    values, prefix = analyzed(tmp_path)
    rarity = IndexedFile(f"{prefix}_sample_to_metric").concatenated()
    ds = curriculum({"vocab_rarity": rarity_metric(prefix, int(np.percentile(rarity, 30)), int(rarity.max())),
                     "seqlen_truncate": TRUNCATE})

    class StopAfter(TrainerCallback):
        def on_step_end(self, trainer):
            if trainer.engine.global_steps == 4:
                raise KeyboardInterrupt

    full = Losses()
    run({**values, "deepspeed": ds, "output_dir": str(tmp_path / "full")}, [full])
    cut = {**values, "deepspeed": ds, "output_dir": str(tmp_path / "cut"), "save_strategy": "steps", "save_steps": 3}
    with pytest.raises(KeyboardInterrupt):
        run(cut, [StopAfter()])
    resumed = Losses()
    run({**cut, "resume_from_checkpoint": "latest"}, [resumed])
    assert [r[0] for r in resumed.rows] == [4, 5, 6] and resumed.rows == full.rows[3:]
    assert (tmp_path / "cut" / "data_clusters").is_dir()  # data_cluster_path defaults into the run folder


def test_dynamic_batching_makes_token_batches_and_scales_the_lr(tmp_path):
    ds = {"data_efficiency": {"enabled": True, "data_sampling": {"enabled": True, "dynamic_batching": {
              "enabled": True, "max_tokens": 60, "lr_scaling_method": "linear", "sequence_picking_order": "seqlen"}}}}
    inputs = Inputs()
    values = options(tmp_path, line_by_line=True, deepspeed=ds, max_steps=6, lr_scheduler_type="linear",
                     validation_split_percentage=0, per_device_train_batch_size=1, gradient_accumulation_steps=2)
    _, recs = run(values, [inputs])
    recs = [r for r in recs if "loss" in r]
    packs = [ids for _, ids in inputs.seen]
    assert len(packs) == 12 and all(len(p[0]) * len(p) <= 60 for p in packs)  # padded to the pack's longest
    sizes = [len(a) + len(b) for a, b in zip(packs[::2], packs[1::2])]  # two packs a step
    assert [r["batch_samples"] for r in recs] == sizes and len(set(sizes)) > 1
    # the step's LR is the schedule's (1e-3 down to 0 over 6 steps) x that step's samples / train_batch_size 2;
    # a record's lr is the one set for the next step
    assert [r["lr"] for r in recs[:-1]] == pytest.approx(
        [1e-3 * (5 - s) / 6 * n / 2 for s, n in enumerate(sizes[1:])], rel=1e-6)
    assert [r["tokens"] for r in recs] == list(np.cumsum([sum(len(p) * len(p[0]) for p in packs[2 * s:2 * s + 2])
                                                          for s in range(6)]))


@pytest.mark.parametrize("change, line, before_data", [
    ({"metric": "rarity_cluster"}, "curriculum_metrics.rarity_cluster: a single_cluster metric picks no samples",
     True),
    ({"group_by_length": True}, "group_by_length: data_efficiency.data_sampling.curriculum_learning orders the "
                                "training batches; drop one of them", True),
    ({"max_steps": 400}, "data_efficiency.data_sampling.num_epochs: 1 draws at most", False),
])
def test_what_the_trainer_cannot_honour_is_one_line(tmp_path, change, line, before_data):
    metric = change.pop("metric", "seqlen_truncate")
    ds = curriculum({metric: TRUNCATE}, tmp_path / "clusters", num_epochs=1)
    with pytest.raises(ConfigError, match=line.replace("(", r"\(")):
        run(options(tmp_path, deepspeed=ds, **change))
    assert (tmp_path / "cache").exists() != before_data  # what the options decide is refused before the data loads


CUSTOM = {"difficulty_type": "value", "clustering_type": "single_cluster", "min_difficulty": 8, "max_difficulty": 32,
          "schedule_type": "custom"}
LEGACY_CUSTOM = {"curriculum_learning": {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": 8,
                                         "max_difficulty": 32, "schedule_type": "custom"}}


@pytest.mark.parametrize("ds, where", [
    (curriculum({"seqlen_truncate": CUSTOM}), "data_efficiency.data_sampling.curriculum_learning.curriculum_metrics."
                                              "seqlen_truncate"),
    (LEGACY_CUSTOM, "curriculum_learning"),
])
def test_a_custom_schedule_from_the_command_line_is_one_line_before_the_data(tmp_path, capsys, ds, where):
    values = {**options(tmp_path), "deepspeed": json.dumps(ds)}
    assert cli(["train", *[item for key, value in values.items() for item in (f"--{key}", str(value))]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"zerotrain: error: {where}.schedule_type custom: the command line cannot set its difficulty "
                   "function; use fixed_linear, fixed_root or fixed_discrete, or train from Python and call "
                   "engine.set_custom_curriculum_learning_schedule(fn) (with zerotrain.Trainer: trainer.engine's, "
                   "in a callback's on_train_begin)"]
    assert not (tmp_path / "cache").exists()  # refused before the tokenizer and the data load


def test_a_python_callback_sets_the_custom_schedule(tmp_path):
    class Schedule(TrainerCallback):
        def on_train_begin(self, trainer):
            trainer.engine.set_custom_curriculum_learning_schedule({"seqlen_truncate": lambda step: 8 * (step % 4 + 1)})

    inputs = Inputs()
    ds = curriculum({"seqlen_truncate": CUSTOM})
    _, recs = run(options(tmp_path, deepspeed=ds, validation_split_percentage=0, max_steps=4), [Schedule(), inputs])
    assert [r["difficulty_seqlen_truncate"] for r in recs if "loss" in r] == [16, 24, 32, 32]  # frozen at max
    assert [len(ids[0]) for _, ids in inputs.seen] == [16, 24, 32, 32]


def test_every_custom_schedule_is_named_in_the_one_line():
    from zerotrain.config.loader import load_config
    from zerotrain.trainer.preflight import refuse_custom_schedules

    both = {"train_batch_size": 4, **curriculum({"seqlen_truncate": CUSTOM}), **LEGACY_CUSTOM}
    with pytest.raises(ConfigError) as caught:
        refuse_custom_schedules(load_config(both))
    assert str(caught.value).startswith(
        "curriculum_learning.schedule_type, data_efficiency.data_sampling.curriculum_learning.curriculum_metrics."
        "seqlen_truncate.schedule_type custom: the command line cannot set their difficulty functions; ")
    refuse_custom_schedules(load_config({"train_batch_size": 4, **curriculum({"seqlen_truncate": TRUNCATE})}))
