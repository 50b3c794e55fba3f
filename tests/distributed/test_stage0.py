"""Stage 0 data parallelism on 2 real gloo processes against a 1-process reference."""

from __future__ import annotations

import math

import pytest
import torch

from asserts import assert_params_close
from scenarios import base_config, train


@pytest.mark.parametrize("extra", [
    {},
    {"gradient_accumulation_steps": 2, "train_micro_batch_size_per_gpu": 1},
    {"prescale_gradients": True},
    {"gradient_predivide_factor": 4.0},
], ids=["plain", "accumulation", "prescale", "predivide"])
def test_two_ranks_match_one_process(world2, extra):
    steps, batch = 20, 4
    dist_cfg = base_config(batch, 2, **extra)
    scaling = {k: v for k, v in extra.items() if k in ("prescale_gradients", "gradient_predivide_factor")}
    ref_cfg = base_config(batch, 4, **scaling)
    ranks = world2.run(train, dist_cfg, steps, batch)
    reference = train(ref_cfg, steps, batch)
    assert_params_close(ranks[0]["params"], ranks[1]["params"], rtol=0)  # replicas identical
    # what is left is the gradients' own sum (two half-batch backward passes added): 6.4e-7
    assert_params_close(ranks[0]["params"], reference["params"], rtol=2e-6)
    # training actually moved the weights
    start = train(base_config(batch, 4), 0, batch)["params"]
    moved = sum((ranks[0]["params"][k] - start[k]).norm().item() for k in start)
    assert moved > 1e-2


def test_clipping_uses_the_global_norm(world2):
    """With a clip far below the norm, clipping by a per-rank norm would diverge from the
    1-process run; the global norm reproduces it and equals the reference norm."""
    steps, batch = 5, 4
    ranks = world2.run(train, base_config(batch, 2, gradient_clipping=0.05), steps, batch)
    reference = train(base_config(batch, 4, gradient_clipping=0.05), steps, batch)
    assert all(n > 0.05 for n in reference["norms"])  # clipping was active every step
    for r in ranks:
        assert r["norms"] == pytest.approx(reference["norms"], rel=1e-6)
    assert_params_close(ranks[0]["params"], reference["params"], rtol=2e-6)


def test_checkpoint_resume_gives_identical_losses(world2, tmp_path):
    steps, batch = 6, 4
    cfg = base_config(batch, 2, scheduler={"type": "WarmupLR", "params": {"warmup_num_steps": 4,
                                                                          "warmup_max_lr": 3e-3}})
    full = world2.run(train, cfg, steps, batch, save=(str(tmp_path), 3))
    resumed = world2.run(train, cfg, steps, batch, load=(str(tmp_path), None))
    for f, r in zip(full, resumed):
        assert r["losses"] == f["losses"][3:]  # bit-identical continuation
        assert r["lrs"] == f["lrs"][3:]
        assert_params_close(r["params"], f["params"], rtol=0)


def test_fp16_overflow_on_one_rank_skips_the_step_on_both(world2):
    steps, batch = 4, 4
    cfg = base_config(batch, 2, fp16={"enabled": True, "initial_scale_power": 8, "hysteresis": 1},
                      scheduler={"type": "WarmupLR", "params": {"warmup_num_steps": 10, "warmup_max_lr": 1e-2}})
    poisoned = world2.run(train, cfg, steps, batch, poison={"step": 2, "rank": 1, "value": math.inf})
    clean = world2.run(train, cfg, steps, batch)
    for r in poisoned:
        assert r["skipped"] == 1
        assert not math.isfinite(r["norms"][2])
        assert r["loss_scale"] == 128.0  # halved once from 2**8
        # the LR schedule did not advance on the skipped step
        assert r["lrs"][2] == r["lrs"][1]
    assert clean[0]["skipped"] == 0
    assert_params_close(poisoned[0]["params"], poisoned[1]["params"], rtol=0)


def initialize_with_rank_specific_lr() -> str:
    import zerotrain
    from scenarios import rank_and_world, tiny_gpt

    rank, _ = rank_and_world()
    config = base_config(4, 2)
    config["optimizer"]["params"]["lr"] = 1e-3 * (1 + rank)
    try:
        zerotrain.initialize(model=tiny_gpt(), config=config)
    except zerotrain.ConfigError as e:
        return str(e)
    return "no error"


def test_ranks_with_different_configs_are_refused_at_start(world2):
    for message in world2.run(initialize_with_rank_specific_lr):
        assert message == "ranks were given different configs: rank 0 and rank 1 differ at optimizer.params.lr: 0.001 vs 0.002"
