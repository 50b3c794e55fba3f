"""Sequence-length curriculum: the scheduler against spec section 1 (and DeepSpeed's own test
intents, section 7), then the engine: kwarg or batch cut, eval untouched, the newer block."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

import zerotrain
from feature_models import (SEQ, VOCAB, Recorder, config, linear_curriculum, run_steps, single_process,  # noqa: F401
                            start, tiny_gpt, tokens, zerotrain_log)
from zerotrain import CurriculumScheduler
from zerotrain.errors import ConfigError
from zerotrain.features.curriculum import CurriculumFeature
from zerotrain.features.engine_methods import curriculum_seqlen
from zerotrain.features.curriculum import applied_length, fixed_discrete_difficulty, fixed_root_difficulty


def sched(kind="fixed_linear", lo=8, hi=64, **schedule) -> CurriculumScheduler:
    return CurriculumScheduler({"min_difficulty": lo, "max_difficulty": hi, "schedule_type": kind,
                                "schedule_config": schedule})


# ---- the schedule numbers --------------------------------------------------------------------
@pytest.mark.parametrize("lo,step", [(8, 16), (1, 8), (10, 8), (64, 16), (5, 3), (16, 16), (7, 1)])
@pytest.mark.parametrize("hi", [64, 100, 1000, 1024])
@pytest.mark.parametrize("kind,degree", [("fixed_linear", 1), ("fixed_root", 2), ("fixed_root", 3)])
def test_every_difficulty_is_aligned_and_in_range(lo, step, hi, kind, degree):
    total = 13
    extra = {"root_degree": degree} if kind == "fixed_root" else {}
    s = sched(kind, lo, hi, total_curriculum_step=total, difficulty_step=step, **extra)
    values = [s.get_difficulty(g) for g in range(0, 3 * total)]
    aligned_min = -(-lo // step) * step
    for d in values:
        assert type(d) is int
        assert lo <= d <= hi
        assert d % step == 0 or d == hi  # max is returned exactly even when not a multiple
        assert d >= min(aligned_min, hi)
    assert values == sorted(values)
    assert values[-1] == hi
    assert values[0] == min(aligned_min, hi)


@pytest.mark.parametrize("lo,step,first", [(8, 16, 16), (64, 16, 64), (5, 3, 6), (1, 8, 8), (10, 8, 16)])
def test_first_difficulty_is_min_rounded_up(lo, step, first):
    s = sched(lo=lo, hi=1024, total_curriculum_step=1000, difficulty_step=step)
    assert s.get_current_difficulty() == lo  # before any update, as DeepSpeed
    assert s.update_difficulty(1) == first  # the engine's first forward passes step 1
    assert s.get_difficulty(0) == first


def test_cap_is_exactly_max():
    s = sched(lo=16, hi=1000, total_curriculum_step=10, difficulty_step=16)
    assert s.get_difficulty(10) == 992  # the largest multiple of 16 below 1000 at T
    assert s.get_difficulty(11) == 1000
    assert [sched(lo=8, hi=100, total_curriculum_step=10, difficulty_step=8).get_difficulty(g)
            for g in (10, 11)] == [96, 100]


def test_min_rounded_up_above_max_gives_max_from_the_start():
    assert {sched(lo=1, hi=5, total_curriculum_step=10, difficulty_step=8).get_difficulty(g) for g in range(20)} == {5}
    assert {sched(lo=10, hi=10, total_curriculum_step=10, difficulty_step=4).get_difficulty(g) for g in range(20)} == {10}


def test_fixed_root_cube_root_values():
    got = [fixed_root_difficulty(g, 8, 1024, 100, 8, 3) for g in (1, 8, 27, 50, 100)]
    assert got == [224, 440, 664, 808, 1024]


def test_fixed_discrete_boundaries_are_inclusive():
    assert [fixed_discrete_difficulty(g, [1, 2, 3, 4, 5], [2, 4, 6, 8]) for g in range(1, 11)] == \
        [1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    assert fixed_discrete_difficulty(0, [1, 2], [2]) == 1
    assert fixed_discrete_difficulty(-5, [1, 2], [2]) == 1


def test_update_freezes_once_max_is_reached():
    s = sched(lo=8, hi=64, total_curriculum_step=10, difficulty_step=8)
    assert [s.update_difficulty(g) for g in (5, 2, 9, 1, 10, 3, 20)] == [32, 16, 56, 8, 64, 64, 64]
    d = sched("fixed_discrete", lo=1, hi=3, difficulty=[2, 9, 1], max_step=[3, 6])
    assert [d.update_difficulty(g) for g in (1, 4, 7, 8)] == [2, 9, 9, 9]


def test_custom_schedule_is_neither_rounded_nor_capped():
    s = CurriculumScheduler({"min_difficulty": 1, "max_difficulty": 100, "schedule_type": "custom"})
    s.set_custom_get_difficulty(lambda step: 3 * step)
    assert [s.update_difficulty(g) for g in (1, 10, 40, 50)] == [3, 30, 120, 120]


def test_custom_without_a_function_says_how_to_set_one():
    s = CurriculumScheduler({"min_difficulty": 1, "max_difficulty": 100, "schedule_type": "custom"})
    with pytest.raises(ConfigError, match="set_custom_curriculum_learning_schedule"):
        s.update_difficulty(1)


def test_state_round_trip():
    s = sched(lo=8, hi=64, total_curriculum_step=10, difficulty_step=8)
    s.update_difficulty(5)
    fresh = sched(lo=8, hi=64, total_curriculum_step=10, difficulty_step=8)
    fresh.load_state_dict(s.state_dict())
    assert fresh.get_current_difficulty() == 32
    assert fresh.get_state() == s.get_state()
    other = sched(lo=8, hi=64, total_curriculum_step=10, difficulty_step=8)
    other.set_state(s.get_state())
    assert other.get_current_difficulty() == 32


# ---- errors name the key ---------------------------------------------------------------------
@pytest.mark.parametrize("block,key", [
    ({"max_difficulty": 64, "schedule_type": "fixed_linear"}, "min_difficulty"),
    ({"min_difficulty": 8, "schedule_type": "fixed_linear"}, "max_difficulty"),
    ({"min_difficulty": 8, "max_difficulty": 64}, "schedule_type"),
    ({"min_difficulty": 8, "max_difficulty": 64, "schedule_type": "fixed_linear",
      "schedule_config": {"difficulty_step": 8}}, "total_curriculum_step"),
    ({"min_difficulty": 8, "max_difficulty": 64, "schedule_type": "fixed_root",
      "schedule_config": {"total_curriculum_step": 8, "difficulty_step": 8}}, "root_degree"),
    ({"min_difficulty": 8, "max_difficulty": 64, "schedule_type": "fixed_discrete",
      "schedule_config": {"difficulty": [8, 16, 32], "max_step": [4]}}, "max_step"),
    ({"min_difficulty": 8, "max_difficulty": 64, "schedule_type": "fixed_discrete",
      "schedule_config": {"difficulty": [], "max_step": []}}, "difficulty"),
    ({"min_difficulty": 8.5, "max_difficulty": 64, "schedule_type": "fixed_linear"}, "min_difficulty"),
    ({"min_difficulty": 8, "max_difficulty": 64, "schedule_type": "fixed_lin"}, "schedule_type"),
    ({"min_difficulty": 8, "max_difficulty": 64, "schedule_type": "fixed_linear",
      "schedule_config": {"total_curriculum_step": 0, "difficulty_step": 8}}, "total_curriculum_step"),
    ({"min_difficulty": 8, "max_difficulty": 64, "schedule_type": "fixed_linear", "min_dificulty": 3}, "min_dificulty"),
])
def test_bad_blocks_are_config_errors_naming_the_key(block, key):
    with pytest.raises(ConfigError, match=key):
        CurriculumScheduler(block)


def test_accepts_the_whole_json_block():
    s = CurriculumScheduler(linear_curriculum(8, 64, 10, 8))
    assert s.update_difficulty(1) == 8


# ---- the engine --------------------------------------------------------------------------------
def seen_seqlens(block: dict, steps: int, ga: int = 1) -> list[int]:
    model = Recorder()
    engine = start(model, config(micro=1, ga=ga, curriculum_learning=block))
    run_steps(engine, steps, batch=lambda s: torch.ones(1, 4))
    return [c["curriculum_seqlen"] for c in model.calls]


def test_deepspeed_fixed_linear_intent():
    assert seen_seqlens(linear_curriculum(2, 10, 8, 2), 10) == [2, 4, 4, 6, 6, 8, 8, 10, 10, 10]


def test_deepspeed_fixed_discrete_intent():
    block = {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": 1, "max_difficulty": 5,
             "schedule_type": "fixed_discrete", "schedule_config": {"difficulty": [1, 2, 3, 4, 5], "max_step": [2, 4, 6, 8]}}
    assert seen_seqlens(block, 10) == [1, 1, 2, 2, 3, 3, 4, 4, 5, 5]


def test_observed_engine_sequence_and_accumulation():
    block = linear_curriculum(8, 64, 6, 16)
    expected = [16, 16, 32, 32, 48, 64, 64, 64, 64, 64]
    assert seen_seqlens(block, 10) == expected
    assert seen_seqlens(block, 10, ga=2) == [d for d in expected for _ in range(2)]


def test_model_without_the_kwarg_gets_its_batch_cut():
    model = tiny_gpt()
    seen = []
    model.register_forward_pre_hook(lambda m, args, kwargs: seen.append(
        (tuple(args[0].shape), tuple(kwargs["labels"].shape), "curriculum_seqlen" in kwargs)), with_kwargs=True)
    engine = start(model, config(curriculum_learning=linear_curriculum(4, SEQ, 4, 4)))
    run_steps(engine, 5)
    assert seen == [((2, d), (2, d), False) for d in (4, 8, 12, 16, 16)]


def test_eval_mode_is_left_alone():
    model = Recorder()
    engine = start(model, config(curriculum_learning=linear_curriculum(2, 10, 8, 2)))
    engine.eval()
    engine(torch.ones(2, 8))
    assert model.calls[-1]["curriculum_seqlen"] is None and model.calls[-1]["shape"] == (2, 8)
    assert engine.feature(CurriculumFeature).scheduler.get_current_difficulty() == 2  # not touched
    engine.train()
    engine(torch.ones(2, 8))
    assert model.calls[-1]["curriculum_seqlen"] == 2


def tiny_hf_gpt2():
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=SEQ))


def test_hf_dict_batch_is_cut_and_still_trains():
    model = tiny_hf_gpt2()
    seen = []
    model.register_forward_pre_hook(lambda m, a, kw: seen.append({k: tuple(v.shape) for k, v in kw.items()
                                                                   if torch.is_tensor(v)} | {"extra": set(kw)}),
                                    with_kwargs=True)
    engine = start(model, config(curriculum_learning=linear_curriculum(4, SEQ, 2, 4)))
    x = tokens(0)
    batch = {"input_ids": x, "attention_mask": torch.ones_like(x), "labels": x,
             "position_ids": torch.arange(SEQ).expand(2, SEQ), "token_type_ids": torch.zeros_like(x)}
    out = engine(**batch)
    engine.backward(out.loss)
    engine.step()
    assert torch.isfinite(out.loss)
    assert out.logits.shape == (2, 8, VOCAB)
    assert {k: v for k, v in seen[0].items() if k != "extra"} == {k: (2, 8) for k in batch}
    assert "curriculum_seqlen" not in seen[0]["extra"]  # HF **kwargs would swallow it silently


def test_single_dict_argument_and_unrelated_tensors():
    received = []

    class DictModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(()))

        def forward(self, batch, extra=None):
            received.append((type(batch), {k: tuple(v.shape) for k, v in batch.items()}, tuple(extra.shape)))
            return self.w * batch["input_ids"].float().mean()

    engine = start(DictModel(), config(curriculum_learning=linear_curriculum(4, SEQ, 2, 4)))
    x = tokens(0)
    mask4d = torch.ones(2, 1, SEQ, SEQ)
    engine({"input_ids": x, "labels": x, "mask4d": mask4d, "scores": torch.ones(2, 3)}, extra=torch.ones(2, SEQ))
    kind, shapes, extra = received[0]
    assert kind is dict
    assert shapes == {"input_ids": (2, 8), "labels": (2, 8), "mask4d": (2, 1, SEQ, SEQ), "scores": (2, 3)}
    assert extra == (2, 8)


def test_custom_schedule_through_the_engine():
    block = {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": 2, "max_difficulty": 12,
             "schedule_type": "custom"}
    model = Recorder()
    engine = start(model, config(micro=1, curriculum_learning=block))
    engine.set_custom_curriculum_learning_schedule(lambda step: 4 * step)
    run_steps(engine, 4, batch=lambda s: torch.ones(1, 4))
    assert [c["curriculum_seqlen"] for c in model.calls] == [4, 8, 12, 12]


def test_custom_schedule_needs_curriculum_on():
    engine = start(Recorder(), config())
    with pytest.raises(RuntimeError, match="^set_custom_curriculum_learning_schedule: curriculum learning is not "
                                           "enabled$"):
        engine.set_custom_curriculum_learning_schedule(lambda s: s)


# ---- the data_efficiency form ------------------------------------------------------------------
def data_efficiency(metrics: dict) -> dict:
    return {"enabled": True, "data_sampling": {"enabled": True, "curriculum_learning": {
        "enabled": True, "curriculum_metrics": metrics}}}


def metric(**over) -> dict:
    m = {"difficulty_type": "value", "clustering_type": "single_cluster", "min_difficulty": 2, "max_difficulty": 10,
         "schedule_type": "fixed_linear", "schedule_config": {"total_curriculum_step": 8, "difficulty_step": 2}}
    m.update(over)
    return m


def test_data_efficiency_seqlen_metric_is_the_same_scheduler():
    model = Recorder()
    engine = start(model, config(micro=1, data_efficiency=data_efficiency({"seqlen": metric()})))
    run_steps(engine, 10, batch=lambda s: torch.ones(1, 4))
    assert [c["curriculum_seqlen"] for c in model.calls] == [2, 4, 4, 6, 6, 8, 8, 10, 10, 10]


@pytest.mark.parametrize("metrics,match", [
    ({"vocabularyrarity": metric()}, "vocabularyrarity: a curriculum by this metric draws the training samples"),
    ({"seqlen": metric(difficulty_type="percentile")}, "percentile"),
    ({"seqlen": metric(), "seqlen_truncate": metric()}, "exactly one"),
])
def test_data_efficiency_other_metrics_are_refused(metrics, match):
    with pytest.raises(ConfigError, match=match):
        zerotrain.initialize(model=Recorder(), config=config(data_efficiency=data_efficiency(metrics)))


def test_data_efficiency_off_means_off():
    de = data_efficiency({"vocabularyrarity": metric()})
    de["data_sampling"]["enabled"] = False
    model = Recorder()
    engine = start(model, config(data_efficiency=de))
    engine(torch.ones(2, 4))
    assert model.calls[-1]["curriculum_seqlen"] is None


def test_both_curriculum_forms_at_once_is_an_error():
    with pytest.raises(ConfigError, match="keep one"):
        zerotrain.initialize(model=Recorder(), config=config(curriculum_learning=linear_curriculum(2, 10, 8, 2),
                                                             data_efficiency=data_efficiency({"seqlen": metric()})))


# ---- checkpoints ---------------------------------------------------------------------------------
def test_frozen_difficulty_survives_a_resume(tmp_path):
    # [4, 16, 8]: the schedule goes back down to 8 after step 4, but 16 is max, so it froze
    block = {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": 4, "max_difficulty": 16,
             "schedule_type": "fixed_discrete", "schedule_config": {"difficulty": [4, 16, 8], "max_step": [2, 4]}}
    engine = start(tiny_gpt(), config(curriculum_learning=block))
    run_steps(engine, 6)
    engine.save_checkpoint(tmp_path)
    losses = run_steps(engine, 2)
    model = tiny_gpt(seed=1)
    seen = []
    model.register_forward_pre_hook(lambda m, a, kw: seen.append(a[0].shape[1]), with_kwargs=True)
    resumed = start(model, config(curriculum_learning=block))
    resumed.load_checkpoint(tmp_path)
    assert run_steps(resumed, 2) == losses
    assert seen == [16, 16]


# ---- every refusal, word for word (the message is the interface) ---------------------------------
_B = {"min_difficulty": 8, "max_difficulty": 64}


def _linear(**over):
    return {**_B, "schedule_type": "fixed_linear", "schedule_config": {"total_curriculum_step": 8, "difficulty_step": 8},
            **over}


REFUSALS = [
    (3, "curriculum_learning: should be a JSON object, got int"),
    ({**_B, "schedule_type": "fixed_lin"}, "curriculum_learning.schedule_type: should be one of fixed_linear, "
                                           "fixed_root, fixed_discrete, custom, got 'fixed_lin', did you mean fixed_linear?"),
    (_linear(min_difficulty="8"), "curriculum_learning.min_difficulty: should be an integer, got '8'"),
    (_linear(max_difficulty=64.0), "curriculum_learning.max_difficulty: should be an integer, got 64.0"),
    ({**_B, "schedule_type": "custom", "schedule_config": {"x": 1}},
     "curriculum_learning.schedule_config.x: unknown key for schedule_type custom (schedule_type custom takes no "
     "schedule_config)"),
    (_linear(schedule_config={"total_curriculum_stp": 1, "difficulty_step": 8}),
     "curriculum_learning.schedule_config.total_curriculum_stp: unknown key for schedule_type fixed_linear, did you "
     "mean total_curriculum_step?"),
    ({**_B, "schedule_type": "fixed_root", "schedule_config": {"total_curriculum_step": 8, "difficulty_step": 8}},
     "curriculum_learning.schedule_config.root_degree is missing: schedule_type fixed_root needs "
     "total_curriculum_step, difficulty_step, root_degree"),
    ({**_B, "schedule_type": "fixed_discrete", "schedule_config": {"difficulty": [], "max_step": []}},
     "curriculum_learning.schedule_config.difficulty: should be a non-empty list of integers, got []"),
    ({**_B, "schedule_type": "fixed_discrete", "schedule_config": {"difficulty": [8, 16], "max_step": [1.5]}},
     "curriculum_learning.schedule_config.max_step: should be a non-empty list of integers, got [1.5]"),
    ({**_B, "schedule_type": "fixed_discrete", "schedule_config": {"difficulty": "8", "max_step": [1]}},
     "curriculum_learning.schedule_config.difficulty: should be a non-empty list of integers, got '8'"),
    ({**_B, "schedule_type": "fixed_discrete", "schedule_config": {"difficulty": [8, 16, 32], "max_step": [5]}},
     "curriculum_learning.schedule_config.max_step: needs one entry fewer than difficulty (3 levels need 2 "
     "boundaries), got 1"),
    ({**_B, "schedule_type": "fixed_discrete", "schedule_config": {"difficulty": [8, 16, 32], "max_step": [5, 5]}},
     "curriculum_learning.schedule_config.max_step: should be strictly increasing, got [5, 5]"),
    ({**_B, "schedule_type": "fixed_discrete", "schedule_config": {"difficulty": [8, 16, 24, 32],
                                                                   "max_step": [2, 5, 4]}},
     "curriculum_learning.schedule_config.max_step: should be strictly increasing, got [2, 5, 4]"),
    ({**_B, "schedule_type": "fixed_root", "schedule_config": {"total_curriculum_step": 8, "difficulty_step": 8,
                                                               "root_degree": 0}},
     "curriculum_learning.schedule_config.root_degree: should be a positive integer, got 0"),
    (_linear(min_difficulty=64, max_difficulty=8), "curriculum_learning.min_difficulty: 64 is above max_difficulty 8"),
]


@pytest.mark.parametrize("block,message", REFUSALS)
def test_each_refusal_says_what_is_wrong_in_full(block, message):
    with pytest.raises(ConfigError) as info:
        CurriculumScheduler(block)
    assert str(info.value) == message


@pytest.mark.parametrize("step,warned", [(4, True), (8, False), (16, False)])
def test_a_difficulty_step_off_multiples_of_8_is_a_warning(zerotrain_log, step, warned):
    CurriculumScheduler(_linear(schedule_config={"total_curriculum_step": 8, "difficulty_step": step}))
    want = [f"curriculum_learning.schedule_config.difficulty_step {step} is not a multiple of 8: tensor cores "
            "prefer multiples of 8"]
    assert [m for m in zerotrain_log.messages if "difficulty_step" in m] == (want if warned else [])


def test_fixed_root_uses_its_degree_and_custom_says_how_to_set_a_function():
    s = CurriculumScheduler({**_B, "schedule_type": "fixed_root",
                             "schedule_config": {"total_curriculum_step": 100, "difficulty_step": 8, "root_degree": 2}})
    assert s.get_difficulty(25) == fixed_root_difficulty(25, 8, 64, 100, 8, 2) != fixed_root_difficulty(25, 8, 64, 100, 8)
    custom = CurriculumScheduler({**_B, "schedule_type": "custom"})
    with pytest.raises(ConfigError) as info:
        custom.get_difficulty(3)
    assert str(info.value) == ("curriculum_learning: schedule_type custom needs a function; call "
                               "engine.set_custom_curriculum_learning_schedule(fn) or "
                               "scheduler.set_custom_get_difficulty(fn) first")
    custom.set_current_difficulty(24)
    assert custom.get_current_difficulty() == 24 and custom.state_dict()["current_difficulty"] == 24


def test_a_state_dict_is_a_copy():
    s = sched(total_curriculum_step=8, difficulty_step=8)
    state = s.state_dict()
    state["schedule_config"]["difficulty_step"] = 99
    assert s.get_state()["schedule_config"]["difficulty_step"] == 8


def test_data_efficiency_errors_name_their_own_path():
    where = "data_efficiency.data_sampling.curriculum_learning.curriculum_metrics"
    cases = [({"vocabularyrarity": metric()}, f"{where}.vocabularyrarity: a curriculum by this metric draws the "
                                              "training samples: pass initialize(training_data=...); without it only "
                                              "a sequence-length metric (seqlen or seqlen_truncate) acts, by cutting "
                                              "each batch"),
             ({"seqlen": metric(), "seqlen_truncate": metric()}, f"{where}: give exactly one of seqlen, seqlen_truncate"),
             ({"seqlen": metric(difficulty_type="percentile")}, f"{where}.seqlen.difficulty_type: percentile is not "
                                                                "supported for a sequence-length curriculum; use value"),
             ({"seqlen": metric(min_difficulty=12)}, f"{where}.seqlen.min_difficulty: 12 is above max_difficulty 10")]
    for metrics, message in cases:
        with pytest.raises(ConfigError) as info:
            zerotrain.initialize(model=Recorder(), config=config(data_efficiency=data_efficiency(metrics)))
        assert str(info.value) == message


def test_both_forms_at_once_says_keep_one_and_other_curriculum_types_move_without_cutting(zerotrain_log):
    with pytest.raises(ConfigError) as info:
        zerotrain.initialize(model=Recorder(), config=config(curriculum_learning=linear_curriculum(2, 10, 8, 2),
                                                             data_efficiency=data_efficiency({"seqlen": metric()})))
    assert str(info.value) == ("curriculum_learning and data_efficiency.data_sampling.curriculum_learning are both "
                               "enabled; keep one")
    model = Recorder()
    engine = start(model, config(micro=1, curriculum_learning={**linear_curriculum(2, 8, 4, 2),
                                                               "curriculum_type": "vocab"}))
    assert ("curriculum learning on (fixed_linear, difficulty 2 -> 8), curriculum_type 'vocab': the schedule moves, "
            "nothing is passed or cut") in zerotrain_log.messages
    run_steps(engine, 2, batch=lambda s: torch.ones(1, 4))
    assert [c["curriculum_seqlen"] for c in model.calls] == [None, None] and [c["shape"] for c in model.calls] == [(1, 4)] * 2
    feature = next(f for f in engine.features if f.name == "curriculum_learning")
    assert feature.log_fields(engine) == {"difficulty": 4} and feature.current_seqlen() is None


def test_the_engine_log_says_how_the_curriculum_acts(zerotrain_log):
    start(Recorder(), config(curriculum_learning=linear_curriculum(2, 8, 4, 2)))
    start(nn_plain(), config(curriculum_learning=linear_curriculum(2, 8, 4, 2)))
    msgs = [m for m in zerotrain_log.messages if m.startswith("curriculum learning on")]
    assert msgs == ["curriculum learning on (fixed_linear, difficulty 2 -> 8), passing curriculum_seqlen to the model",
                    "curriculum learning on (fixed_linear, difficulty 2 -> 8), cutting the batch"]


def nn_plain():
    class Plain(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(()))

        def forward(self, x):
            return (self.w * x.float()).mean()
    return Plain()


def test_a_schedule_that_gives_no_positive_length_is_refused():
    block = {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": 2, "max_difficulty": 12,
             "schedule_type": "custom"}
    engine = start(Recorder(), config(micro=1, curriculum_learning=block))
    for bad in (0, 2.5):
        engine.set_custom_curriculum_learning_schedule(lambda step, bad=bad: bad)
        with pytest.raises(ConfigError) as info:
            engine(torch.ones(1, 4))
        assert str(info.value) == (f"curriculum_learning: the schedule gave sequence length {bad!r}; it must be a "
                                   "positive integer")
    engine = start(nn_plain(), config(micro=1, curriculum_learning=linear_curriculum(2, 8, 4, 2)))
    with pytest.raises(zerotrain.errors.DataError) as info:
        engine(torch.ones(4))
    assert str(info.value) == ("curriculum_learning: no (batch, sequence) tensor in the forward inputs to cut; pass "
                               "input_ids (or a 2-D token tensor first)")


def test_the_feature_reports_the_sequence_length_it_passes():
    engine = start(Recorder(), config(micro=1, curriculum_learning=linear_curriculum(2, 8, 4, 2)))
    run_steps(engine, 2, batch=lambda s: torch.ones(1, 4))
    feature = next(f for f in engine.features if f.name == "curriculum_learning")
    assert feature.current_seqlen() == 4 == curriculum_seqlen(engine)
    assert feature.log_fields(engine) == {"seqlen": 4} and engine.get_pld_theta() is None
    assert engine.feature(CurriculumFeature) is feature


def test_a_forward_without_a_readable_signature_is_passed_the_kwarg():
    from types import SimpleNamespace

    from zerotrain.features.curriculum import CurriculumFeature

    model = torch.nn.Module()
    model.forward = torch.relu  # a builtin: its parameters cannot be read, so **kwargs is assumed
    feature = CurriculumFeature(sched(total_curriculum_step=8, difficulty_step=8))
    feature.on_train_start(SimpleNamespace(module=model, comm=SimpleNamespace(rank=1)))
    assert feature.pass_kwarg is True


# where the config's types speak first: pydantic coerces "8" and 64.0 to integers, reads lists
# and refuses keys ScheduleConfig does not have, each in its own words
TYPED_FIRST = ("unknown key", "should be an integer", "integers, got [1.5]", "integers, got '8'")


@pytest.mark.parametrize("block,message", [(b, m) for b, m in REFUSALS
                                           if isinstance(b, dict) and not any(t in m for t in TYPED_FIRST)])
def test_the_typed_config_refuses_the_same_blocks_in_the_same_words(block, message):
    """One set of rules (config/curriculum.py) for the config file and the scheduler built by hand."""
    from zerotrain.config import load_config

    with pytest.raises(ConfigError) as info:
        load_config({"train_batch_size": 1, "curriculum_learning": {"enabled": True, "curriculum_type": "seqlen",
                                                                    **block}})
    assert str(info.value) == message


def test_under_sequence_parallelism_lengths_below_the_maximum_round_down_to_a_multiple_of_s():
    """S ranks share each sequence: a length that is a multiple of S leaves no piece padded; the
    maximum stays whole (the full sequence, padded like any batch), and no length falls below S."""
    assert [applied_length(d, 31, 2) for d in (1, 5, 11, 18, 30, 31)] == [2, 4, 10, 18, 30, 31]
    assert [applied_length(d, 31, 4) for d in (3, 11, 29, 31)] == [4, 8, 28, 31]
    assert [applied_length(d, 31, 1) for d in (3, 11, 31)] == [3, 11, 31]
