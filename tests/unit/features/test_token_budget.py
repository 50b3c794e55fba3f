"""Token budget: tokens counted after the curriculum cut, the stop at exactly the budget, and
the LR set by tokens as Megatron-DeepSpeed's loop sets it (golden values: tests/megatron_lr.py)."""

from __future__ import annotations

import pytest
import torch
from megatron_lr import golden_lrs

import zerotrain
from feature_models import (SEQ, Recorder, config, linear_curriculum, run_steps, single_process,  # noqa: F401
                            start, tiny_gpt)
from zerotrain.errors import ConfigError
from zerotrain.features.engine_methods import tokens_consumed


# ---- counting and stopping -----------------------------------------------------------------------
def train_until_stop(engine, limit=100) -> list[int]:
    seen = []
    while not engine.should_stop() and engine.global_steps < limit:
        run_steps(engine, 1)
        seen.append(tokens_consumed(engine))
    return seen


def test_stops_exactly_at_the_budget():
    engine = start(tiny_gpt(), config(micro=2, token_budget={"train_tokens": 5 * 2 * SEQ}))
    assert not engine.should_stop()
    assert train_until_stop(engine) == [32, 64, 96, 128, 160]
    assert engine.global_steps == 5 and engine.should_stop()


def test_budget_between_steps_stops_at_the_first_step_that_reaches_it():
    engine = start(tiny_gpt(), config(micro=2, ga=2, token_budget={"train_tokens": 65}))
    assert train_until_stop(engine) == [64, 128]


def test_tokens_are_counted_after_the_curriculum_cut():
    cfg = config(micro=2, curriculum_learning=linear_curriculum(4, SEQ, 4, 4), token_budget={"train_tokens": 2 * (4 + 8 + 12)})
    assert train_until_stop(start(tiny_gpt(), cfg)) == [8, 24, 48]


def test_tokens_follow_curriculum_seqlen_passed_to_the_model():
    model = Recorder()
    engine = start(model, config(micro=2, curriculum_learning=linear_curriculum(4, SEQ, 4, 4), token_budget={}))
    run_steps(engine, 3)
    assert [c["curriculum_seqlen"] for c in model.calls] == [4, 8, 12]
    assert all(c["shape"] == (2, SEQ) for c in model.calls)  # the model cuts, not the engine
    assert tokens_consumed(engine) == 2 * (4 + 8 + 12)


def test_eval_forwards_are_not_counted():
    engine = start(tiny_gpt(), config(token_budget={}))
    engine.eval()
    with torch.no_grad():
        engine(torch.zeros(2, SEQ, dtype=torch.long))
    engine.train()
    run_steps(engine, 1)
    assert tokens_consumed(engine) == 2 * SEQ


# ---- LR by tokens, through initialize ----------------------------------------------------------
LENGTHS = [5, 9, 3, 16, 7, 12, 16, 4, 11, 16, 2, 8, 13, 6, 16, 10, 3, 14]  # per micro-batch: tokens vary


