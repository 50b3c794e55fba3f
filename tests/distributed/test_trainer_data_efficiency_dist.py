"""`zerotrain train` with data_efficiency on 2 real gloo ranks against the same job in one
process: the curriculum's sampler drawing every rank's block of each global batch (by
`zerotrain analyze`'s vocab_rarity files, cut by seqlen_truncate) with random-LTD on a GPT at
2 data-parallel ranks, and random-LTD in an HF LLaMA's decoder layers through 2 pipeline
stages; dynamic batching through 2 pipeline stages against one process on the same batches."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "unit" / "trainer"))
from trainer_helpers import Capture, lines, options, run  # noqa: E402

from zerotrain.trainer import TrainerCallback  # noqa: E402

LLAMA = {"model_type": "llama", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}
TRUNCATE = {"difficulty_type": "value", "clustering_type": "single_cluster", "min_difficulty": 8, "max_difficulty": 32,
            "schedule_type": "fixed_linear", "schedule_config": {"total_curriculum_step": 3, "difficulty_step": 8}}


def ltd(layers: int, mask: str | None) -> dict:
    return {"enabled": True, "total_layer_num": layers, "random_ltd_layer_num": 1, "random_ltd_layer_id": [1],
            "model_mask_name": mask, "model_type": "decoder", "hidden_state_order": "batch_seq_dim",
            "random_ltd_schedule": {"min_value": 8, "max_value": 32, "schedule_type": "fixed_linear",
                                    "schedule_config": {"require_steps": 8, "seq_per_step": 8}}}


def data_efficiency(metrics: dict, layers: int, mask: str | None) -> dict:
    return {"data_efficiency": {"enabled": True, "seed": 3, "data_sampling": {"enabled": True, "curriculum_learning": {
        "enabled": True, "curriculum_metrics": metrics}}, "data_routing": {"random_ltd": ltd(layers, mask)}}}


def jobs(tmp: Path, prefix: str, ranks: int) -> dict:
    """The GPT job (data parallel over `ranks`) and the LLaMA job (`ranks` pipeline stages)."""
    rarity = {"index_to_sample_path": f"{prefix}_index_to_sample", "index_to_metric_path": f"{prefix}_index_to_metric",
              "difficulty_type": "value", "clustering_type": "schedule_based", "min_difficulty": 92,
              "max_difficulty": 105, "schedule_type": "fixed_linear",
              "schedule_config": {"total_curriculum_step": 3, "difficulty_step": 1}}
    gpt = options(tmp, model_config="gpt-tiny", validation_split_percentage=0, max_steps=5,
                  per_device_train_batch_size=4 // ranks, output_dir=str(tmp / "gpt"),
                  deepspeed=data_efficiency({"vocab_rarity": rarity, "seqlen_truncate": TRUNCATE}, 2, "attention_mask"))
    (tmp / "llama.json").write_text(json.dumps(LLAMA))
    llama = options(tmp, model_config=str(tmp / "llama.json"), validation_split_percentage=0, max_steps=5,
                    per_device_train_batch_size=2, gradient_accumulation_steps=2, output_dir=str(tmp / "llama"),
                    deepspeed=data_efficiency({"seqlen_truncate": TRUNCATE}, 2, None))
    if ranks > 1:
        llama["pipeline_parallel_size"] = ranks
    return {"gpt": gpt, "llama": llama}


def train_jobs(tmp: str, prefix: str, ranks: int = 2) -> dict:
    """On every rank (or in one process with ranks 1): each job's training records."""
    tmp = Path(tmp) / ("two" if ranks > 1 else "one")  # one job: its ranks share the folders
    tmp.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, values in jobs(tmp, prefix, ranks).items():
        capture = Capture()
        run(values, [capture])
        out[name] = [{k: r[k] for k in ("loss", "tokens", "layer_tokens", "ltd_seq",
                                         "difficulty_seqlen_truncate", "difficulty_vocab_rarity") if k in r}
                     for r in capture.trainer.history if "loss" in r]
    return out


