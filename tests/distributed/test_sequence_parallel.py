"""Ulysses sequence parallelism (`sequence_parallel_size`) on real gloo worlds against one
process training the same model on the same global batch.

2 ranks are sequence 2; 4 ranks are sequence 4, and data 2 x sequence 2 (ranks 0, 1 a
sequence group on data index 0). Labels end in -100 at a different place in each row, so the
ranks of a group hold different counts of real labels; fp32, clipping at 1.0 (active). The
per-step losses, the gradient norms and the final weights must equal the one-process run's
within 1e-5, at ZeRO 0 and 3, for zerotrain's GPT and an HF LLaMA (through the config key
and through DeepSpeed's ALST names); one run has a sequence-length curriculum (odd lengths: padded).
A checkpoint saved at S = 2 (ZeRO 1) resumes in one process.
AdamW's eps is 1e-4 (sp_scenarios.py): with torch's 1e-8, an element whose gradient is zero but
for rounding moves a full learning-rate step either way, so its weight would differ by 2 x lr
between any two orders of summation (measured: 5 elements in 2048 at 2.4e-4 of the largest
weight); with it the weights agree within 2e-6.
"""

from __future__ import annotations

import pytest
import torch

import sp_scenarios as ss

STEPS, MICRO, GA = 4, 1, 2


def _check(runs: list[dict], reference: dict, sequence: int) -> None:
    for group in range(0, len(runs), sequence):  # the ranks of a sequence group report its loss
        assert all(r["losses"] == runs[group]["losses"] for r in runs[group:group + sequence])
    losses = [sum(r["losses"][s] for r in runs) / len(runs) for s in range(STEPS)]  # the mean over data indices
    assert losses == pytest.approx(reference["losses"], rel=1e-5)
    for r in runs:
        assert r["norms"] == pytest.approx(reference["norms"], rel=1e-5)
        if r["logits"] is not None:  # the cut made by the engine: tokens and whole logits as one process's
            assert r["tokens"] == reference["tokens"]  # each token counted once, though S ranks read it
            assert torch.allclose(r["logits"], reference["logits"], rtol=1e-5, atol=1e-5)
        assert r["params"].keys() == reference["params"].keys()
        for k, v in reference["params"].items():
            if k.endswith("k_proj.bias"):  # Qwen2's: softmax ignores a shift common to every key, so its
                continue  # gradient is rounding alone, and AdamW turns that into steps of any sign
            assert torch.allclose(r["params"][k], v, rtol=1e-5, atol=1e-5 * v.abs().max().item()), k


def _global(data: int) -> int:
    return MICRO * GA * data


def two_rank_cases(tmp: str) -> dict:
    return {"stage0": ss.train(ss.config(_global(1), MICRO, 0, sequence=2, curriculum=True), STEPS),
            "saved": ss.train(ss.config(_global(1), MICRO, 1, sequence=2), STEPS, save=(f"{tmp}/ckpt", 2)),
            "stage3": ss.train(ss.config(_global(1), MICRO, 3, sequence=2), STEPS),
            # an HF LLaMA: one key/value head (repeated for the 2 ranks) through the config key, sdpa;
            # two through DeepSpeed's names (the mpu, the loader adapter's pieces), eager
            "llama_kv1": ss.train(ss.config(_global(1), MICRO, 3, sequence=2), STEPS, hf=(1, "sdpa")),
            "llama_alst": ss.train(ss.config(_global(1), MICRO, 0), STEPS, hf=(2, "eager"), alst=2),
            "errors": {case: ss.bad_input(case) for case in ("heads", "qwen_heads", "world", "tensor", "encoder")}}


