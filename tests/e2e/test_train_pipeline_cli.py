"""`zerotrain train --pipeline_parallel_size 2` on 2 processes: the GPT's blocks split into two
stages, evaluated and saved whole (one ~40 s job)."""

from __future__ import annotations

import json

import torch
from e2e_helpers import metrics, ok, text_file, zerotrain

from zerotrain.checkpoint.consolidate import consolidate_checkpoint
from zerotrain.trainer.model import build as models


def test_trainer_splits_the_model_into_pipeline_stages(tmp_path):
    text_file(tmp_path / "train.txt", 300)
    ok(zerotrain(tmp_path, "train", "--nproc_per_node", "2", "--pipeline_parallel_size", "2",
                 "--model_config", "gpt-tiny", "--train_file", "train.txt", "--output_dir", "run",
                 "--block_size", "32", "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "2",
                 "--max_steps", "6", "--logging_steps", "2", "--save_steps", "3", "--eval_strategy", "steps",
                 "--eval_steps", "3", "--disable_tqdm"))
    run = tmp_path / "run"
    state = json.loads((run / "trainer_state.json").read_text())
    # one data-parallel rank: 6 steps x 2 micro-batches x 2 samples x 32 tokens, counted once
    assert state["global_step"] == 6 and state["tokens"] == 768 and state["eval_loss"] > 0
    logged = [m for m in metrics(run) if "loss" in m]
    assert [m["step"] for m in logged] == [2, 4, 6] and all(m["loss"] > 0 for m in logged)
    files = sorted(p.name for p in (run / "checkpoint-6").iterdir())
    assert "pipe_00-model_states.pt" in files and "pipe_01-model_states.pt" in files
    model, _ = models.load_model(str(run), "clm")  # both stages' weights, under the GPT's names
    fresh, _ = models.build_model(None, "gpt-tiny", "clm", None)
    assert model.state_dict().keys() == fresh.state_dict().keys()
    # the saved model holds the second stage's weights too: those of the final checkpoint
    whole = consolidate_checkpoint(run / "checkpoint-6")  # layers: embed, positions, 2 blocks, ln_f, head
    assert torch.equal(model.state_dict()["blocks.1.qkv.weight"], whole["3.qkv.weight"])
    assert torch.equal(model.state_dict()["wte.weight"], whole["tied_modules.embed.weight"])
