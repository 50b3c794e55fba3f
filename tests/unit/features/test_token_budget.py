"""Token budget: tokens counted after the curriculum cut, the stop at exactly the budget,
and the LR decayed by tokens while warmup counts steps."""

from __future__ import annotations

import math

import pytest
import torch

import zerotrain
from feature_models import (SEQ, Recorder, config, linear_curriculum, run_steps, single_process,  # noqa: F401
                            start, tiny_gpt)
from zerotrain.errors import ConfigError
from zerotrain.features.token_budget import token_lr


# ---- the pure LR ---------------------------------------------------------------------------------
def test_warmup_counts_steps():
    assert [token_lr(1.0, s, 10**9, 100, warmup_steps=4) for s in range(5)] == [0.0, 0.25, 0.5, 0.75, 1.0]


@pytest.mark.parametrize("style", ["linear", "cosine"])
def test_decay_by_tokens(style):
    lr = lambda t: token_lr(1.0, 10, t, 1000, min_lr=0.1, style=style)
    assert lr(0) == 1.0
    assert lr(500) == pytest.approx(0.55)  # halfway, for both shapes
    assert lr(1000) == pytest.approx(0.1)
    assert lr(5000) == pytest.approx(0.1)  # held at min after the decay
    if style == "cosine":
        assert lr(250) == pytest.approx(0.1 + 0.9 * (1 + math.cos(math.pi / 4)) / 2)
    else:
        assert lr(250) == pytest.approx(0.775)


# ---- counting and stopping -----------------------------------------------------------------------
def train_until_stop(engine, limit=100) -> list[int]:
    seen = []
    while not engine.should_stop() and engine.global_steps < limit:
        run_steps(engine, 1)
        seen.append(engine.feature_value("tokens_consumed"))
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
    assert engine.feature_value("tokens_consumed") == 2 * (4 + 8 + 12)


def test_eval_forwards_are_not_counted():
    engine = start(tiny_gpt(), config(token_budget={}))
    engine.eval()
    with torch.no_grad():
        engine(torch.zeros(2, SEQ, dtype=torch.long))
    engine.train()
    run_steps(engine, 1)
    assert engine.feature_value("tokens_consumed") == 2 * SEQ


# ---- LR by tokens --------------------------------------------------------------------------------
@pytest.mark.parametrize("style", ["linear", "cosine"])
def test_engine_lr_follows_tokens(style):
    budget = {"train_tokens": 8 * 32, "lr_decay_tokens": 8 * 32, "lr_decay_style": style, "warmup_steps": 2,
              "min_lr": 1e-4}
    engine = start(tiny_gpt(), config(micro=2, lr=1e-2, token_budget=budget))
    lrs = [engine.get_lr()[0]]
    for step in range(1, 9):
        run_steps(engine, 1)
        lrs.append(engine.get_lr()[0])
        assert engine.get_lr()[0] == pytest.approx(token_lr(1e-2, step, 32 * step, 8 * 32, 2, 1e-4, style))
    assert lrs[:3] == pytest.approx([0.0, 5e-3, 1e-2])
    assert lrs[-1] == pytest.approx(1e-4)
    assert all(a >= b for a, b in zip(lrs[2:], lrs[3:]))


def test_skipped_step_leaves_the_lr_alone():
    engine = start(tiny_gpt(), config(lr=1e-2, token_budget={"lr_decay_tokens": 320}))
    x = torch.zeros(2, SEQ, dtype=torch.long)
    for i in range(3):
        loss = engine(x, labels=x)
        engine.backward(loss * (float("nan") if i == 1 else 1.0))
        engine.step()
        if i == 1:
            assert engine.skipped_steps == 1 and engine.get_lr()[0] == pytest.approx(1e-2 * (1 - 32 / 320))
    assert engine.feature_value("tokens_consumed") == 96  # the skipped step's tokens count
    assert engine.get_lr()[0] == pytest.approx(1e-2 * (1 - 96 / 320))


def test_decay_tokens_with_a_scheduler_is_an_error():
    sched = {"type": "WarmupLR", "params": {"warmup_num_steps": 2}}
    with pytest.raises(ConfigError, match="token_budget.lr_decay_tokens"):
        zerotrain.initialize(model=tiny_gpt(), config=config(scheduler=sched, token_budget={"lr_decay_tokens": 10}))
    with pytest.raises(ConfigError, match="lr_decay_tokens"):
        zerotrain.initialize(model=tiny_gpt(), config=config(token_budget={"lr_decay_tokens": 10}),
                             lr_scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0))


