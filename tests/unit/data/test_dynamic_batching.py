"""Dynamic batching: the packs and steps against a brute-force reference written from
DeepSpeed's description (every candidate end tried, nothing shared with the module), each
rank's micro-batches, epochs, the LR scaled per step, and the bad inputs."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from zerotrain.data.dynamic_batching import DynamicBatchSampler, pad_collate, plan_epoch, variable_batch_loader
from zerotrain.data_efficiency.variable_batch_size_and_lr import (
    batch_by_seqlens, get_dataloader_and_lr_scheduler_for_variable_batch_size, lr_scheduler_for_variable_batch_size,
    scale_lr)
from zerotrain.errors import ConfigError, DataError
from zerotrain.schedules import WarmupLR


# ---- the reference: DeepSpeed's batching as its docstring and loop describe it ---------------
def reference(seqlens, max_tokens, E, lo=1, hi=None, order="dataloader", equal=False, seed=0, ids=None):
    """(packs as lists of ids, samples per step); the last sample of the order is packable."""
    pairs = [(seqlens[i], i) for i in (range(len(seqlens)) if ids is None else ids)]
    if order == "random":
        random.Random(seed).shuffle(pairs)
    elif order == "seqlen":
        pairs = sorted(pairs)
    pairs = [p for p in pairs if p[0] <= max_tokens]
    m = E if equal else 1

    def ok(pack):
        return len(pack) >= lo and (not hi or len(pack) <= hi) and sum(p[0] for p in pack) <= max_tokens

    packs, start = [], 0
    while start < len(pairs):
        best = None
        for end in range(start + m, len(pairs) + 1, m):  # every candidate; keep the longest valid one
            group = pairs[start:end]
            if all(ok(group[j::m]) for j in range(m)):
                best = end
        if best is None:
            break
        group = pairs[start:best]
        packs += [[p[1] for p in group[j::m]] for j in range(m)]
        start = best
    packs = packs[:len(packs) - len(packs) % E]
    return packs, [sum(len(p) for p in packs[s:s + E]) for s in range(0, len(packs), E)]


CASES = [  # (max_tokens, E, min, max, equal)
    (20, 1, 1, None, False), (20, 2, 1, None, False), (22, 3, 2, None, False), (30, 2, 1, 3, False),
    (24, 2, 1, None, True), (40, 4, 2, 4, True), (9, 1, 1, 1, False),
]


@pytest.mark.parametrize("order", ["dataloader", "seqlen", "random"])
@pytest.mark.parametrize("case", CASES, ids=[f"T{c[0]}-E{c[1]}-min{c[2]}-max{c[3]}-{'eq' if c[4] else 'any'}"
                                             for c in CASES])
def test_plan_matches_brute_force(order, case):
    max_tokens, E, lo, hi, equal = case
    planned = 0
    for trial in range(6):
        seqlens = np.random.default_rng(trial).integers(1, 12, 37).tolist()
        packs, sizes = reference(seqlens, max_tokens, E, lo, hi, order, equal, seed=trial)
        if not packs:  # packing stopped before one whole step (DeepSpeed asserts)
            with pytest.raises(DataError, match="fewer than the"):
                plan_epoch(seqlens, max_tokens, E, None, lo, hi, order, equal, seed=trial)
            continue
        planned += 1
        plan = plan_epoch(seqlens, max_tokens, E, None, lo, hi, order, equal, seed=trial)
        assert [p.tolist() for p in plan.packs] == packs
        assert plan.batch_sizes == sizes
        for s, size in enumerate(sizes):
            step = packs[s * E:(s + 1) * E]
            assert plan.batch_max_seqlens[s] == max(seqlens[i] for p in step for i in p)
            if equal:
                assert len({len(p) for p in step}) == 1
        assert all(sum(seqlens[i] for i in p) <= max_tokens for p in packs)
        assert plan.left_out + sum(sizes) + len(plan.too_long) == len(seqlens)
    assert planned >= 3


def test_filter_ids_and_too_long_samples():
    seqlens = [5, 30, 4, 4, 6, 25, 3, 3]
    plan = plan_epoch(seqlens, 12, 1, ids=[0, 1, 2, 3, 4, 5, 6])
    assert plan.too_long == [1, 5]  # longer than max_tokens: left out, named
    assert [p.tolist() for p in plan.packs] == reference(seqlens, 12, 1, ids=[0, 1, 2, 3, 4, 5, 6])[0]
    assert 7 not in {i for p in plan.packs for i in p.tolist()}


def test_deepspeed_call_shape():
    ids, sizes, longest = batch_by_seqlens([3, 5, 2, 7, 1, 4], 8, effective_batch_size=2)
    assert ids == [(0, [0, 1]), (0, [2]), (1, [3, 4]), (1, [5])]
    assert (sizes, longest) == ([3, 3], [5, 7])


# ---- ranks, micro-batches, epochs ------------------------------------------------------------
SEQLENS = np.random.default_rng(7).integers(1, 10, 53).tolist()


def run_epoch(sampler):
    return [[i for i, _ in mb] for mb in sampler]


@pytest.mark.parametrize("micro,ga,world", [(1, 2, 2), (2, 1, 2), (2, 2, 1), (1, 1, 3)])
def test_ranks_split_every_step(micro, ga, world):
    E = micro * ga * world
    plan = plan_epoch(SEQLENS, 14, E)
    ranks = [run_epoch(DynamicBatchSampler(SEQLENS, 14, micro, ga, r, world)) for r in range(world)]
    assert all(len(r) == plan.steps * ga for r in ranks)
    for s in range(plan.steps):
        got = sorted(i for r in ranks for mb in r[s * ga:(s + 1) * ga] for i in mb)
        assert got == sorted(i for p in plan.packs[s * E:(s + 1) * E] for i in p.tolist())
    # DeepSpeed's interleaving: rank r's micro-batch j joins packs r + world * (j * micro + i)
    for r, mbs in enumerate(ranks):
        for j, mb in enumerate(mbs):
            assert mb == [i for k in range(micro) for i in plan.packs[r + world * (j * micro + k)].tolist()]


def test_epochs_reshuffle_only_a_random_order_and_sizes_follow():
    for order in ("random", "seqlen"):
        sampler = DynamicBatchSampler(SEQLENS, 14, 1, 2, seed=3, sequence_picking_order=order)
        epochs = [run_epoch(sampler) for _ in range(3)]
        assert (epochs[0] != epochs[1]) == (order == "random")
        again = DynamicBatchSampler(SEQLENS, 14, 1, 2, seed=3, sequence_picking_order=order)
        assert run_epoch(again) == epochs[0]  # deterministic per seed and epoch
        sizes = [sampler.plan(e).batch_sizes for e in range(3)]
        flat = [n for s in sizes for n in s]
        assert [sampler.batch_size(k) for k in range(len(flat))] == flat


def test_state_resumes_mid_epoch():
    first = DynamicBatchSampler(SEQLENS, 14, 1, 2, sequence_picking_order="random")
    whole = run_epoch(first) + run_epoch(first)
    second = DynamicBatchSampler(SEQLENS, 14, 1, 2, sequence_picking_order="random")
    it = iter(second)
    head = [[i for i, _ in next(it)] for _ in range(5)]
    state = second.state_dict()
    resumed = DynamicBatchSampler(SEQLENS, 14, 1, 2, sequence_picking_order="random")
    resumed.load_state_dict(state)
    assert head + run_epoch(resumed) + run_epoch(resumed) == whole


def test_equal_micro_batches_collate_to_one_shape():
    data = [torch.arange(1, n + 1) for n in SEQLENS]
    sampler = DynamicBatchSampler(SEQLENS, 20, 2, 3, sequence_picking_order="seqlen", equal_micro_batches=True)
    shapes = [b.shape for b in variable_batch_loader(data, sampler)]
    assert len(shapes) == sampler.plan(0).steps * 3
    for s in range(0, len(shapes), 3):
        assert len(set(shapes[s:s + 3])) == 1 and shapes[s][1] == sampler.plan(0).batch_max_seqlens[s // 3]
    assert len({s[1] for s in shapes}) > 1  # steps differ from each other


def test_pad_collate_pads_to_the_longest():
    out = pad_collate([{"input_ids": torch.tensor([1, 2, 3]), "labels": torch.tensor([1, 2, 3])},
                       {"input_ids": torch.tensor([4]), "labels": torch.tensor([4])}])
    assert out["input_ids"].tolist() == [[1, 2, 3], [4, 0, 0]]
    assert out["labels"].tolist() == [[1, 2, 3], [4, -100, -100]]


# ---- the LR per step ---------------------------------------------------------------------------
def test_scale_lr_per_method():
    assert scale_lr(8, 12, 0.1, "linear") == pytest.approx(0.15, rel=1e-15)
    assert scale_lr(8, 2, 0.1, "sqrt") == pytest.approx(0.05, rel=1e-15)
    assert scale_lr(8, 2, 0.1, "none") == scale_lr(8, 2, 0.1, "NONE") == scale_lr(8, 2, 0.1, None) == 0.1
    with pytest.raises(ConfigError, match=r"^lr_scaling_method 'cubic' is not one of linear, sqrt, none$"):
        scale_lr(8, 2, 0.1, "cubic")


@pytest.mark.parametrize("method", ["linear", "sqrt", "none"])
def test_schedule_scaled_by_each_steps_samples(method):
    def warmup():
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.5)
        return opt, WarmupLR(opt, warmup_min_lr=0.0, warmup_max_lr=0.4, warmup_num_steps=4, warmup_type="linear")

    opt, base = warmup()
    plain_opt, plain = warmup()  # the same schedule, unscaled
    unscaled = [plain_opt.param_groups[0]["lr"]]
    sizes = [3, 7, 4, 9, 2, 6]
    sched = lr_scheduler_for_variable_batch_size(4, lambda s: sizes[s], None, base, method)
    factor = {"linear": lambda n: n / 4, "sqrt": lambda n: math.sqrt(n / 4), "none": lambda n: 1.0}[method]
    seen = [opt.param_groups[0]["lr"]]
    for _ in range(5):
        sched.step()
        plain.step()
        seen.append(opt.param_groups[0]["lr"])
        unscaled.append(plain_opt.param_groups[0]["lr"])
    assert len(set(unscaled)) > 3  # the warmup moves
    assert seen == pytest.approx([u * factor(n) for u, n in zip(unscaled, sizes)], rel=1e-12, abs=0)


def test_multiplicative_schedule_does_not_compound_the_scale():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    base = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    sched = lr_scheduler_for_variable_batch_size(2, [4, 1, 2], None, base, "linear")
    seen = [opt.param_groups[0]["lr"]]
    for _ in range(3):
        opt.step()
        sched.step()
        seen.append(opt.param_groups[0]["lr"])
    assert seen == [2.0, 0.25, 0.25, 0.25]  # 1*4/2, 0.5*1/2, 0.25*2/2, 0.125*4/2 (list wraps round)


# ---- bad inputs: one line each ------------------------------------------------------------------
def test_bad_inputs_are_one_line():
    with pytest.raises(DataError, match=r"^data_efficiency\.data_sampling\.dynamic_batching: the 4 samples within "
                                        r"max_tokens=10 make 4 packs, fewer than the 5 \(train_batch_size\)"):
        plan_epoch([6, 6, 6, 6, 11], 10, 5)
    with pytest.raises(DataError, match=r"sequence_picking_order: 'length' is not one of random, seqlen, dataloader$"):
        plan_epoch([1, 2], 10, 1, sequence_picking_order="length")
    with pytest.raises(DataError, match=r"3 sequence lengths for a dataset of 4 samples"):
        get_dataloader_and_lr_scheduler_for_variable_batch_size([0] * 4, [1, 2, 3], 10, 1)
    with pytest.raises(ConfigError, match=r"effective_batch_size 3 is not a multiple of dataloader_batch_size x "
                                          r"dataloader_num_replicas = 2$"):
        get_dataloader_and_lr_scheduler_for_variable_batch_size([0] * 4, [1] * 4, 10, 3, dataloader_batch_size=2)
    data = [torch.ones(5), torch.ones(2), torch.ones(2), torch.ones(2)]
    loader, _, _ = get_dataloader_and_lr_scheduler_for_variable_batch_size(
        data, [1, 2, 2, 2], 4, 2, required_microbatches_of_same_size=True, required_microbatches_of_same_seqlen=True)
    with pytest.raises(DataError, match=r"sample 0 has 5 tokens but its seqlen says at most 2"):
        list(loader)


# ---- through the engine -------------------------------------------------------------------------
def engine_config(**block) -> dict:
    return {"train_batch_size": 2, "train_micro_batch_size_per_gpu": 1,
            "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
            "data_efficiency": {"enabled": True, "data_sampling": {"enabled": True, "dynamic_batching": {
                "enabled": True, "max_tokens": 8, **block}}}}


DATA = [torch.ones(n, 1) for n in [3, 5, 2, 6, 1, 4, 4, 2, 7, 3]]


def test_deepspeed_call_makes_the_engine_batch_by_tokens(tmp_path, caplog):
    import zerotrain
    from zerotrain.data.indexed import write_indexed
    from zerotrain.data_efficiency.variable_batch_size_and_lr import (
        get_dataloader_and_lr_scheduler_for_variable_batch_size_deepspeed as deepspeed_call)
    from zerotrain.features.dynamic_batching import DynamicBatchingFeature

    # lengths from the analyzer's files (one row per sample), here halved on purpose
    (tmp_path / "seqlen").mkdir()
    write_indexed(str(tmp_path / "seqlen" / "seqlen_sample_to_metric"), [[max(len(x) // 2, 1)] for x in DATA], np.int64)
    with caplog.at_level("INFO", logger="zerotrain"):
        engine, *_ = zerotrain.initialize(model=torch.nn.Linear(1, 1), config=engine_config(metrics_path=str(tmp_path)))
    assert "initialize got no training_data" in caplog.text
    loader, scheduler, _ = deepspeed_call(DATA, engine)
    assert engine.training_dataloader is loader and engine.lr_scheduler is scheduler
    assert isinstance(engine.features[0], DynamicBatchingFeature)
    halves = [max(len(x) // 2, 1) for x in DATA]
    assert [p.tolist() for p in loader.batch_sampler.plan(0).packs] == reference(halves, 8, 2)[0]
    with pytest.raises(DataError, match=r"^data_efficiency\.data_sampling\.dynamic_batching: 10 sequence lengths "
                                        r"for a dataset of 9 samples: lengths made for another dataset\?"):
        deepspeed_call(DATA[:9], engine)
    engine, *_ = zerotrain.initialize(model=torch.nn.Linear(1, 1), config=engine_config(enabled=False))
    with pytest.raises(ConfigError, match=r"^data_efficiency\.data_sampling\.dynamic_batching\.enabled is false: "):
        deepspeed_call(DATA, engine)


def test_engine_path_lines(caplog):
    import zerotrain

    both = engine_config()
    both["data_efficiency"]["data_sampling"]["curriculum_learning"] = {
        "enabled": True, "data_cluster_path": "c", "curriculum_metrics": {"m": {
            "difficulty_type": "value", "clustering_type": "single_cluster", "min_difficulty": 1,
            "max_difficulty": 2, "schedule_type": "fixed_linear",
            "schedule_config": {"total_curriculum_step": 2, "difficulty_step": 1}}}}
    with pytest.raises(ConfigError, match=r"^data_efficiency\.data_sampling: curriculum_learning and dynamic_batching "
                                          r"both draw the training batches; enable one of them$"):
        zerotrain.initialize(model=torch.nn.Linear(1, 1), config=both, training_data=DATA)
    off = engine_config()
    off["data_efficiency"]["data_sampling"]["enabled"] = False
    with caplog.at_level("INFO", logger="zerotrain"):
        _, _, loader, _ = zerotrain.initialize(model=torch.nn.Linear(1, 1), config=off, training_data=DATA)
    assert ("dynamic_batching.enabled is true but data_efficiency.data_sampling.enabled is false: initialize's "
            "loader makes fixed-size batches") in caplog.text
    assert next(iter(loader)).shape[0] == 1  # fixed-size: one sample a micro-batch


def test_deepspeed_import_path_is_dynamic_batching():
    from zerotrain.data_efficiency import variable_batch_size_and_lr as ours
    from zerotrain.runtime.data_pipeline.data_sampling import variable_batch_size_and_lr as alias

    for name in ours.__all__:
        assert getattr(alias, name) is getattr(ours, name), name
    assert "get_dataloader_and_lr_scheduler_for_variable_batch_size_deepspeed" in ours.__all__
