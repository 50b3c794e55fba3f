"""Loss scaler sequences, written out step by step (reference §4 algorithm A and §7)."""

import io

import pytest
import torch

from zerotrain.errors import CheckpointError, ConfigError
from zerotrain.precision import DynamicLossScaler, StaticLossScaler, build_loss_scaler


def run(scaler, overflows):
    scales = []
    for overflow in overflows:
        scaler.update_scale(overflow)
        scales.append(scaler.loss_scale)
    return scales


def test_no_overflow_growth_pattern():
    scaler = DynamicLossScaler(init_scale=2**8, scale_window=2)
    assert scaler.loss_scale == 256
    scales = []
    for i in range(8):
        scaler.update_scale(False)
        assert scaler.cur_iter == i + 1
        scales.append(scaler.loss_scale)
    assert scales == [256, 256, 512, 512, 1024, 1024, 2048, 2048]


def test_no_overflow_window_three():
    scaler = DynamicLossScaler(init_scale=1.0, scale_window=3)
    # first growth on good update window+1, then every window good updates
    assert run(scaler, [False] * 10) == [1, 1, 1, 2, 2, 2, 4, 4, 4, 8]


def test_all_overflow_hysteresis_one():
    scaler = DynamicLossScaler(init_scale=2**4, scale_window=2, hysteresis=1)
    assert run(scaler, [True] * 7) == [8, 4, 2, 1, 1, 1, 1]
    assert scaler.last_overflow_iter == 6
    assert scaler.cur_iter == 7


def test_all_overflow_hysteresis_two_first_overflow_only_decrements():
    scaler = DynamicLossScaler(init_scale=2**4, scale_window=2, hysteresis=2)
    scaler.update_scale(True)
    assert (scaler.loss_scale, scaler.cur_hysteresis) == (16, 1)
    assert run(scaler, [True] * 6) == [8, 4, 2, 1, 1, 1]
    assert scaler.cur_hysteresis == 1


def test_floor_is_held_without_exception_and_counted():
    scaler = DynamicLossScaler(init_scale=2**4, scale_window=2, min_scale=2.0, hysteresis=1)
    assert run(scaler, [True] * 6) == [8, 4, 2, 2, 2, 2]
    assert scaler.at_floor
    assert scaler.overflows_at_floor == 3  # the three overflows seen while already at 2
    # recovery from the floor follows the normal growth rule
    assert run(scaler, [False] * 3) == [2, 2, 4]
    assert scaler.overflows_at_floor == 3


def test_floor_is_never_undershot_by_halving():
    scaler = DynamicLossScaler(init_scale=3.0, scale_window=2, min_scale=1.0, hysteresis=1)
    assert run(scaler, [True] * 3) == [1.5, 1.0, 1.0]


def test_some_overflow_hysteresis_one():
    # §7: two overflows divide by 4, window+1 good steps double once, one overflow halves
    scaler = DynamicLossScaler(init_scale=2**8, scale_window=2, hysteresis=1)
    pattern = [True, True, False, False, False, True]
    assert run(scaler, pattern) == [128, 64, 64, 64, 128, 64]
    assert scaler.last_overflow_iter == 5


def test_some_overflow_hysteresis_two():
    scaler = DynamicLossScaler(init_scale=2**8, scale_window=2, hysteresis=2)
    pattern = [True, True, False, False, False, True, True]
    hysteresis = []
    scales = []
    for overflow in pattern:
        scaler.update_scale(overflow)
        scales.append(scaler.loss_scale)
        hysteresis.append(scaler.cur_hysteresis)
    assert scales == [256, 128, 128, 128, 256, 256, 128]
    # refilled only when the scale grows (non-consecutive mode)
    assert hysteresis == [1, 1, 1, 1, 2, 1, 1]


def test_growth_after_overflow_waits_window_plus_one_good_steps():
    scaler = DynamicLossScaler(init_scale=64.0, scale_window=3, hysteresis=1)
    pattern = [False, False, False, False, True] + [False] * 7
    assert run(scaler, pattern) == [64, 64, 64, 128, 64, 64, 64, 64, 128, 128, 128, 256]


def test_consecutive_hysteresis_refills_on_every_good_step():
    pattern = [True, False, True, False, True, False]
    refill = DynamicLossScaler(init_scale=2**8, scale_window=10, hysteresis=2,
                               consecutive_hysteresis=True)
    hysteresis = []
    for overflow in pattern:
        refill.update_scale(overflow)
        hysteresis.append(refill.cur_hysteresis)
    assert hysteresis == [1, 2, 1, 2, 1, 2]
    assert refill.loss_scale == 256  # isolated overflows never shrink the scale

    plain = DynamicLossScaler(init_scale=2**8, scale_window=10, hysteresis=2)
    assert run(plain, pattern) == [256, 256, 128, 128, 64, 64]


