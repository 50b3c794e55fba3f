"""`zerotrain train --resume_from_checkpoint DIR` where DIR is a DeepSpeed folder: a universal
checkpoint (here zerotrain's own conversion of a trainer checkpoint) or a `global_stepN` folder
DeepSpeed 0.19.8 wrote (the committed fixture), continued end to end."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from trainer_helpers import Capture, options, run

from zerotrain.checkpoint.universal_out import write_universal
from zerotrain.trainer import TrainerCallback

FIXTURE = Path(__file__).resolve().parents[3] / "fixtures" / "deepspeed_zero2_bf16_2ranks"


def losses(records: list[dict]) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def test_a_universal_folder_continues_as_the_run_that_never_stopped(tmp_path):
    first, again = tmp_path / "first", tmp_path / "again"
    first.mkdir()
    again.mkdir()
    _, records = run(options(first, save_strategy="steps", save_steps=3))
    write_universal(first / "out" / "checkpoint-3", tmp_path / "ds" / "global_step3_universal")
    values = options(again, resume_from_checkpoint=str(tmp_path / "ds"))
    values["train_file"] = str(first / "train.txt")
    _, resumed = run(values)
    was, now = losses(records), losses(resumed)
    assert sorted(now) == [4, 5, 6]
    assert [now[s] for s in (4, 5, 6)] == [was[s] for s in (4, 5, 6)]


class AtStart(TrainerCallback):
    """What the engine holds right after the trainer's resume, before its first step."""

    def on_train_begin(self, trainer):
        resume = trainer._resume

        def look():
            self.step = resume()
            engine = trainer.engine
            self.weights = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
            self.adam_steps = {float(s["step"]) for s in engine.optimizer.state_dict()["state"].values()}
            self.lr = engine.get_lr()[0]
            return self.step

        trainer._resume = look


def test_a_deepspeed_global_step_folder_continues(tmp_path):
    """The fixture's model (zerotrain's GPT, vocabulary 32, 8 positions) with a 32-word tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from zerotrain.checkpoint.deepspeed import load_ds_file

    spec = json.loads((FIXTURE / "expected.json").read_text())["model"]
    words = ["<|endoftext|>", "<|pad|>", "<unk>"] + sorted(set(" ".join(["the quick brown fox jumps over a lazy dog "
                                                                          "and the cat runs fast or slow"]).split()))
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "tokenizer.json"))
    model = {"zerotrain_model": "gpt", **{k: v for k, v in spec.items() if k != "seed"}}
    (tmp_path / "model.json").write_text(json.dumps(model))
    start, end = AtStart(), Capture()
    _, records = run(options(tmp_path, model_config=str(tmp_path / "model.json"), block_size=8, max_steps=5,
                             tokenizer_name_or_path=str(tmp_path / "tokenizer.json"), bf16=True,
                             resume_from_checkpoint=str(FIXTURE / "global_step3")), callbacks=[start, end])
    assert start.step == 3 and start.adam_steps == {3.0}
    assert abs(start.lr - 1e-3 * (5 - 3) / 5) < 1e-12  # this run's linear schedule, at DeepSpeed's step
    module = load_ds_file(FIXTURE / "global_step3" / "mp_rank_00_model_states.pt")["module"]
    for name, value in start.weights.items():  # DeepSpeed's bf16 weights are its fp32 masters, rounded
        assert torch.equal(value.to(torch.bfloat16), module[name]), name
    assert sorted(losses(records)) == [4, 5]
    assert end.trainer.engine.global_steps == 5