def test_budget_and_lr_survive_a_resume(tmp_path):
    cfg = config(lr=1e-2, token_budget={"train_tokens": 10 * 32, "lr_decay_tokens": 10 * 32, "warmup_steps": 2})
    engine = start(tiny_gpt(), cfg)
    run_steps(engine, 4)
    engine.save_checkpoint(tmp_path)
    losses = run_steps(engine, 6)
    assert engine.should_stop()
    resumed = start(tiny_gpt(seed=1), cfg)
    resumed.load_checkpoint(tmp_path)
    assert resumed.feature_value("tokens_consumed") == 128
    assert resumed.get_lr()[0] == pytest.approx(1e-2 * (1 - 128 / 320))
    assert run_steps(resumed, 6) == losses
    assert resumed.should_stop() and resumed.feature_value("tokens_consumed") == 320


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
                              "lr_decay_style": "linear", **kw})


class _TwoRanks:
    """all_reduce as two ranks with the same count would give it."""

    def all_reduce(self, t):
        t.mul_(2)


def fake_engine(lr=0.5, scheduler=None, optimizer=True):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr) if optimizer else None
    return SimpleNamespace(optimizer=opt, lr_scheduler=scheduler, skipped_steps=0, comm=_TwoRanks(), input_replica=False)


def test_token_lr_defaults_and_a_one_step_warmup():
    for s, t in ((0, 0), (1, 10), (3, 60), (9, 200)):
        assert token_lr(1.0, s, t, 100) == token_lr(1.0, s, t, 100, 0, 0.0, "linear")
    assert token_lr(1.0, 1, 50, 100, warmup_steps=1) == 1.0  # step 1 of a 1-step warmup is the peak
    with pytest.raises(ConfigError, match=r"^token_budget.lr_decay_style: should be linear or cosine, got 'exp'$"):
        token_lr(1.0, 5, 10, 100, style="exp")


def test_refusals_name_the_keys_and_the_way_out():
    with pytest.raises(ConfigError, match=r"^token_budget.lr_decay_tokens sets the optimizer's LR; add an "
                                          r"\"optimizer\" block or pass optimizer= to zerotrain.initialize$"):
        TokenBudgetFeature(budget(lr_decay_tokens=10)).on_train_start(fake_engine(optimizer=False))
    with pytest.raises(ConfigError, match=r"^token_budget.lr_decay_tokens drives the LR, and so does the LR "
                                          r"scheduler given to initialize; keep one$"):
        TokenBudgetFeature(budget(lr_decay_tokens=10)).on_train_start(fake_engine(scheduler=object()))


def test_tokens_are_summed_over_ranks_exactly_beyond_float32():
    feature, engine = TokenBudgetFeature(budget()), fake_engine()
    feature.on_train_start(engine)
    assert feature.state_dict() == {"tokens": 0, "lr_steps": 0, "peaks": []}
    feature._pending = 2**24 + 1  # float32 would round this to 2**24
    feature.after_step(engine)
    assert feature.tokens == 2 * (2**24 + 1)
    assert feature.value("tokens_consumed") == feature.tokens and feature.value("pld_theta") is None
    assert feature.log_fields(engine) == {"tokens": feature.tokens}


def test_a_tensor_lr_is_written_in_place():
    engine = fake_engine()
    lr = torch.tensor(0.5)
    engine.optimizer.param_groups[0]["lr"] = lr
    feature = TokenBudgetFeature(budget(lr_decay_tokens=100))
    feature.on_train_start(engine)
    feature.before_forward(engine, (torch.zeros(1, 10, dtype=torch.long),), {})
    feature.after_step(engine)  # 20 tokens of 100 (two ranks)
    assert engine.optimizer.param_groups[0]["lr"] is lr and float(lr) == pytest.approx(0.5 * 0.8)


def test_loading_restores_the_peaks_and_sets_the_lr_only_when_decaying():
    state = {"tokens": 50, "lr_steps": 3, "peaks": [0.25]}
    fresh = TokenBudgetFeature(budget(lr_decay_tokens=100))
    fresh.load_state_dict(state)  # before train start: no engine to write to yet
    assert fresh.state_dict() == state
    decaying, engine = TokenBudgetFeature(budget(lr_decay_tokens=100)), fake_engine()
    decaying.on_train_start(engine)
    decaying.load_state_dict(state)
    assert engine.optimizer.param_groups[0]["lr"] == pytest.approx(token_lr(0.25, 3, 50, 100))
    counting, engine = TokenBudgetFeature(budget()), fake_engine()
    counting.on_train_start(engine)
    counting.load_state_dict(state)
    assert engine.optimizer.param_groups[0]["lr"] == 0.5 and counting.tokens == 50
