"""Pipeline parallelism on real gloo worlds against one process running the same layers.

4 ranks are data-parallel 2 x pipeline 2 (ranks 0, 1 hold stage 0; 2, 3 stage 1); 2 ranks
are a pipeline of 2. Every run has a sequence-length curriculum (a new length every step up
to the top, then the top), progressive layer drop and a tied embedding, fp32, clipping at
1.0 (active: the norms are ~10). One call per world runs all of its cases, since a 4-rank
spawn costs 15-19 s here.
"""

from __future__ import annotations

import pytest
import torch

import pipe_scenarios as ps

STEPS = 10
GLOBAL, MICRO = 8, 2  # dp 2: accumulation 2; dp 1: accumulation 4


def _merged(results: list[dict]) -> dict:
    """One full model from the stages of data-parallel rank 0."""
    out = {}
    for r in results:
        if r["data"] == 0:
            out.update(ps.to_reference_names(r["params"]))
    return out


def _close(got: dict, want: dict, rtol: float) -> None:
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert torch.allclose(got[k], v, rtol=rtol, atol=rtol * v.abs().max().item()), k


def four_rank_cases(tmp: str) -> dict:
    import zerotrain.checkpoint.consolidate as consolidate

    out = {}
    for stage in (0, 1):
        out[f"zero{stage}"] = ps.pipeline_run(ps.config(GLOBAL, MICRO, stage), STEPS)
    # an inf in one rank's backward (rank 1: stage 0 of the second pipeline) at step 3
    import os

    os.environ.update(POISON_STEP="3", POISON_RANK="1")
    try:
        out["poisoned"] = ps.pipeline_run(ps.config(GLOBAL, MICRO, 0), 4, poison=True)
    finally:
        del os.environ["POISON_STEP"], os.environ["POISON_RANK"]
    out["unpoisoned"] = ps.pipeline_run(ps.config(GLOBAL, MICRO, 0), 3, poison=True)
    # save at step 3 of 6, load into fresh engines, continue; then consolidate the end
    ckpt = f"{tmp}/ckpt"
    out["straight"] = ps.pipeline_run(ps.config(GLOBAL, MICRO, 1), 6, save=(ckpt, 3))
    out["resumed"] = ps.pipeline_run(ps.config(GLOBAL, MICRO, 1), 6, load=ckpt, save=(f"{tmp}/end", 6))
    import torch.distributed as dist

    dist.barrier()
    out["consolidated"] = consolidate.consolidate_checkpoint(f"{tmp}/end") if dist.get_rank() == 0 else None
    out["mpu"] = ps.mpu_run(4)
    return out


def test_data_and_pipeline_parallel_match_one_process(world4, tmp_path):
    ranks = world4.run(four_rank_cases, str(tmp_path), timeout=400)
    assert [(r["zero0"]["stage"], r["zero0"]["data"]) for r in ranks] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    reference = ps.reference_run(ps.config(GLOBAL, MICRO, 0), STEPS)
    for stage in (0, 1):
        runs = [r[f"zero{stage}"] for r in ranks]
        assert runs[0]["seqlens"] == [4, 6, 8, 10, 12, 14, 16, 16, 16, 16]
        assert runs[0]["built"] == 7  # one stage set per length
        # ZeRO 0 under 1F1B reduces during the last micro-batch's backward; ZeRO 1 (ties first) after
        assert all(all(run["armed"]) == (stage == 0) and any(run["armed"]) == (stage == 0) for run in runs)
        assert reference["tokens"][:2] == [8 * 4, 8 * 4 + 8 * 6]  # the global batch at each cut length
        for run in runs:
            assert run["tokens"] == reference["tokens"]  # every token once, on every rank
            assert run["losses"] == pytest.approx(reference["losses"], rel=1e-5)
            assert run["norms"] == pytest.approx(reference["norms"], rel=1e-5)
        _close(_merged(runs), reference["params"], 1e-5)
        # the data-parallel replicas of a stage hold the same weights, bit for bit
        for a, b in ((runs[0], runs[1]), (runs[2], runs[3])):
            assert all(torch.equal(a["params"][k], b["params"][k]) for k in a["params"])
        # the tied copies on both stages stayed equal
        assert torch.equal(runs[0]["params"]["tied_modules.embed.weight"], runs[2]["params"]["tied_modules.embed.weight"])
    # the inf on rank 1 skipped step 3 on all four ranks and changed no weight
    for r in ranks:
        assert r["poisoned"]["skipped"] == [0, 0, 0, 1]
        assert r["poisoned"]["norms"][3] != r["poisoned"]["norms"][3] or r["poisoned"]["norms"][3] == float("inf")
        assert all(torch.equal(v, r["unpoisoned"]["params"][k]) for k, v in r["poisoned"]["params"].items())
    # resume is bit-identical: the same losses and weights as the run that saved
    for r in ranks:
        assert r["resumed"]["losses"] == r["straight"]["losses"][3:]
        assert all(torch.equal(v, r["straight"]["params"][k]) for k, v in r["resumed"]["params"].items())
    # initialize(mpu=...): ZeRO over its data-parallel pairs, the norm over its model-parallel
    # pairs with the replicas counted once: the one-process norm
    mpu_reference = ps.reference_run(ps.config(GLOBAL, MICRO, 1, curriculum=False, pld=False), 4)
    for r in ranks:
        assert r["mpu"]["ga"] == 2 and r["mpu"]["data_world"] == 2
        assert r["mpu"]["norms"] == pytest.approx(mpu_reference["norms"], rel=1e-5)
    # consolidate turns the stage files into one model
    merged = _merged([r["resumed"] for r in ranks])
    whole = ps.to_reference_names(ranks[0]["consolidated"])
    assert whole.keys() == merged.keys()
    assert all(torch.equal(whole[k], merged[k]) for k in merged)