def test_curriculum_sampler_and_random_ltd_on_two_ranks_match_one_process(world2, tmp_path):
    from zerotrain.cli import main as cli

    values = options(tmp_path, validation_split_percentage=0)
    assert cli(["analyze", "--model_config", "gpt-tiny", "--train_file", values["train_file"], "--block_size", "32",
                "--validation_split_percentage", "0", "--cache_dir", str(tmp_path / "analysis-cache"), "--metrics",
                "vocab_rarity", "--save_path", str(tmp_path / "analysis")]) == 0
    prefix = str(tmp_path / "analysis" / "vocab_rarity" / "vocab_rarity")
    ranks = world2.run(train_jobs, str(tmp_path), prefix)
    one = train_jobs(str(tmp_path), prefix, ranks=1)
    assert [r["difficulty_seqlen_truncate"] for r in one["gpt"]] == [16, 24, 32, 32, 32]  # 8 + 8 s, floored to 8s
    assert [r["difficulty_vocab_rarity"] for r in one["gpt"]][:3] == [96, 100, 105]  # 92 + 13 s / 3 (values 85-105)
    assert [r["ltd_seq"] for r in one["llama"]] == [8, 8, 8, 16, 16]  # 8 + 3 s at step s, floored to 8s
    for name in ("gpt", "llama"):
        lengths = [r["difficulty_seqlen_truncate"] for r in one[name]]
        assert [r["tokens"] for r in one[name]] == list(np.cumsum([4 * n for n in lengths]))
        for rank in ranks:
            mine = rank[name]
            assert [r["tokens"] for r in mine] == [r["tokens"] for r in one[name]]
            assert [r["layer_tokens"] for r in mine] == [r["layer_tokens"] for r in one[name]]
            torch.testing.assert_close(torch.tensor([r["loss"] for r in mine]),
                                       torch.tensor([r["loss"] for r in one[name]]), rtol=1e-5, atol=0)


DYNAMIC = {"data_efficiency": {"enabled": True, "data_sampling": {"enabled": True, "dynamic_batching": {
    "enabled": True, "max_tokens": 128, "lr_scaling_method": "linear", "sequence_picking_order": "random"}}}}


class Shapes(TrainerCallback):
    """Each micro-batch's input_ids shape, by the step it belongs to (the trainer hands every
    micro-batch to its runner, pipeline or not)."""

    def on_train_begin(self, trainer):
        self.seen, run_one = [], trainer.micro_batches.run

        def record(batch):
            self.seen.append((trainer.engine.global_steps, tuple(batch["input_ids"].shape)))
            run_one(batch)
        trainer.micro_batches.run = record


def train_dynamic(tmp: str, stages: int = 2) -> dict:
    """On every rank (or in one process with stages 1): a GPT on line-by-line text batched by
    tokens, 2 packs a step; its logged steps and micro-batch shapes."""
    tmp = Path(tmp) / f"dynamic{stages}"
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "short.txt").write_text("".join(line + "\n" for line in lines(200, 3, 1, 12)), encoding="utf-8")
    values = options(tmp, train_file=str(tmp / "short.txt"), line_by_line=True, block_size=64, deepspeed=DYNAMIC,
                     max_steps=6, lr_scheduler_type="linear", validation_split_percentage=0,
                     per_device_train_batch_size=1, gradient_accumulation_steps=2)
    if stages > 1:
        values["pipeline_parallel_size"] = stages
    shapes = Shapes()
    _, recs = run(values, [shapes])
    steps = [[shape for step, shape in shapes.seen if step == s] for s in range(6)]
    return {"steps": steps, "recs": [{k: r[k] for k in ("loss", "lr", "batch_samples", "tokens")}
                                     for r in recs if "loss" in r]}


def test_dynamic_batching_through_two_pipeline_stages_matches_one_process(world2, tmp_path, monkeypatch):
    from zerotrain.trainer.data import efficiency

    ranks = world2.run(train_dynamic, str(tmp_path))
    # the same batches in one process: the packs made with equal counts and padded to the step's longest
    monkeypatch.setattr(efficiency, "equal_micro_batches", lambda plan: True)
    one = train_dynamic(str(tmp_path), stages=1)
    steps = one["steps"]
    assert all(len(s) == 2 and s[0] == s[1] for s in steps)  # one shape a step: 2 packs of equal counts, padded
    assert len(set(s[0] for s in steps)) > 2  # and it changes from step to step
    sizes = [r["batch_samples"] for r in one["recs"]]
    assert sizes == [2 * s[0][0] for s in steps] and len(set(sizes)) > 1
    # a record's lr is the one set for the next step: the linear schedule x its samples / train_batch_size 2
    assert [r["lr"] for r in one["recs"][:-1]] == pytest.approx(
        [1e-3 * (5 - s) / 6 * n / 2 for s, n in enumerate(sizes[1:])], rel=1e-6)
    for rank in ranks:
        assert rank["steps"] == steps
        mine = rank["recs"]
        for key in ("lr", "batch_samples", "tokens"):
            assert [r[key] for r in mine] == [r[key] for r in one["recs"]], key
        torch.testing.assert_close(torch.tensor([r["loss"] for r in mine]),
                                   torch.tensor([r["loss"] for r in one["recs"]]), rtol=1e-5, atol=0)
