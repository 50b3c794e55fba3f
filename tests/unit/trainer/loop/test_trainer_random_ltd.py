"""zerotrain train with random-LTD: `layer_tokens` logged beside `tokens`, the banner naming
it, and the trainer's sampler's dealing given to the engine."""

from __future__ import annotations

from trainer_helpers import Capture, options, run

from zerotrain.data_efficiency import layer_averaged_length
from zerotrain.trainer.report.banner import banner


def test_layer_tokens_beside_tokens(tmp_path):
    ltd = {"enabled": True, "total_layer_num": 4, "random_ltd_layer_num": 2, "random_ltd_layer_id": [1, 2],
           "model_mask_name": "attention_mask", "model_type": "decoder", "hidden_state_order": "batch_seq_dim",
           "random_ltd_schedule": {"min_value": 8, "max_value": 32, "schedule_type": "fixed_linear",
                                   "schedule_config": {"require_steps": 4, "seq_per_step": 8}}}
    ds = {"data_efficiency": {"enabled": True, "data_routing": {"enabled": True, "random_ltd": ltd}}}
    capture = Capture()
    _, recs = run(options(tmp_path, model_config="gpt-small", deepspeed=ds, max_steps=5, validation_split_percentage=0),
                  [capture])
    recs = [r for r in recs if "loss" in r]  # the training records
    engine = capture.trainer.engine
    assert engine.sample_dealing == "blocked"
    assert "features: random-LTD (2 of 4 layers keep 8 -> 32 tokens over 4 steps)" in banner(engine, engine.module,
                                                                                           "clm", 5, 1)
    reserved = [8, 8, 16, 24, 32]  # fixed_linear 8 -> 32 over 4 steps, multiples of 8
    assert [r["ltd_seq"] for r in recs] == reserved
    assert [r["tokens"] for r in recs] == [4 * 32 * k for k in range(1, 6)]
    expected, total = [], 0
    for r in reserved:
        total += 4 * layer_averaged_length(32, r, 2, 4)
        expected.append(total)
    assert [r["layer_tokens"] for r in recs] == expected == [80, 160, 256, 368, 496]
