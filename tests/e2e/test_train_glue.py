"""GLUE fine-tuning end to end: `zerotrain train --nproc_per_node 2 --task_name mnli --data_dir ...
--init_from <a PLD-pretrained folder>` with the seed's fine-tuning DeepSpeed config (batch numbers
scaled, fp32), and the metrics it reports recomputed here from the saved model's own predictions."""

from __future__ import annotations

import json

import pytest
import torch
from e2e_helpers import ok, state, zerotrain
from glue_layouts import write_task
from sklearn.metrics import accuracy_score

BERT = {"vocab_size_or_config_json_file": 259, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 128, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 64, "type_vocab_size": 2,
        "initializer_range": 0.02}
GLUE_DS = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "steps_per_print": 10,
           "optimizer": {"type": "Adam", "params": {"lr": 3e-3, "weight_decay": 0.0, "bias_correction": False}},
           "gradient_clipping": 1.0, "fp16": {"enabled": False}}  # the seed's has fp16 on: fp32 so that the
# predictions recomputed here in fp32 are the ones the job scored


def _pretrained(folder, cfg_path):
    """A folder as `zerotrain train --task mlm` with PLD writes it (MLM weights, zerotrain_model.json)."""
    from zerotrain.trainer.data.tokenizer import byte_tokenizer
    from zerotrain.trainer.model.build import build_model, save_model

    torch.manual_seed(0)
    model, info = build_model(None, str(cfg_path), "mlm", byte_tokenizer())
    save_model(folder, model, info, model.state_dict(), byte_tokenizer())


def _predict(run_dir, rows):
    from zerotrain.trainer.data.glue import encode_fn
    from zerotrain.trainer.data.tokenizer import byte_tokenizer
    from zerotrain.trainer.model.build import load_model

    model, _ = load_model(str(run_dir), "classification", 3)
    model.eval()
    enc = encode_fn(byte_tokenizer(), 64, pair=True)({"text_a": [a for a, _, _ in rows],
                                                       "text_b": [b for _, b, _ in rows], "labels": [0] * len(rows)})
    with torch.no_grad():
        return [model(torch.tensor([ids]), token_type_ids=torch.tensor([types])).argmax(-1).item()
                for ids, types in zip(enc["input_ids"], enc["token_type_ids"])]


def test_mnli_fine_tune_on_two_processes_reports_matched_and_mismatched(tmp_path):
    written = write_task(tmp_path / "GlueData", "mnli", n_train=48, n_dev=13)  # odd sizes: ranks get padded
    (tmp_path / "bert.json").write_text(json.dumps(BERT), encoding="utf-8")
    _pretrained(tmp_path / "pretrained", tmp_path / "bert.json")
    proc = ok(zerotrain(tmp_path, "train", "--nproc_per_node", "2", "--task_name", "MNLI", "--data_dir", "GlueData",
                        "--model_config", "bert.json", "--init_from", "pretrained", "--deepspeed",
                        json.dumps(GLUE_DS), "--max_seq_length", "64", "--num_train_epochs", "2",
                        "--learning_rate", "3e-3", "--output_dir", "out", "--save_strategy", "no",
                        "--cache_dir", "cache", "--disable_tqdm", "--report_to", "none", timeout=240))
    out = proc.stdout
    assert "missing keys (newly initialised): pooler.weight, pooler.bias, classifier.weight, classifier.bias" in out
    assert "unexpected keys (ignored): decoder.bias, dense.bias, dense.weight, ln.bias, ln.weight" in out
    assert "2 processes" in out
    results = state(tmp_path / "out")
    assert results["global_step"] == 12  # 48 rows / 8 per step x 2 epochs
    for suffix, split in (("", "validation"), ("_mm", "validation_mm")):
        gold = [("entailment", "neutral", "contradiction").index(label) for _, _, label in written[split]]
        pred = _predict(tmp_path / "out", written[split])
        assert results[f"eval_accuracy{suffix}"] == pytest.approx(accuracy_score(gold, pred), abs=1e-9)
        assert f"eval_loss{suffix}" in results
    assert "eval_f1" not in results  # MNLI's metric is accuracy only