def test_consecutive_hysteresis_two_overflows_in_a_row_still_shrink():
    scaler = DynamicLossScaler(init_scale=2**8, scale_window=10, hysteresis=2,
                               consecutive_hysteresis=True)
    assert run(scaler, [True, True, False, True, True]) == [256, 128, 128, 128, 64]


def test_state_dict_round_trip_continues_identically():
    pattern = [False, True, False, False, True, True, False, False, False, False, True, False]
    original = DynamicLossScaler(init_scale=2**10, scale_window=2, hysteresis=2)
    run(original, pattern[:5])
    buffer = io.BytesIO()
    torch.save(original.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    assert all(isinstance(v, (bool, int, float, str)) for v in state.values())

    restored = DynamicLossScaler(init_scale=2**10, scale_window=2, hysteresis=2)
    restored.load_state_dict(state)
    for name in ("cur_scale", "cur_iter", "last_overflow_iter", "cur_hysteresis"):
        assert getattr(restored, name) == getattr(original, name)
    assert run(restored, pattern[5:]) == run(original, pattern[5:])
    assert restored.state_dict() == original.state_dict()


def test_load_state_dict_of_other_kind_is_refused():
    dynamic = DynamicLossScaler()
    with pytest.raises(CheckpointError, match="static"):
        dynamic.load_state_dict(StaticLossScaler(128.0).state_dict())
    with pytest.raises(CheckpointError, match="dynamic"):
        StaticLossScaler(128.0).load_state_dict(dynamic.state_dict())


def test_static_scaler():
    scaler = StaticLossScaler(128.0)
    assert scaler.dynamic is False
    assert run(scaler, [True, False, True]) == [128, 128, 128]
    assert scaler.state_dict() == {"kind": "static", "cur_scale": 128.0}
    scaler.load_state_dict({"kind": "static", "cur_scale": 4.0})
    assert scaler.loss_scale == 128.0  # config wins


def test_build_loss_scaler():
    args = dict(initial_scale_power=16, loss_scale_window=1000, hysteresis=2,
                consecutive_hysteresis=False, min_loss_scale=1.0)
    assert build_loss_scaler(False, 0.0, **args) is None
    static = build_loss_scaler(True, 512.0, **args)
    assert isinstance(static, StaticLossScaler) and static.loss_scale == 512.0
    dynamic = build_loss_scaler(True, 0, **{**args, "initial_scale_power": 8,
                                            "min_loss_scale": 0.25})
    assert isinstance(dynamic, DynamicLossScaler) and dynamic.dynamic
    assert (dynamic.loss_scale, dynamic.scale_window, dynamic.min_scale) == (256.0, 1000, 0.25)
    assert (dynamic.cur_iter, dynamic.last_overflow_iter, dynamic.cur_hysteresis) == (0, -1, 2)


@pytest.mark.parametrize("override, key", [
    ({"loss_scale": -1.0}, "fp16.loss_scale"),
    ({"loss_scale": float("inf")}, "fp16.loss_scale"),
    ({"loss_scale": True}, "fp16.loss_scale"),
    ({"loss_scale_window": 0}, "fp16.loss_scale_window"),
    ({"min_loss_scale": 0.0}, "fp16.min_loss_scale"),
    ({"hysteresis": 0}, "fp16.hysteresis"),
    ({"initial_scale_power": 0, "min_loss_scale": 2.0}, "fp16.min_loss_scale"),
])
def test_build_loss_scaler_rejects_bad_values(override, key):
    args = dict(fp16_enabled=True, loss_scale=0.0, initial_scale_power=16,
                loss_scale_window=1000, hysteresis=2, consecutive_hysteresis=False,
                min_loss_scale=1.0)
    args.update(override)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        build_loss_scaler(**args)


def test_defaults_are_deepspeeds():
    # window 1000 and hysteresis 2 (reference §4): the 1001st good step doubles, two overflows halve
    default, explicit = DynamicLossScaler(), DynamicLossScaler(2.0**16, 1000, 1.0, 2, False)
    pattern = [False] * 1001 + [True, True, False]
    assert run(default, pattern) == run(explicit, pattern)
    assert default.state_dict() == explicit.state_dict()
    assert run(DynamicLossScaler(), [False] * 1001)[-2:] == [2.0**16, 2.0**17]
    assert run(DynamicLossScaler(), [True, True]) == [2.0**16, 2.0**15]


def test_hysteresis_three_absorbs_two_overflows():
    scaler = DynamicLossScaler(init_scale=2**8, scale_window=100, hysteresis=3)
    assert run(scaler, [True, True, True, True]) == [256, 256, 128, 64]


def test_a_window_of_one_doubles_on_every_good_step():
    assert run(DynamicLossScaler(init_scale=1.0, scale_window=1), [False] * 4) == [1, 2, 4, 8]


def test_state_dict_holds_progress_and_the_config_it_ran_under():
    scaler = DynamicLossScaler(init_scale=2**4, scale_window=3, min_scale=0.5, hysteresis=2,
                               consecutive_hysteresis=True)
    run(scaler, [False, True])
    assert scaler.state_dict() == {
        "kind": "dynamic", "cur_scale": 16.0, "cur_iter": 2, "last_overflow_iter": 1, "cur_hysteresis": 1,
        "overflows_at_floor": 0, "init_scale": 16.0, "scale_window": 3, "min_scale": 0.5, "hysteresis": 2,
        "consecutive_hysteresis": True}


def test_a_scaler_state_that_is_not_one_is_refused_by_name():
    dynamic = DynamicLossScaler()
    for junk in (None, "dynamic", [1]):
        with pytest.raises(CheckpointError, match=r"^loss scaler state is None but the current fp16 config gives a "
                                                  r"dynamic scaler; set fp16.loss_scale as it was when the checkpoint "
                                                  r"was saved, or skip loading the scaler state$"):
            dynamic.load_state_dict(junk)
    state = dynamic.state_dict()
    del state["cur_iter"], state["overflows_at_floor"]
    with pytest.raises(CheckpointError, match=r"^loss scaler state lacks cur_iter, overflows_at_floor$"):
        dynamic.load_state_dict(state)


@pytest.mark.parametrize("make, message", [
    (lambda: DynamicLossScaler(init_scale=0), r"fp16 initial scale \(2\*\*fp16.initial_scale_power\) must be a "
                                             r"finite number > 0, got 0"),
    (lambda: DynamicLossScaler(scale_window=0), r"fp16.loss_scale_window must be an integer >= 1, got 0"),
    (lambda: DynamicLossScaler(min_scale=0.0), r"fp16.min_loss_scale must be a finite number > 0, got 0.0"),
    (lambda: DynamicLossScaler(hysteresis=0), r"fp16.hysteresis must be an integer >= 1, got 0"),
    (lambda: DynamicLossScaler(hysteresis=True), r"fp16.hysteresis must be an integer >= 1, got True"),
    (lambda: DynamicLossScaler(consecutive_hysteresis=1), r"fp16.consecutive_hysteresis must be true or false, "
                                                         r"got 1"),
    (lambda: DynamicLossScaler(init_scale=1.0, min_scale=2.0), r"fp16 initial scale 1 is below fp16.min_loss_scale "
                                                               r"2; raise fp16.initial_scale_power or lower "
                                                               r"fp16.min_loss_scale"),
    (lambda: StaticLossScaler(0), r"fp16.loss_scale must be a finite number > 0, got 0"),
    (lambda: build_loss_scaler(True, -1, 16, 1000, 2, False, 1.0), r"fp16.loss_scale must be a finite number >= 0, "
                                                                    r"got -1"),
    (lambda: build_loss_scaler(True, 0, -1, 1000, 2, False, 1.0), r"fp16.initial_scale_power must be an integer "
                                                                   r">= 0, got -1"),
])
def test_each_refusal_names_the_key_and_the_bound(make, message):
    with pytest.raises(ConfigError, match=f"^{message}$"):
        make()


def test_small_scales_and_windows_are_accepted():
    assert DynamicLossScaler(scale_window=1).scale_window == 1
    assert StaticLossScaler(0.5).loss_scale == 0.5
    static = build_loss_scaler(True, 0.5, 16, 1000, 2, False, 1.0)  # a static scale below 1 is still static
    assert isinstance(static, StaticLossScaler) and static.loss_scale == 0.5
    dynamic = build_loss_scaler(True, 0, 4, 10, 2, True, 1.0)
    assert dynamic.consecutive_hysteresis is True  # the config's flag reaches the scaler
    assert run(dynamic, [True, False, True]) == [16, 16, 16]  # refilled by the good step between
