"""Models (presets, HF configs, folders), init_from, LoRA (adapter only, reload, merge), metrics."""

from __future__ import annotations

import json

import pytest
import torch
from trainer_helpers import Capture, options, run, write_classification

from zerotrain.errors import ConfigError
from zerotrain.trainer.data.tokenizer import byte_tokenizer
from zerotrain.trainer.loop.evaluate import finish
from zerotrain.trainer.model import build as models
from zerotrain.trainer.model import lora
from zerotrain.trainer import TrainerCallback


@pytest.mark.parametrize("preset, task, cls", [
    ("gpt-tiny", "clm", "GPT"), ("bert-tiny", "mlm", "PreLNBertMLM"),
    ("bert-tiny", "classification", "PreLNBertClassifier"), ("gpt2-tiny", "clm", "GPT2LMHeadModel"),
    ("llama-tiny", "clm", "LlamaForCausalLM"), ("llama-tiny", "classification", "LlamaForSequenceClassification"),
])
def test_presets_build_for_their_tasks(preset, task, cls):
    model, info = models.build_model(None, preset, task, byte_tokenizer(), num_labels=3)
    assert type(model).__name__ == cls and info.max_positions == 128
    if task == "classification":
        assert info.config.get("num_labels", getattr(getattr(model, "config", None), "num_labels", None)) == 3


def test_model_errors(tmp_path):
    with pytest.raises(ConfigError, match="supports clm"):
        models.build_model(None, "gpt-tiny", "mlm", byte_tokenizer())
    with pytest.raises(ConfigError, match="neither a preset .* did you mean gpt-tiny"):
        models.build_model(None, "gpt-tinyy", "clm", byte_tokenizer())
    (tmp_path / "m.json").write_text(json.dumps({"zerotrain_model": "gpt", "n_layers": 2}))
    with pytest.raises(ConfigError, match="unknown key 'n_layers'"):
        models.build_model(None, str(tmp_path / "m.json"), "clm", byte_tokenizer())
    with pytest.raises(ConfigError, match="not a folder"):
        models.build_model(str(tmp_path / "none"), None, "clm", byte_tokenizer())


def test_config_file_hf_and_ours(tmp_path):
    (tmp_path / "hf.yaml").write_text("model_type: gpt2\nn_embd: 32\nn_layer: 1\nn_head: 2\nn_positions: 64\n")
    model, info = models.build_model(None, str(tmp_path / "hf.yaml"), "clm", byte_tokenizer())
    assert info.kind == "hf" and model.config.n_embd == 32 and model.config.vocab_size == len(byte_tokenizer())
    (tmp_path / "ours.json").write_text(json.dumps({"zerotrain_model": "bert", "n_embd": 32, "n_layer": 1,
                                                    "n_head": 2}))
    model, info = models.build_model(None, str(tmp_path / "ours.json"), "mlm", byte_tokenizer())
    assert info.kind == "bert" and info.max_positions == 512


