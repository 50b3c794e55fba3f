"""HF / LLaMA-Factory habits: their names mapped or refused naming ours, do_train / do_eval /
do_predict with HF's meanings, and every option checked before anything is loaded."""

from __future__ import annotations

import json

import pytest
from trainer_helpers import options, run, write_classification

from zerotrain.cli import main
from zerotrain.errors import ConfigError
from zerotrain.trainer.args import build


def cli(tmp_path, *argv):
    return main(["train", "--model_config", "gpt-tiny", "--output_dir", str(tmp_path / "out"), *argv])


def test_foreign_names_are_mapped_noted_or_refused(tmp_path, capsys):
    notices = []
    model, data, training = build({"output_dir": "o", "lora_target": "q_proj", "additional_target": "score",
                                   "cutoff_len": 64, "optim": "adamw_torch", "report_to": ["tensorboard"],
                                   "local_rank": 0, "push_to_hub": False, "lora_rank": 4}, notices=notices)
    assert (model.lora_target_modules, model.modules_to_save, data.block_size, training.optim,
            training.report_to) == ("q_proj", "score", 64, "adamw", "tensorboard")
    assert notices == ["local_rank: no effect in zerotrain (the rank comes from torchrun's environment)"]
    for values, message in (({"stage": "sft"}, "stage: not a zerotrain option; use --task clm (LLaMA-Factory's pt) "
                                               "or --task sft (sft)"),
                            ({"push_to_hub": True}, "push_to_hub: not a zerotrain option; zerotrain does not upload"),
                            ({"dataset": "alpaca_en"}, "dataset: not a zerotrain option; give files: --train_file"),
                            ({"learning_rat": 1}, "learning_rat: unknown option, did you mean learning_rate?")):
        with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
            build({"output_dir": "o", **values})
    # the same from the command line, where an unknown option's value is not taken for the options file
    assert cli(tmp_path, "--train_file", "x.txt", "--finetuning_type", "lora") == 2
    assert capsys.readouterr().err.strip() == ("zerotrain: error: finetuning_type: not a zerotrain option; use "
                                               "--lora_rank N: > 0 trains LoRA adapters, 0 trains every weight")


class Loaded(Exception):
    pass


def test_the_deepspeed_config_and_options_fail_before_anything_loads(tmp_path, monkeypatch, capsys):
    from zerotrain.trainer.data import prepare, tokenizer

    for module, name in ((tokenizer, "load_tokenizer"), (prepare, "prepare")):
        monkeypatch.setattr(module, name, lambda *a, **k: (_ for _ in ()).throw(Loaded()))
    (tmp_path / "t.txt").write_text("some text\n" * 50)
    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {"stag": 2}}))
    cases = [(["--deepspeed", str(tmp_path / "ds.json")], "zero_optimization.stag: unknown key, did you mean stage?"),
             (["--lr_scheduler_type", "cosine", "--lr_scheduler_kwargs", '{"num_cycle": 1}'],
              "lr_scheduler_kwargs.num_cycle: unknown key for cosine, did you mean num_cycles?"),
             (["--tokenizer_name_or_path", str(tmp_path / "nope")], "tokenizer_name_or_path"),
             (["--task", "sft", "--chat_template", "chatmlx"], "chat_template 'chatmlx': neither a built-in"),
             (["--do_eval", "--validation_split_percentage", "0"], "do_eval needs evaluation data")]
    for extra, message in cases:
        assert cli(tmp_path, "--train_file", str(tmp_path / "t.txt"), *extra) == 2, extra
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], (extra, err)
    assert not (tmp_path / "out").exists()


def test_do_train_false_evaluates_only_and_do_predict_writes_predictions(tmp_path):
    path = write_classification(tmp_path / "cls.jsonl", n=60)
    base = options(tmp_path, model_config="bert-tiny", task="classification", train_file=str(path), max_steps=4,
                   validation_split_percentage=20)
    trained, _ = run({**base, "save_strategy": "steps", "save_steps": 4})
    folder = tmp_path / "out" / "checkpoint-4"
    only_eval, recs = run({**base, "model_name_or_path": str(folder), "model_config": None, "do_train": False,
                           "output_dir": str(tmp_path / "eval"), "do_predict": True, "test_file": str(path)})
    assert only_eval["global_step"] == 0 and only_eval["eval_loss"] == pytest.approx(trained["eval_loss"], rel=1e-6)
    assert "test_accuracy" in only_eval and not (tmp_path / "eval" / "model.safetensors").exists()
    predicted = [json.loads(line) for line in (tmp_path / "eval" / "predictions.jsonl").read_text().splitlines()]
    assert len(predicted) == 60 and {p["label"] for p in predicted} <= {"neg", "pos"}
    assert [p["index"] for p in predicted] == list(range(60))
    no_final, recs = run({**base, "do_eval": False, "output_dir": str(tmp_path / "noeval")})
    assert "eval_loss" not in no_final and not any("eval_loss" in r for r in recs)
    with pytest.raises(ConfigError, match="do_eval false and eval_strategy steps contradict"):
        build({"output_dir": "o", "do_eval": False, "eval_strategy": "steps"})