def test_sequence_parallel_matches_one_process(world2, tmp_path):
    ranks = world2.run(two_rank_cases, str(tmp_path), timeout=300)
    # saved at S = 2 after step 2, resumed by one process: the last steps as the S = 2 run's
    resumed = ss.train(ss.config(_global(1), MICRO, 1), STEPS, load=f"{tmp_path}/ckpt")
    assert resumed["losses"] == pytest.approx(ranks[0]["saved"]["losses"][2:], rel=1e-5)
    assert resumed["norms"] == pytest.approx(ranks[0]["saved"]["norms"][2:], rel=1e-5)
    _check([r["stage0"] for r in ranks], ss.train(ss.config(_global(1), MICRO, 0, curriculum=True), STEPS), 2)
    _check([r["stage3"] for r in ranks], ss.train(ss.config(_global(1), MICRO, 0), STEPS), 2)
    _check([r["llama_kv1"] for r in ranks], ss.train(ss.config(_global(1), MICRO, 0), STEPS, hf=(1, "sdpa")), 2)
    _check([r["llama_alst"] for r in ranks], ss.train(ss.config(_global(1), MICRO, 0), STEPS, hf=(2, "eager")), 2)
    for r in ranks:
        errors = r["errors"]
        assert errors["heads"].startswith("sequence_parallel_size 2: the model has 3 attention heads per layer, "
                                          "not a multiple of 2")
        assert errors["qwen_heads"].startswith("sequence_parallel_size 2: the model has 3 attention heads per layer, "
                                               "not a multiple of 2")
        assert errors["world"].startswith("sequence_parallel_size 3: the job has 2 processes, not a multiple of 3")
        assert errors["tensor"].startswith("sequence_parallel_size with tensor_parallel: the two are not combined")
        assert errors["encoder"].startswith("sequence_parallel_size 2: PreLNBertMLM is not a causal decoder")
        assert all("\n" not in e for e in errors.values())


# Qwen2 (biases on q, k, v; one key/value head, repeated for the 2 ranks) through the config key
# at ZeRO 3; Mistral with a sliding window of 6 over sequences of 15 (the window's mask made
# after the exchange) through DeepSpeed's names, sdpa and eager
QWEN2 = (1, "sdpa", "qwen2")
MISTRAL_SDPA = (2, "sdpa", "mistral", {"sliding_window": 6})
MISTRAL_EAGER = (1, "eager", "mistral", {"sliding_window": 6})


def qwen_mistral_cases() -> dict:
    return {"qwen2": ss.train(ss.config(_global(1), MICRO, 3, sequence=2), STEPS, hf=QWEN2),
            "mistral_sdpa": ss.train(ss.config(_global(1), MICRO, 0), STEPS, hf=MISTRAL_SDPA, alst=2),
            "mistral_eager": ss.train(ss.config(_global(1), MICRO, 0, sequence=2), STEPS, hf=MISTRAL_EAGER),
            "packed": ss.bad_input("packed")}


def test_qwen2_and_mistral_attention_match_one_process(world2):
    ranks = world2.run(qwen_mistral_cases, timeout=300)
    for name, hf in (("qwen2", QWEN2), ("mistral_sdpa", MISTRAL_SDPA), ("mistral_eager", MISTRAL_EAGER)):
        _check([r[name] for r in ranks], ss.train(ss.config(_global(1), MICRO, 0), STEPS, hf=hf), 2)
    for r in ranks:  # packed rows (positions restarting) cannot be cut by sequence: one line
        assert r["packed"].startswith("sequence_parallel_size: position_ids (packed sequences) are not split")
        assert "\n" not in r["packed"]


def four_rank_cases() -> dict:
    return {"seq4": ss.train(ss.config(_global(1), MICRO, 3, sequence=4), STEPS),
            "data2_seq2": ss.train(ss.config(_global(2), MICRO, 0, sequence=2), STEPS),
            "data2_seq2_stage3": ss.train(ss.config(_global(2), MICRO, 3, sequence=2), STEPS)}


def test_sequence_and_data_parallel_match_one_process(world4):
    ranks = world4.run(four_rank_cases, timeout=400)
    _check([r["seq4"] for r in ranks], ss.train(ss.config(_global(1), MICRO, 0), STEPS), 4)
    reference = ss.train(ss.config(_global(2), MICRO, 0), STEPS)
    _check([r["data2_seq2"] for r in ranks], reference, 2)
    _check([r["data2_seq2_stage3"] for r in ranks], reference, 2)
