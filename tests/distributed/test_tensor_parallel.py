"""Tensor parallelism (DTensor, the "tensor_parallel" block) on real gloo worlds against one
process training the same model on the same global batch.

2 ranks are tensor 2; 4 ranks are data 2 x tensor 2 (ranks 0, 1 a tensor pair on data index
0). Every run has a sequence-length curriculum (a new length every step, then the top), fp32,
clipping at 1.0 (active: the norms start above 2). The embedding and head are split by the
vocabulary (the loss on sharded logits). Per-step losses (averaged over the data ranks) and
global gradient norms must equal the one-process run's within 1e-5, the gathered weights
within 1e-4 (AdamW turns rounding in a near-zero gradient into a full step for that element:
one in a few thousand lands 1.5e-5 off after 10 steps).
The GPT has no biases here: AdamW turns the attention key bias's gradient, which is zero but
for rounding, into full-size updates, so that weight is noise on any two runs.
"""

from __future__ import annotations

import pytest
import torch

import tp_scenarios as ts

STEPS = 10
GLOBAL, MICRO = 8, 2
BF16 = ts.config(GLOBAL, MICRO, 1, curriculum=False, bf16={"enabled": True})


def _close(got: dict, want: dict, rtol: float) -> None:
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert torch.allclose(got[k], v, rtol=rtol, atol=rtol * v.abs().max().item()), k


def _check(runs: list[dict], reference: dict, params_rtol: float = 1e-4) -> None:
    data_world = runs[0]["data_world"]
    losses = [sum(r["losses"][s] for r in runs) / len(runs) for s in range(STEPS)]  # every rank counts once per data index
    assert losses == pytest.approx(reference["losses"], rel=1e-5)
    for r in runs:
        assert r["norms"] == pytest.approx(reference["norms"], rel=1e-5)
        assert r["tokens"] == reference["tokens"]  # each token once, though every tensor rank reads it
        _close(r["params"], reference["params"], params_rtol)
    assert data_world * 2 == len(runs)


def two_rank_cases(tmp: str) -> dict:
    from zerotrain.errors import ConfigError

    out = {"gpt": ts.train(ts.config(GLOBAL, MICRO, 0, tensor=2), STEPS),
           "llama": ts.train(ts.config(GLOBAL, MICRO, 1, tensor=2), STEPS, model="llama")}
    # save at step 3 of 6, load into a fresh engine, continue
    out["straight"] = ts.train(ts.config(GLOBAL, MICRO, 1, tensor=2), 6, save=(f"{tmp}/ckpt", 3))
    out["resumed"] = ts.train(ts.config(GLOBAL, MICRO, 1, tensor=2), 6, load=f"{tmp}/ckpt")
    # fp16: an inf in tensor rank 1's loss at step 2 skips that step on both ranks
    fp16 = ts.config(GLOBAL, MICRO, 0, tensor=2, curriculum=False, fp16={"enabled": True, "initial_scale_power": 8})
    out["poisoned"] = ts.train(fp16, 3, poison=(1, 2))
    out["unpoisoned"] = ts.train(fp16, 2)
    out["bf16"] = ts.train(BF16 | {"tensor_parallel": {"autotp_size": 2}}, 4)
    # the HF model itself (its own names), saved for consolidation
    out["hf"] = ts.train(ts.config(GLOBAL, MICRO, 1, tensor=2, curriculum=False), 3, model="hf", save=(f"{tmp}/hf", 3))
    errors = {}
    for case in ("heads", "no_plan", "stage3", "vocab"):
        try:
            ts.bad_input(case)
        except ConfigError as e:
            errors[case] = str(e)
    out["errors"] = errors
    return out


