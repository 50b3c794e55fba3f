"""The PLD recipe's BERT pretraining as written, through `zerotrain train`: the seed's DeepSpeed config
(only the batch numbers scaled to this machine: Adam with bias_correction false, prescale_gradients
with gradient_predivide_factor 8 in fp16, the PLD block), its BERT model config keys, and its
"warmup linear decay exp" schedule from the options."""

from __future__ import annotations

import json
import math

import pytest
from trainer_helpers import Capture, options, run

SEED_DS = {"train_batch_size": 4096, "train_micro_batch_size_per_gpu": 16, "steps_per_print": 1000,
           "prescale_gradients": True, "gradient_predivide_factor": 8,
           "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "weight_decay": 0.01, "bias_correction": False}},
           "gradient_clipping": 1.0, "wall_clock_breakdown": False, "fp16": {"enabled": True, "loss_scale": 0},
           "progressive_layer_drop": {"enabled": True, "theta": 0.5, "gamma": 0.001}}
SEED_BERT = {"vocab_size_or_config_json_file": 259, "hidden_size": 64, "num_hidden_layers": 3,
             "num_attention_heads": 2, "intermediate_size": 128, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
             "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 64, "type_vocab_size": 2,
             "initializer_range": 0.02}


def test_the_seeds_pretraining_config_runs_as_written(tmp_path):
    from zerotrain.optim.uncorrected_adam import UncorrectedAdam

    ds = {**SEED_DS, "train_batch_size": 8, "train_micro_batch_size_per_gpu": 4}  # the batch numbers, scaled
    (tmp_path / "ds.json").write_text(json.dumps(ds), encoding="utf-8")
    (tmp_path / "bert.json").write_text(json.dumps(SEED_BERT), encoding="utf-8")
    steps = 8
    capture = Capture()
    results, records = run(options(tmp_path, model_config=str(tmp_path / "bert.json"), task="mlm",
                                   deepspeed=str(tmp_path / "ds.json"), max_steps=steps, block_size=32,
                                   lr_scheduler_type="warmup_linear_decay_exp", warmup_ratio=0.25,
                                   lr_scheduler_kwargs='{"decay_rate": 0.99, "decay_steps": 3}'), [capture])
    engine = capture.trainer.engine
    assert isinstance(engine.optimizer, UncorrectedAdam) or any(
        isinstance(o, UncorrectedAdam) for o in vars(engine.optimizer).values())
    cfg = engine.config
    assert cfg.fp16.enabled and cfg.prescale_gradients and cfg.gradient_predivide_factor == 8
    assert cfg.gradient_accumulation_steps == 2 and engine.loss_scaler is not None
    logged = [r for r in records if "loss" in r]
    assert [r["step"] for r in logged] == list(range(1, steps + 1)) and all(math.isfinite(r["loss"]) for r in logged)
    # theta after the s-th step is theta(s - 1) of spec 2 (updated before each step with the steps done)
    for r in logged:
        assert r["pld_theta"] == pytest.approx(0.5 * math.exp(-0.001 * (r["step"] - 1)) + 0.5, rel=1e-12)
    # the lr after step s: 1e-3 x the recipe's multiplier (warmup 2 of 8 steps, then 0.99 per 3 steps)
    assert engine.skipped_steps == 0
    for r in logged:
        s = r["step"]
        assert r["lr"] == pytest.approx(1e-3 * (s / 2 if s < 2 else 0.99 ** ((s - 2) / 3)), rel=1e-9)
    model = json.loads((tmp_path / "out" / "zerotrain_model.json").read_text())["config"]
    assert (model["n_embd"], model["n_layer"], model["n_inner"], model["dropout"]) == (64, 3, 128, 0.1)
