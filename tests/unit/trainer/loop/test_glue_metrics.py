"""The GLUE metrics against scipy and scikit-learn (used here only), and fine-tunes in this process
whose reported metrics are recomputed from the model's own predictions."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from glue_layouts import rows, write_task, write_tsv
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef
from trainer_helpers import run

from zerotrain.trainer.loop import glue_metrics as gm


@pytest.mark.parametrize("seed", range(6))
def test_each_metric_equals_the_reference_implementation(seed):
    g = torch.Generator().manual_seed(seed)
    n, classes = 50 + 17 * seed, 2 + seed % 2
    labels = torch.randint(classes, (n,), generator=g)
    pred = torch.where(torch.rand(n, generator=g) < 0.6, labels, torch.randint(classes, (n,), generator=g))
    assert gm.accuracy(pred, labels) == pytest.approx(accuracy_score(labels, pred), abs=1e-12)
    assert gm.matthews_correlation(pred, labels) == pytest.approx(matthews_corrcoef(labels, pred), abs=1e-12)
    if classes == 2:
        assert gm.f1(pred, labels) == pytest.approx(f1_score(labels, pred), abs=1e-12)
    x = torch.randn(n, generator=g, dtype=torch.float64)
    y = (x + torch.randn(n, generator=g, dtype=torch.float64)).round(decimals=seed % 3)  # ties when rounded
    assert gm.pearson(x, y) == pytest.approx(pearsonr(x.numpy(), y.numpy())[0], abs=1e-12)
    assert gm.spearmanr(x.round(decimals=1), y) == pytest.approx(spearmanr(x.round(decimals=1).numpy(), y.numpy())[0],
                                                                 abs=1e-12)


def test_task_metrics_are_named_as_hf_names_them():
    logits = torch.tensor([[2.0, 1.0], [0.0, 3.0], [1.0, 0.0], [0.0, 1.0]])
    labels = torch.tensor([0.0, 1.0, 1.0, 1.0])
    assert set(gm.glue_metrics("cola")(logits, labels)) == {"matthews_correlation"}
    mrpc = gm.glue_metrics("mrpc")(logits, labels)
    assert mrpc == pytest.approx({"accuracy": 0.75, "f1": 0.8, "combined_score": 0.775})
    assert set(gm.glue_metrics("mnli")(torch.randn(4, 3), torch.tensor([0.0, 1, 2, 1]))) == {"accuracy"}
    stsb = gm.glue_metrics("stsb")(torch.tensor([[0.5], [1.0], [3.0], [2.0]]), torch.tensor([0.0, 2.0, 4.5, 3.0]))
    assert set(stsb) == {"pearson", "spearmanr", "combined_score"} and stsb["spearmanr"] == pytest.approx(1.0)
    assert gm.matthews_correlation(torch.ones(5), torch.tensor([0, 1, 1, 0, 1])) == 0.0  # undefined: 0


def _options(tmp_path, **extra):
    base = {"model_config": "bert-tiny", "output_dir": str(tmp_path / "out"), "block_size": 48,
            "per_device_train_batch_size": 8, "max_steps": 12, "learning_rate": 2e-3, "logging_steps": 4,
            "save_strategy": "no", "cache_dir": str(tmp_path / "cache"), "disable_tqdm": True, "report_to": "none"}
    base.update(extra)
    return base


def test_stsb_regression_from_user_files_reports_pearson_and_spearman_of_its_predictions(tmp_path):
    train = write_tsv(tmp_path / "train.tsv", "stsb", rows("stsb", 64, 0))
    dev = write_tsv(tmp_path / "dev.tsv", "stsb", rows("stsb", 20, 1))
    test = write_tsv(tmp_path / "test.tsv", "stsb", rows("stsb", 23, 2))
    results, _ = run(_options(tmp_path, task_name="stsb", train_file=str(train), validation_file=str(dev),
                              test_file=str(test), do_predict=True))
    assert {"eval_loss", "eval_pearson", "eval_spearmanr", "eval_combined_score"} <= set(results)
    assert "eval_accuracy" not in results
    lines = (tmp_path / "out" / "predictions.jsonl").read_text().splitlines()
    predicted = np.array([json.loads(line)["label"] for line in lines])
    gold = np.array([float(label) for _, _, label in rows("stsb", 23, 2)])
    assert len(predicted) == 23 and predicted.dtype == np.float64  # one score per row, not a class
    assert results["test_pearson"] == pytest.approx(pearsonr(predicted, gold)[0], abs=1e-6)
    assert results["test_spearmanr"] == pytest.approx(spearmanr(predicted, gold)[0], abs=1e-6)
    assert results["test_loss"] == pytest.approx(float(np.mean((predicted - gold) ** 2)), rel=1e-5)
    config = json.loads((tmp_path / "out" / "zerotrain_model.json").read_text())
    assert config["config"]["num_labels"] == 1  # one output


def test_cola_from_its_folder_reports_matthews_correlation_of_its_predictions(tmp_path):
    written = write_task(tmp_path / "glue", "cola", n_train=64, n_dev=30)
    # every fourth dev label flipped: a model that learnt the rule scores well below 1, so a metric over
    # the wrong rows (or a wrong formula) cannot agree with the recomputation by chance
    written["validation"] = [(a, b, str(1 - int(y)) if i % 4 == 0 else y) for i, (a, b, y) in
                             enumerate(written["validation"])]
    write_tsv(tmp_path / "glue" / "CoLA" / "dev.tsv", "cola", written["validation"])
    results, records = run(_options(tmp_path, task_name="cola", data_dir=str(tmp_path / "glue"), max_steps=24,
                                    eval_strategy="steps", eval_steps=12, learning_rate=3e-3))
    evals = [r for r in records if "eval_matthews_correlation" in r]
    assert [r["step"] for r in evals] == [12, 24] and "eval_f1" not in results
    assert 0.1 < results["eval_matthews_correlation"] < 0.9  # it learnt the rule: both classes predicted
    from zerotrain.trainer.data.glue import encode_fn
    from zerotrain.trainer.data.tokenizer import byte_tokenizer
    from zerotrain.trainer.model.build import load_model

    model, _ = load_model(str(tmp_path / "out"), "classification", 2)
    model.eval()
    enc = encode_fn(byte_tokenizer(), 48, pair=False)({"text_a": [a for a, _, _ in written["validation"]],
                                                        "labels": [0] * 30})
    with torch.no_grad():
        pred = [model(torch.tensor([ids]), token_type_ids=torch.tensor([types])).argmax(-1).item()
                for ids, types in zip(enc["input_ids"], enc["token_type_ids"])]
    gold = [int(label) for _, _, label in written["validation"]]
    assert results["eval_matthews_correlation"] == pytest.approx(matthews_corrcoef(gold, pred), abs=1e-9)