SCHEDULES = [("gpipe", 1, "loop"), ("1f1b", 1, "loop"), ("interleaved_1f1b", 2, "loop"), ("looped_bfs", 2, "loop"),
             ("interleaved_zero_bubble", 2, "loop"), ("zbv_zero_bubble", 2, "v"), ("dualpipev", 2, "v")]


def two_rank_cases() -> dict:
    from zerotrain.errors import ConfigError, DataError

    out = {"parity": ps.pipeline_run(ps.config(GLOBAL, MICRO, 0), STEPS)}
    for name, virtual, placement in SCHEDULES:
        cfg = ps.config(GLOBAL, MICRO, 0, pipeline={"schedule": name, "virtual_stages": virtual})
        out[name] = ps.pipeline_run(cfg, 4, virtual_stages=virtual, placement=placement)["losses"]
    # recompute activations every 2 layers (pipeline.activation_checkpoint_interval acts)
    out["recomputed"] = ps.pipeline_run(ps.config(GLOBAL, MICRO, 0, pipeline={"activation_checkpoint_interval": 2}),
                                        4)["losses"]
    out["eval"] = ps.evaluate(ps.config(GLOBAL, MICRO, 0))
    out["dataloader"] = ps.pipeline_run(ps.config(GLOBAL, MICRO, 0), 2, loader=True)["losses"]  # set_dataloader
    out["one_micro"] = ps.pipeline_run(ps.config(MICRO, MICRO, 0), 2)["losses"]  # 1f1b, fewer micro-batches than stages
    errors = {}
    for case in ("few_layers", "indivisible", "dry"):
        try:
            ps.bad_input(case)
        except (ConfigError, DataError) as e:
            errors[case] = str(e)
    out["errors"] = errors
    return out


def test_pipeline_only_and_every_schedule(world2):
    ranks = world2.run(two_rank_cases, timeout=400)
    reference = ps.reference_run(ps.config(GLOBAL, MICRO, 0), STEPS)
    one_micro = ps.reference_run(ps.config(MICRO, MICRO, 0), 2)
    for r in ranks:
        assert r["parity"]["losses"] == pytest.approx(reference["losses"], rel=1e-5)
        assert r["parity"]["tokens"] == reference["tokens"]
        for name, _, _ in SCHEDULES:  # each schedule, the same losses
            assert r[name] == pytest.approx(reference["losses"][:4], rel=1e-5), name
        assert r["recomputed"] == pytest.approx(reference["losses"][:4], rel=1e-5)
        assert r["eval"] == pytest.approx(ps.reference_eval(), rel=1e-5)
        assert r["dataloader"] == pytest.approx(reference["losses"][:2], rel=1e-5)
        assert r["one_micro"] == pytest.approx(one_micro["losses"], rel=1e-5)
    _close(_merged([r["parity"] for r in ranks]), reference["params"], 1e-5)
    errors = ranks[0]["errors"]
    assert errors == ranks[1]["errors"]  # the same line on every rank
    assert "has 3 layers for 4 stages" in errors["few_layers"]
    assert "world size 2 is not divisible by the pipeline size 3" in errors["indivisible"]
    assert "data_iter ran out after 1 of the 4 micro-batches" in errors["dry"]
    assert all("\n" not in e for e in errors.values())