def lr_run(budget: dict, lengths=LENGTHS, skip=(), ga=2, lr=1e-2):
    """Train micro-batches of 2 rows of the given lengths; NaN losses in the steps of `skip`
    (1-based) make the engine skip them. Returns (LR before any step and after each, step tokens)."""
    engine = start(Recorder(), config(micro=2, ga=ga, lr=lr, token_budget=budget))
    lrs, step_tokens, pending = [engine.get_lr()[0]], [], 0
    for i, length in enumerate(lengths[: len(lengths) // ga * ga]):
        x = torch.ones(2, length, dtype=torch.long)
        loss = engine(x, labels=x)
        step = engine.global_steps + 1
        engine.backward(loss * float("nan") if step in skip else loss)
        engine.step()
        pending += 2 * length
        if (i + 1) % ga == 0:
            lrs.append(engine.get_lr()[0])
            step_tokens.append(pending)
            pending = 0
    assert tokens_consumed(engine) == sum(step_tokens)
    assert engine.skipped_steps == len(skip)
    return lrs, step_tokens


WARMUPS = {"none": ({}, {}), "steps": ({"warmup_steps": 3}, {"warmup_steps": 3}),
           "tokens": ({"lr_warmup_tokens": 60}, {"warmup_tokens": 60})}


@pytest.mark.parametrize("warmup", WARMUPS)
@pytest.mark.parametrize("style", ["linear", "cosine", "constant", "inverse-square-root"])
def test_every_step_equals_megatron_deepspeed(style, warmup):
    ours, theirs = WARMUPS[warmup]
    budget = {"lr_decay_tokens": 260, "lr_decay_style": style, "min_lr": 1e-4, **ours}
    skip = (2, 6)  # overflow-skipped: one in the warmup, one in the decay
    lrs, step_tokens = lr_run(budget, skip=skip)
    golden = golden_lrs(step_tokens, skip, max_lr=1e-2, min_lr=1e-4, decay_tokens=260, style=style, **theirs)
    assert lrs == pytest.approx(golden, rel=1e-12, abs=0)
    assert sum(step_tokens[:-1]) > 260  # the grid reaches past lr_decay_tokens


def test_skipped_step_counts_its_tokens_and_leaves_the_lr_alone():
    lrs, step_tokens = lr_run({"lr_decay_tokens": 320}, lengths=[16, 16, 16, 16], ga=1, skip=(2,))
    assert step_tokens == [32] * 4
    # after step 1: tokens before it 0; step 2 skipped; step 3 sees both earlier steps' tokens
    assert lrs == pytest.approx([1e-2, 1e-2, 1e-2, 1e-2 * (1 - 64 / 320), 1e-2 * (1 - 96 / 320)])


def test_decay_tokens_with_a_scheduler_is_an_error():
    sched = {"type": "WarmupLR", "params": {"warmup_num_steps": 2}}
    with pytest.raises(ConfigError, match="token_budget.lr_decay_tokens"):
        zerotrain.initialize(model=tiny_gpt(), config=config(scheduler=sched, token_budget={"lr_decay_tokens": 10}))
    with pytest.raises(ConfigError, match="lr_decay_tokens"):
        zerotrain.initialize(model=tiny_gpt(), config=config(token_budget={"lr_decay_tokens": 10}),
                             lr_scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0))


def test_budget_and_lr_survive_a_resume(tmp_path):
    budget = {"train_tokens": 10 * 32, "lr_decay_tokens": 9 * 32, "warmup_steps": 2, "lr_decay_style": "cosine"}
    cfg = config(lr=1e-2, token_budget=budget)
    engine = start(tiny_gpt(), cfg)
    run_steps(engine, 4)
    engine.save_checkpoint(tmp_path)
    lrs = []
    for _ in range(6):
        losses = run_steps(engine, 1)
        lrs.append(engine.get_lr()[0])
    assert engine.should_stop()
    golden = golden_lrs([32] * 10, max_lr=1e-2, min_lr=0.0, decay_tokens=9 * 32, style="cosine", warmup_steps=2)
    resumed = start(tiny_gpt(seed=1), cfg)
    resumed.load_checkpoint(tmp_path)
    assert tokens_consumed(resumed) == 128
    assert resumed.get_lr()[0] == pytest.approx(golden[4], rel=1e-12)  # warmup's tokens (32) came back too
    resumed_lrs = []
    for _ in range(6):
        resumed_losses = run_steps(resumed, 1)
        resumed_lrs.append(resumed.get_lr()[0])
    assert resumed_lrs == lrs == pytest.approx(golden[5:], rel=1e-12) and resumed_losses == losses
    assert resumed.should_stop() and tokens_consumed(resumed) == 320


def test_the_token_tensor_is_found_in_any_batch_shape():
    from zerotrain.features.batch import count_tokens

    ids = torch.zeros(2, 5, dtype=torch.long)
    assert count_tokens((ids,), {}) == 10
    assert count_tokens((torch.ones(2, 7, 3),), {"labels": ids}) == 10  # token ids win over float features
    assert count_tokens(({"input_ids": ids, "x": torch.ones(2, 9)},), {}) == 10
    assert count_tokens((), {"input_ids": ids, "curriculum_seqlen": 3}) == 6
    assert count_tokens((torch.ones(4),), {}) == 0


# ---- the feature on its own (a stand-in engine) ----------------------------------------------
from types import SimpleNamespace  # noqa: E402

from zerotrain.features.token_budget import TokenBudgetFeature  # noqa: E402


def budget(**kw):
    return SimpleNamespace(**{"train_tokens": None, "lr_decay_tokens": None, "warmup_steps": 0, "min_lr": 0.0,
                              "lr_warmup_tokens": None, "lr_decay_style": "linear", **kw})


class _TwoRanks:
    """all_reduce as two ranks with the same count would give it."""

    def all_reduce(self, t):
        t.mul_(2)


def fake_engine(lr=0.5, scheduler=None, optimizer=True):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr) if optimizer else None
    return SimpleNamespace(optimizer=opt, lr_scheduler=scheduler, skipped_steps=0, comm=_TwoRanks(), input_replica=False)