def test_hf_run_saves_a_folder_from_pretrained_reads(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run(options(tmp_path, model_config="llama-tiny", max_steps=2))
    out = tmp_path / "out"
    model = AutoModelForCausalLM.from_pretrained(str(out))
    tok = AutoTokenizer.from_pretrained(str(out))
    assert type(model).__name__ == "LlamaForCausalLM" and tok.pad_token == "<|pad|>"
    modes = Modes()
    res, _ = run(options(tmp_path, model_name_or_path=str(out), model_config=None, max_steps=1,
                         output_dir=str(tmp_path / "again")), [modes])
    # from_pretrained returns the model in eval mode; it trains in training mode all the same
    assert res["global_step"] == 1 and modes.training == [True] and res["tokens"] == 4 * 32


class Modes(TrainerCallback):
    def __init__(self):
        self.training = []

    def on_step_end(self, trainer):
        self.training.append(trainer.model.training)


def test_init_from_mlm_encoder_for_classification(tmp_path, capsys):
    run(options(tmp_path, model_config="bert-tiny", task="mlm", max_steps=2, output_dir=str(tmp_path / "mlm")))
    encoder = models.read_weights(tmp_path / "mlm")["bert.blocks.0.qkv.weight"]
    cap = Capture()
    res, _ = run(options(tmp_path, model_config="bert-tiny", task="classification", init_from=str(tmp_path / "mlm"),
                         train_file=str(write_classification(tmp_path / "c.jsonl")), learning_rate=0.0,
                         max_steps=1, validation_split_percentage=20, output_dir=str(tmp_path / "cls")), [cap])
    out = capsys.readouterr().out
    assert "missing keys (newly initialised): pooler.weight, pooler.bias, classifier.weight, classifier.bias" in out
    assert "unexpected keys (ignored): decoder.bias, dense.bias, dense.weight, ln.bias, ln.weight" in out
    assert torch.equal(cap.trainer.model.bert.blocks[0].qkv.weight.detach(), encoder)
    assert {"eval_loss", "eval_accuracy", "eval_f1"} <= set(res)


def test_classification_metrics():
    # 2 classes: tp/fp/fn per class; F1 of class 1 = 2*3 / (2*3 + 1 + 2)
    sums = torch.tensor([4.0, 10.0, 7.0, 4, 3, 2, 1, 1, 2], dtype=torch.float64)
    out = finish("classification", sums, 2)
    assert out["eval_loss"] == 0.4 and out["eval_accuracy"] == 0.7
    assert out["eval_f1"] == pytest.approx(6 / 9)


def test_lora_targets_map_llama_names_to_each_model():
    model, _ = models.build_model(None, "gpt-tiny", "clm", byte_tokenizer())
    assert lora.resolve_targets(model, "zerotrain", "q_proj,v_proj,down_proj") == ["qkv", "fc_out"]
    assert lora.resolve_targets(model, "zerotrain", "all") == ["fc", "fc_out", "proj", "qkv"]
    hf, _ = models.build_model(None, "gpt2-tiny", "clm", byte_tokenizer())
    assert lora.resolve_targets(hf, "gpt2", "q_proj,o_proj,down_proj") == ["c_attn", "attn.c_proj", "mlp.c_proj"]
    with pytest.raises(ConfigError, match="no linear layer named 'w_q' .* its linear layers are"):
        lora.resolve_targets(model, "zerotrain", "w_q")


def test_lora_trains_only_the_adapter_which_reloads_and_merges_to_the_same_eval_loss(tmp_path):
    from zerotrain.cli import main
    from zerotrain.trainer import Trainer, TrainingArguments

    run(options(tmp_path, max_steps=2, output_dir=str(tmp_path / "base")))
    cap = Capture()
    res, _ = run(options(tmp_path, model_name_or_path=str(tmp_path / "base"), model_config=None, lora_rank=4,
                         lora_alpha=16, lora_target_modules="q_proj,o_proj", learning_rate=1e-2, max_steps=4,
                         output_dir=str(tmp_path / "lora")), [cap])
    model = cap.trainer.model
    trainable = {n: p.numel() for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    # per block: qkv A (4 x 64) + B (192 x 4), proj A (4 x 64) + B (64 x 4); 2 blocks
    assert sum(trainable.values()) == 2 * (4 * 64 + 192 * 4 + 4 * 64 + 64 * 4) == 3072
    out = tmp_path / "lora"
    assert (out / "adapter_model.safetensors").is_file() and not (out / "model.safetensors").is_file()
    meta = json.loads((out / "adapter_config.json").read_text())
    assert meta["r"] == 4 and meta["lora_alpha"] == 16 and meta["target_modules"] == ["qkv", "proj"]
    eval_set = cap.trainer.eval_dataset

    def eval_loss(folder, adapter=None):
        m, info = models.load_model(str(folder), "clm")
        if adapter:
            lora.load_adapter(m, adapter)
        args = TrainingArguments(output_dir=str(tmp_path / "eval" / folder.name), max_steps=1, report_to="none",
                                 disable_tqdm=True)
        return Trainer(m, args, eval_set, eval_set, tokenizer=byte_tokenizer(), model_info=info).evaluate()["eval_loss"]

    assert eval_loss(tmp_path / "base", out) == pytest.approx(res["eval_loss"], rel=1e-6)
    assert eval_loss(tmp_path / "base") != pytest.approx(res["eval_loss"], rel=1e-6)  # the adapter matters
    assert main(["merge-lora", str(out), "--output_dir", str(tmp_path / "merged")]) == 0
    assert (tmp_path / "merged" / "model.safetensors").is_file()
    assert eval_loss(tmp_path / "merged") == pytest.approx(res["eval_loss"], rel=1e-5)


@pytest.mark.parametrize("stage", [1, 2])
def test_lora_with_zero_stages_and_gradient_checkpointing(tmp_path, stage):
    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": stage}}))
    cap = Capture()
    _, recs = run(options(tmp_path, model_config="llama-tiny", lora_rank=4, deepspeed=str(tmp_path / "ds.json"),
                          gradient_checkpointing=True, learning_rate=1e-2, max_steps=6), [cap])
    assert cap.trainer.engine.strategy.stage == stage
    assert getattr(cap.trainer.model.model, "gradient_checkpointing", False)
    got = [r["loss"] for r in recs if "loss" in r]
    assert got[-1] < got[0]


def test_merge_lora_of_an_hf_model_prints_its_one_line_and_no_bars(tmp_path, capfd):
    from transformers.utils import logging as hf_logging

    from zerotrain.cli import main

    hf_logging.enable_progress_bar()  # as in a fresh process
    hf, info = models.build_model(None, "gpt2-tiny", "clm", byte_tokenizer())
    models.save_model(tmp_path / "base", hf, info, hf.state_dict(), byte_tokenizer())
    hf_logging.enable_progress_bar()
    config = lora.apply_lora(hf, "gpt2", 4, None, 0.0, "q_proj", None)
    lora.save_adapter(tmp_path / "adapter", hf.state_dict(), config, str(tmp_path / "base"))
    capfd.readouterr()
    assert main(["merge-lora", str(tmp_path / "adapter"), "--output_dir", str(tmp_path / "merged")]) == 0
    out, err = capfd.readouterr()
    assert out.splitlines() == [f"merged 2 LoRA layers of {tmp_path / 'adapter'} into {tmp_path / 'base'}; "
                                f"wrote {tmp_path / 'merged'}"]
    assert "Loading" not in err and "it/s" not in err, err