def test_tensor_parallel_matches_one_process(world2, tmp_path):
    ranks = world2.run(two_rank_cases, str(tmp_path), timeout=400)
    _check([r["gpt"] for r in ranks], ts.train(ts.config(GLOBAL, MICRO, 0), STEPS))
    _check([r["llama"] for r in ranks], ts.train(ts.config(GLOBAL, MICRO, 1), STEPS, model="llama"))
    for r in ranks:
        # the vocabulary split: half the embedding rows, head rows and logits each (GPT's tie kept)
        half = {"embedding_rows": ts.VOCAB // 2, "head_rows": ts.VOCAB // 2, "logits": ts.VOCAB // 2}
        assert r["gpt"]["vocab"] == half | {"tied": True, "eval_logits": ("Tensor", ts.VOCAB)}
        assert r["llama"]["vocab"] == half | {"tied": False}
        assert r["gpt"]["seqlen"] == ts.SEQ
        assert r["resumed"]["losses"] == r["straight"]["losses"][3:]  # resume is bit-identical
        assert all(torch.equal(v, r["straight"]["params"][k]) for k, v in r["resumed"]["params"].items())
        assert r["poisoned"]["skipped"] == [0, 0, 1]
        assert all(torch.equal(v, r["unpoisoned"]["params"][k]) for k, v in r["poisoned"]["params"].items())
    # bf16: the split sums in another order, so agreement is bf16's (seen: 3.4e-5 losses, 1.7e-3 norms)
    bf16 = ts.train(BF16, 4)
    for r in ranks:
        assert r["bf16"]["losses"] == pytest.approx(bf16["losses"], rel=2e-4)
        assert r["bf16"]["norms"] == pytest.approx(bf16["norms"], rel=1e-2)
        assert r["bf16"]["params"]["blocks.0.qkv.weight"].dtype == torch.bfloat16
    errors = ranks[0]["errors"]
    assert errors == ranks[1]["errors"]
    assert "the model has 3 attention heads, not divisible by 2" in errors["heads"]
    assert "Sequential has no tensor-parallel plan" in errors["no_plan"]
    assert "zero_optimization.stage 3 with tensor_parallel: use stage 0, 1 or 2" in errors["stage3"]
    assert ("vocab_parallel_lm_head true: the vocabulary of 63 tokens does not divide by 2; set it to false"
            in errors["vocab"])
    assert all("\n" not in e for e in errors.values())
    consolidated_equals_gathered(tmp_path, ranks)


def _equal(got: dict, want: dict) -> None:
    """fp32 `got` equal to `want` (in bf16: the fp32 masters cast as the module computes with them)."""
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert got[k].dtype == torch.float32 and torch.equal(got[k].to(v.dtype), v), k


def consolidated_equals_gathered(tmp_path, ranks: list[dict]) -> None:
    """`zerotrain consolidate` of the tensor-2 checkpoints: the weights gathered from the live
    engine when it saved (GPT: fused qkv, rowwise, vocabulary-split tied embedding); the HF
    model's folder loads with plain transformers and gives the trained model's logits."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from zerotrain.checkpoint.consolidate import consolidate_checkpoint
    from zerotrain.cli import main
    from zerotrain.errors import CheckpointError

    _equal(consolidate_checkpoint(tmp_path / "ckpt"), ranks[0]["straight"]["saved"])
    folder = tmp_path / "hf_model"
    ts.llama().config.save_pretrained(folder)
    assert main(["consolidate", str(tmp_path / "hf"), str(folder)]) == 0
    _equal(load_file(folder / "model.safetensors"), ranks[0]["hf"]["saved"])
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        logits = model(input_ids=ts.global_batch(99, 2)).logits
        untrained = ts.llama().eval()(input_ids=ts.global_batch(99, 2)).logits
    assert torch.allclose(logits, ranks[0]["hf"]["probe_logits"], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(logits, untrained, atol=1e-3)  # the steps moved it
    # bad input, one line each: a tensor rank's files gone (from the manifest too); a checkpoint
    # saved before the split was recorded
    with pytest.raises(CheckpointError, match=r"^global_step3: tp_01-model_states.pt is missing \(tensor rank 1 of 2\); "
                       "the checkpoint is incomplete$"):
        consolidate_checkpoint(_rewritten(tmp_path / "hf/global_step3", tmp_path / "no_rank1/global_step3",
                                          drop="tp_01-"))
    with pytest.raises(CheckpointError, match=r"tp_00-model_states.pt does not record how its tensors are split.*"
                       r"save the whole model \(engine.save_16bit_model\)$"):
        consolidate_checkpoint(_rewritten(tmp_path / "hf/global_step3", tmp_path / "old/global_step3",
                                          unrecord="tp_00-model_states.pt"))


def _rewritten(src, dst, drop: str = "", unrecord: str = ""):
    """A copy of checkpoint folder `src` whose manifest still verifies: without the files named
    `drop...`, or with `unrecord`'s tensor_split record taken out."""
    import hashlib
    import json
    import shutil

    shutil.copytree(src, dst)
    manifest = json.loads((dst / "manifest.json").read_text())
    for f in [f for f in dst.iterdir() if drop and f.name.startswith(drop)]:
        f.unlink()
        del manifest["files"][f.name]
    if unrecord:
        states = torch.load(dst / unrecord, weights_only=True)
        del states["tensor_split"]
        torch.save(states, dst / unrecord)
        data = (dst / unrecord).read_bytes()
        manifest["files"][unrecord] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (dst / "manifest.json").write_text(json.dumps(manifest))
    return dst


def four_rank_cases(tmp: str) -> dict:
    out = {stage: ts.train(ts.config(GLOBAL, MICRO, stage, tensor=2), STEPS) for stage in (1, 2)}
    # bf16: separate fp32 masters, each tensor rank's sharded over its 2 data ranks
    bf16 = ts.config(GLOBAL, MICRO, 2, tensor=2, curriculum=False, bf16={"enabled": True})
    out["saved"] = ts.train(bf16, 3, save=(f"{tmp}/ckpt", 3))["saved"]
    return out


def test_tensor_and_data_parallel_match_one_process(world4, tmp_path):
    from zerotrain.checkpoint.consolidate import consolidate_checkpoint

    ranks = world4.run(four_rank_cases, str(tmp_path), timeout=400)
    assert [r[1]["data"] for r in ranks] == [0, 0, 1, 1]  # tensor varies fastest
    reference = ts.train(ts.config(GLOBAL, MICRO, 0), STEPS)
    for stage in (1, 2):
        _check([r[stage] for r in ranks], reference)
    _equal(consolidate_checkpoint(tmp_path / "ckpt"), ranks[0]["saved"])  # data pieces glued, then tensor pieces
    assert ranks[0]["saved"]["blocks.0.fc.weight"].dtype == torch.bfloat16


def three_way_case(tmp: str) -> dict:
    import pipe_scenarios as ps

    from zerotrain.pipe import PipeModelDataParallelTopology

    topology = PipeModelDataParallelTopology(num_pp=2, num_mp=2, num_dp=2)
    return ps.pipeline_run(ps.config(GLOBAL, MICRO, 1), STEPS, topology=topology, save=(f"{tmp}/ckpt", STEPS))


def test_data_pipeline_and_tensor_parallel_match_one_process(world8, tmp_path):
    """The pipeline scenario (curriculum, layer drop, a tied embedding) on 2 x 2 x 2 ranks;
    its checkpoint (pipe_XX-tp_YY- files) consolidates into the stages' gathered weights."""
    import pipe_scenarios as ps

    from zerotrain.checkpoint.consolidate import consolidate_checkpoint

    ranks = world8.run(three_way_case, str(tmp_path), timeout=500)
    stages = ranks[4]["saved"] | ranks[0]["saved"]  # stage 1, then stage 0 (the tied embedding: from the first)
    assert sorted(p.name for p in (tmp_path / "ckpt" / f"global_step{STEPS}").glob("*model_states.pt")) == [
        f"pipe_0{s}-tp_0{t}-model_states.pt" for s in (0, 1) for t in (0, 1)]
    _equal(consolidate_checkpoint(tmp_path / "ckpt"), stages)
    assert [(r["stage"], r["data"]) for r in ranks] == [(0, 0), (0, 0), (0, 1), (0, 1), (1, 0), (1, 0), (1, 1), (1, 1)]
    reference = ps.reference_run(ps.config(GLOBAL, MICRO, 1), STEPS)
    for r in ranks:
        assert r["losses"] == pytest.approx(reference["losses"], rel=1e-5)
        assert r["norms"] == pytest.approx(reference["norms"], rel=1e-5)
        assert r["tokens"] == reference["tokens"]