def test_refusals_name_the_keys_and_the_way_out():
    with pytest.raises(ConfigError, match=r"^token_budget.lr_decay_tokens sets the optimizer's LR; add an "
                                          r"\"optimizer\" block or pass optimizer= to zerotrain.initialize$"):
        TokenBudgetFeature(budget(lr_decay_tokens=10)).on_train_start(fake_engine(optimizer=False))
    with pytest.raises(ConfigError, match=r"^token_budget.lr_decay_tokens drives the LR, and so does the LR "
                                          r"scheduler given to initialize; keep one \(token_budget.lr_decay_style picks the shape\)$"):
        TokenBudgetFeature(budget(lr_decay_tokens=10)).on_train_start(fake_engine(scheduler=object()))
    with pytest.raises(ConfigError, match=r"^token_budget.min_lr 0.6 is above the optimizer's lr 0.5; the decay "
                                          r"runs from the lr down to min_lr$"):
        TokenBudgetFeature(budget(lr_decay_tokens=10, min_lr=0.6)).on_train_start(fake_engine())


def test_tokens_are_summed_over_ranks_exactly_beyond_float32():
    feature, engine = TokenBudgetFeature(budget()), fake_engine()
    feature.on_train_start(engine)
    assert feature.state_dict() == {"tokens": 0, "peaks": []}
    feature._pending = 2**24 + 1  # float32 would round this to 2**24
    feature.after_step(engine)
    assert feature.tokens == 2 * (2**24 + 1)
    assert feature.log_fields(engine) == {"tokens": feature.tokens}


def test_a_tensor_lr_is_written_in_place():
    engine = fake_engine()
    lr = torch.tensor(0.5)
    engine.optimizer.param_groups[0]["lr"] = lr
    feature = TokenBudgetFeature(budget(lr_decay_tokens=100))
    feature.on_train_start(engine)
    for _ in range(2):
        feature.before_forward(engine, (torch.zeros(1, 10, dtype=torch.long),), {})
        feature.after_step(engine)  # 20 tokens a step (two ranks); the LR from the tokens before the step
    assert engine.optimizer.param_groups[0]["lr"] is lr and float(lr) == pytest.approx(0.5 * 0.8)


def test_loading_restores_the_peaks_and_sets_the_lr_only_when_decaying():
    state = {"tokens": 50, "peaks": [0.25], "lr_schedule": {"steps": 3, "tokens": 30, "warmup_tokens": None}}
    fresh = TokenBudgetFeature(budget(lr_decay_tokens=100))
    fresh.load_state_dict(state)  # before train start: no engine to write to yet
    assert fresh.state_dict() == state
    decaying, engine = TokenBudgetFeature(budget(lr_decay_tokens=100)), fake_engine()
    decaying.on_train_start(engine)
    decaying.load_state_dict(state)
    assert engine.optimizer.param_groups[0]["lr"] == pytest.approx(0.25 * (1 - 30 / 100))
    older, engine = TokenBudgetFeature(budget(lr_decay_tokens=100, warmup_steps=2)), fake_engine()
    older.on_train_start(engine)
    older.load_state_dict({"tokens": 50, "lr_steps": 3, "peaks": [0.25]})  # applied steps only
    assert engine.optimizer.param_groups[0]["lr"] == pytest.approx(0.25 * (1 - 50 / 100))
    counting, engine = TokenBudgetFeature(budget()), fake_engine()
    counting.on_train_start(engine)
    counting.load_state_dict({"tokens": 50, "peaks": []})
    assert engine.optimizer.param_groups[0]["lr"] == 0.5 and counting.tokens == 50
