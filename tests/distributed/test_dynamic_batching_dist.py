"""Dynamic batching through initialize(training_data=...) on 2 gloo ranks against 1 process:
the same token-budget batches split across the ranks, the same per-step LR, losses within
1e-5, and a resume from a checkpoint that continues the batch sequence bit for bit."""

from __future__ import annotations

import pytest
import torch

from asserts import assert_params_close
from dynamic_batching_scenarios import config, dataset, train_and_resume
from zerotrain.data.dynamic_batching import plan_epoch
from zerotrain.schedules import WarmupLR

STEPS, SAVE_AT = 8, 3


def warmup_lrs(steps: int) -> list[float]:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = WarmupLR(opt, warmup_min_lr=0.0, warmup_max_lr=3e-3, warmup_num_steps=3, warmup_type="linear")
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        sched.step()
    return out


def test_two_ranks_match_one_process_and_resume(world2, tmp_path):
    ranks = world2.run(train_and_resume, config(ga=1), str(tmp_path / "two"), STEPS, SAVE_AT)
    ref = train_and_resume(config(ga=2), str(tmp_path / "one"), STEPS, SAVE_AT)
    first = ref["first"]
    # step s: the one process's micro-batch j is rank j's (micro 1: pack 2s + j either way)
    for s in range(STEPS):
        for j in range(2):
            assert ranks[j]["first"]["lengths"][s] == first["lengths"][2 * s + j]
            assert ranks[j]["first"]["micro_losses"][s] == pytest.approx(first["micro_losses"][2 * s + j], abs=1e-5)
    assert len({tuple(x) for x in first["lengths"]}) > 4  # the batches really vary
    for r in ranks:
        assert r["first"]["lrs"] == pytest.approx(first["lrs"], rel=1e-12)
        assert_params_close(r["first"]["params"], first["params"])
    # each step's LR is the schedule's x its samples / train_batch_size (linear)
    lengths = [len(x) for x in dataset()]
    sizes = plan_epoch(lengths, 24, 2, sequence_picking_order="random", seed=11).batch_sizes
    sizes += plan_epoch(lengths, 24, 2, sequence_picking_order="random", seed=12).batch_sizes
    assert len(sizes[:STEPS]) == STEPS and len(set(sizes[:STEPS])) > 1
    assert first["lrs"] == pytest.approx([lr * n / 2 for lr, n in zip(warmup_lrs(STEPS), sizes)], rel=1e-12)
    # the resumed runs continue where the checkpoint was taken, bit for bit
    for run, per_step in [(r, 1) for r in ranks] + [(ref, 2)]:
        cut = SAVE_AT * per_step
        assert run["resumed"]["lengths"] == run["first"]["lengths"][cut:]
        assert run["resumed"]["micro_losses"] == run["first"]["micro_losses"][cut:]
        assert run["resumed"]["lrs"] == run["first"]["lrs"][SAVE_AT:]
        assert_params_close(run["resumed"]["params"], run["first"]["params"], rtol=0)


def test_pipeline_takes_equal_micro_batches(world2):
    """2 stages x 1 data rank: within a step every micro-batch has one shape (equal sample
    counts, padded to the step's longest); the losses and LRs equal one process's on the same
    micro-batches."""
    from dynamic_batching_scenarios import pipeline_reference, pipeline_run

    ranks = world2.run(pipeline_run, 6)
    batches = ranks[0]["batches"]
    assert all(len({tuple(x.shape) for x in step}) == 1 for step in batches)
    assert len({tuple(step[0].shape) for step in batches}) > 2  # the shapes change from step to step
    ref = pipeline_reference(batches)
    for r in ranks:
        assert r["losses"] == pytest.approx(ref["losses"], abs=1e-5)
        assert r["lrs"] == pytest.approx(ref["lrs"], rel=1e-12)
    assert len(set(ref["lrs"])) > 1
