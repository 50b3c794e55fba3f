"""`zerotrain train --pipeline_parallel_size 2 --tensor_parallel_size 2` on 4 real ranks: an HF
LLaMA built from a config, cut into 2 stages whose projections are split across 2 tensor
ranks, with a sequence-length curriculum, trains as the same job does in one process; its
resume from a checkpoint is bit-identical, and its saved model is the trained weights, whole,
loadable with plain transformers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).parents[1] / "unit" / "trainer"))
from trainer_helpers import options, train_logged  # noqa: E402

LLAMA = {"model_type": "llama", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}
CURRICULUM = {"curriculum_learning": {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": 8,
                                      "max_difficulty": 32, "schedule_type": "fixed_linear",
                                      "schedule_config": {"total_curriculum_step": 3, "difficulty_step": 8}}}


def _job(tmp: Path, out: str, **extra) -> dict:
    (tmp / "llama.json").write_text(json.dumps(LLAMA))
    return options(tmp, model_config=str(tmp / "llama.json"), output_dir=str(tmp / out), max_steps=4,
                   per_device_train_batch_size=2, gradient_accumulation_steps=2, deepspeed=CURRICULUM,
                   report_to="none", **extra)


def pipeline_and_tensor_jobs(tmp: str) -> dict:
    """On each rank: 4 steps (checkpoints at 2 and 4), then the same job resumed from step 2."""
    tmp = Path(tmp)
    whole = train_logged(_job(tmp, "run", pipeline_parallel_size=2, tensor_parallel_size=2, save_strategy="steps",
                        save_steps=2))
    t = whole.pop("trainer")
    resumed = train_logged(_job(tmp, "resumed", pipeline_parallel_size=2, tensor_parallel_size=2, save_strategy="no",
                          resume_from_checkpoint=str(tmp / "run" / "checkpoint-2")))
    resumed.pop("trainer")
    mesh = t.engine.mesh
    return {**whole, "resumed": resumed, "names": t.pipe_names, "plan": t.engine.module.tensor_plan,
            "coords": (mesh.coord("pipe"), mesh.coord("data"), mesh.coord("tensor"))}


def test_trainer_pipeline_and_tensor_parallel_match_one_process(world4, tmp_path):
    from transformers import AutoModelForCausalLM

    ranks = world4.run(pipeline_and_tensor_jobs, str(tmp_path), timeout=400)
    assert [r["coords"] for r in ranks] == [(0, 0, 0), (0, 0, 1), (1, 0, 0), (1, 0, 1)]  # tensor fastest
    (tmp_path / "one").mkdir()
    one = train_logged(_job(tmp_path / "one", "run"))  # the same job in this process
    assert len(set(one["seqlens"])) > 1  # the curriculum changes the stages' shapes
    for r in ranks:
        assert r["seqlens"] == one["seqlens"] and r["results"]["tokens"] == one["results"]["tokens"]
        torch.testing.assert_close(torch.tensor(r["losses"]), torch.tensor(one["losses"]), rtol=1e-5, atol=0)
        torch.testing.assert_close(torch.tensor(r["norms"]), torch.tensor(one["norms"]), rtol=1e-5, atol=0)
        assert abs(r["results"]["eval_loss"] - one["results"]["eval_loss"]) <= 1e-5 * one["results"]["eval_loss"]
        assert r["resumed"]["losses"] == r["losses"][2:]  # steps 3 and 4, bit for bit
    run_dir = tmp_path / "run"
    saved = load_file(run_dir / "model.safetensors")
    assert saved.keys() == load_file(tmp_path / "resumed" / "model.safetensors").keys()
    # every rank's piece of the final checkpoint is its slice of the saved tensor
    for r in ranks:
        stage, _, t = r["coords"]
        piece = torch.load(run_dir / "checkpoint-4" / f"pipe_0{stage}-tp_0{t}-model_states.pt",
                           weights_only=True)["module"]
        split = 0
        for key, value in piece.items():
            style = r["plan"].get(key.rpartition(".")[0])  # colwise: rows split, rowwise: columns
            want = saved[r["names"][key]]
            if style in ("colwise", "rowwise"):
                want, split = want.chunk(2, dim=0 if style == "colwise" else 1)[t], split + 1
            assert torch.equal(value, want), key
        assert split == 7  # the stage's block: q, k, v, o, gate, up, down
    model = AutoModelForCausalLM.from_pretrained(str(run_dir))  # plain transformers, one process
    x = torch.randint(0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # the same logits as the model the one-process job trained
        torch.testing.assert_close(model(x).logits, one["trainer"].model.eval()(x).logits, rtol=1e-4, atol=1e-5)
