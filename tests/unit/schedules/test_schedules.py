"""Schedules against the spec (reference.md section 3, 7 and 8).

The reference curves below are written from the spec text, independently of
`zerotrain.schedules.functional`, and compared with what a real scheduler writes into a
real torch optimizer at every step of a grid.
"""

from __future__ import annotations

import enum
import inspect
import math
import os
import warnings

import pytest
import torch

from zerotrain.errors import ConfigError
from zerotrain.schedules import (
    SCHEDULER_TYPES,
    LRRangeTest,
    OneCycle,
    WarmupCosineLR,
    WarmupDecayLR,
    WarmupLR,
    build_scheduler,
    get_scheduler,
    resolve_warmup_steps,
)

LRS = (0.1, 0.02)  # two param groups; optimizer defaults lr is the first


def make_opt(kind: str = "adamw", lrs=LRS, tensor_lr: bool = False):
    groups = []
    for lr in lrs:
        group = {"params": [torch.nn.Parameter(torch.zeros(2))]}
        group["lr"] = torch.tensor(lr, dtype=torch.float64) if tensor_lr else lr
        groups.append(group)
    if kind == "sgd":
        return torch.optim.SGD(groups, lr=lrs[0], momentum=0.9)
    return torch.optim.AdamW(groups, lr=lrs[0])


def group_lrs(opt):
    return [float(g["lr"]) for g in opt.param_groups]


def close(a, b):
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15)


def assert_lrs(got, want, where):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert close(g, w), f"{where}: got {g!r}, want {w!r}"


def advance(opt, sched, *args):
    opt.step()  # no grads: a no-op, but keeps torch's ordering check quiet
    sched.step(*args)


# ----------------------------------------------------------------------------------------
# HF reference, from the spec text of 3.2

def hf_ref(name, s, W, N, lr_init=LRS[0], **kw):
    def ramp():
        return s / max(1, W)

    if name == "constant":
        return 1.0
    if name == "constant_with_warmup":
        return s / max(1.0, W) if s < W else 1.0
    if name == "cosine_warmup_with_min_lr":
        r = kw.get("min_lr_rate", kw.get("min_lr", 0) / lr_init if "min_lr" in kw else None)
        if s < W:
            w = kw.get("warmup_lr_rate")
            return (s + 1) / max(1, W) if w is None else w + (1 - w) * s / max(1, W - 1)
        p = (s - W + 1) / max(1, N - W)
        f = 0.5 * (1 + math.cos(math.pi * 2 * kw.get("num_cycles", 0.5) * p))
        return max(0.0, f * (1 - r) + r)
    if name == "warmup_stable_decay":
        S, D, m = kw["S"], kw["D"], kw.get("min_lr_ratio", 0.0)
        wt, dt = kw.get("warmup_type", "linear"), kw.get("decay_type", "cosine")
        if s < W:
            p = s / max(1, W)
            f = {"linear": p, "cosine": 0.5 * (1 - math.cos(math.pi * p)), "1-sqrt": 1 - math.sqrt(1 - p)}[wt]
            return f * (1 - m) + m
        if s < W + S:
            return 1.0
        if s < W + S + D:
            p = (s - W - S) / max(1, D)
            nc = kw.get("num_cycles", 0.5)
            f = {"linear": 1 - p, "cosine": 0.5 * (1 + math.cos(math.pi * 2 * nc * p)), "1-sqrt": 1 - math.sqrt(p)}[dt]
            return f * (1 - m) + m
        return m
    if s < W:
        return ramp()
    if name == "linear":
        return max(0.0, (N - s) / max(1, N - W))
    if name in ("cosine", "cosine_with_min_lr"):
        p = (s - W) / max(1, N - W)
        f = max(0.0, 0.5 * (1 + math.cos(math.pi * 2 * kw.get("num_cycles", 0.5) * p)))
        if name == "cosine":
            return f
        r = kw["min_lr_rate"] if "min_lr_rate" in kw else kw["min_lr"] / lr_init
        return max(0.0, f * (1 - r) + r)
    if name == "cosine_with_restarts":
        p = (s - W) / max(1, N - W)
        if p >= 1:
            return 0.0
        return max(0.0, 0.5 * (1 + math.cos(math.pi * ((kw.get("num_cycles", 1) * p) % 1))))
    if name == "polynomial":
        end, power = kw.get("lr_end", 1e-7), kw.get("power", 1.0)
        if s > N:
            return end / lr_init
        return ((lr_init - end) * (1 - (s - W) / (N - W)) ** power + end) / lr_init
    if name == "inverse_sqrt":
        ts = kw.get("timescale") or (W if W else 10000)
        return 1 / math.sqrt((s + ts - W) / ts)
    raise AssertionError(name)


GRID = [(0, 10), (3, 10), (1, 1), (10, 10), (12, 10), (5, 23)]
HF_CASES = [
    ("linear", {}),
    ("cosine", {}),
    ("cosine", {"num_cycles": 1.5}),
    ("cosine_with_restarts", {}),
    ("cosine_with_restarts", {"num_cycles": 3}),
    ("polynomial", {}),
    ("polynomial", {"power": 2.0, "lr_end": 0.01}),
    ("constant", {}),
    ("constant_with_warmup", {}),
    ("inverse_sqrt", {}),
    ("inverse_sqrt", {"timescale": 7}),
    ("cosine_with_min_lr", {"min_lr_rate": 0.1}),
    ("cosine_with_min_lr", {"min_lr": 0.005, "num_cycles": 1.0}),
    ("cosine_warmup_with_min_lr", {"min_lr_rate": 0.1}),
    ("cosine_warmup_with_min_lr", {"min_lr": 0.005, "warmup_lr_rate": 0.2}),
]


# polynomial with N == W has no spec formula (HF divides by zero); our choice is tested below
HF_GRID = [(name, kw, W, N) for name, kw in HF_CASES for W, N in GRID if not (name == "polynomial" and W == N)]


@pytest.mark.parametrize("name,kw,W,N", HF_GRID, ids=lambda v: str(v))
def test_hf_matches_spec_formula_at_every_step(name, kw, W, N):
    opt = make_opt()
    sched = get_scheduler(name, opt, num_warmup_steps=W, num_training_steps=N, scheduler_specific_kwargs=kw)
    assert isinstance(sched, torch.optim.lr_scheduler.LambdaLR)
    for s in range(N + 8):
        if s:
            advance(opt, sched)
        assert_lrs(group_lrs(opt), [lr * hf_ref(name, s, W, N, **kw) for lr in LRS], f"{name} W={W} N={N} step {s}")


WSD_CASES = [
    # (W, N, kwargs, S used by the reference)
    (3, 20, {"num_decay_steps": 5}, 12),
    (0, 10, {"num_decay_steps": 4, "decay_type": "linear", "min_lr_ratio": 0.1}, 6),
    (4, None, {"num_decay_steps": 4, "num_stable_steps": 3, "warmup_type": "cosine", "decay_type": "1-sqrt"}, 3),
    (4, 12, {"num_decay_steps": 6, "warmup_type": "1-sqrt", "min_lr_ratio": 0.2, "num_cycles": 1.0}, 2),
    (1, 3, {"num_decay_steps": 1}, 1),
]


@pytest.mark.parametrize("W,N,kw,S", WSD_CASES)
def test_warmup_stable_decay_matches_spec(W, N, kw, S):
    opt = make_opt()
    sched = get_scheduler("warmup_stable_decay", opt, W, N, **kw)
    ref_kw = {k: v for k, v in kw.items() if k not in ("num_decay_steps", "num_stable_steps")}
    for s in range(W + S + kw["num_decay_steps"] + 6):
        if s:
            advance(opt, sched)
        want = hf_ref("warmup_stable_decay", s, W, N, S=S, D=kw["num_decay_steps"], **ref_kw)
        assert_lrs(group_lrs(opt), [lr * want for lr in LRS], f"wsd step {s}")


def test_hf_edge_cases_from_spec():
    # 8.14: cosine rises again after N; restarts are 0 from p >= 1; polynomial holds lr_end.
    lrs = {}
    for name in ("cosine", "cosine_with_restarts", "polynomial"):
        opt = make_opt(lrs=(0.1,))
        sched = get_scheduler(name, opt, 2, 10)
        lrs[name] = [group_lrs(opt)[0]] + [(advance(opt, sched), group_lrs(opt)[0])[1] for _ in range(14)]
    assert close(lrs["cosine"][11], lrs["cosine"][9]) and lrs["cosine"][11] > lrs["cosine"][10]
    assert all(v == 0.0 for v in lrs["cosine_with_restarts"][10:])
    assert all(close(v, 1e-7) for v in lrs["polynomial"][10:])
    # Warmup peaks at index W; constant_with_warmup as well; inverse_sqrt is 1 at W.
    assert close(lrs["cosine"][2], 0.1) and lrs["cosine"][1] < 0.1
    # Our choice where HF divides by zero: polynomial with N == W is finished at W.
    opt = make_opt(lrs=(0.1,))
    sched = get_scheduler("polynomial", opt, 3, 3)
    for _ in range(3):
        advance(opt, sched)
    assert close(group_lrs(opt)[0], 1e-7)


def test_hf_name_forms_and_kwargs_routes():
    class SchedulerType(enum.Enum):
        COSINE = "cosine"

    def trace(name, **kw):
        opt = make_opt()
        sched = get_scheduler(name, opt, 1, 10, **kw)
        return [(advance(opt, sched), group_lrs(opt))[1] for _ in range(6)]

    want = trace("cosine", num_cycles=1.5)
    for name in ("COSINE", "Cosine", SchedulerType.COSINE, "SchedulerType.COSINE"):
        assert trace(name, num_cycles=1.5) == want
    assert trace("cosine", scheduler_specific_kwargs={"num_cycles": 1.5}) == want
    assert trace("cosine") != want
    assert SCHEDULER_TYPES[:3] == ["linear", "cosine", "cosine_with_restarts"] and len(SCHEDULER_TYPES) == 12  # HF 5.24's 11 + the PLD recipe's


def test_hf_requirements_and_errors():
    opt = make_opt()
    get_scheduler("constant", opt)  # ignores warmup and total
    for name in SCHEDULER_TYPES:
        if name in ("constant", "reduce_lr_on_plateau"):
            continue
        kw = {"num_decay_steps": 2} if name == "warmup_stable_decay" else {}
        kw.update({"min_lr_rate": 0.1} if "min_lr" in name else {})
        with pytest.raises(ValueError, match="num_warmup_steps"):
            get_scheduler(name, make_opt(), None, 10, **kw)
        if name not in ("constant_with_warmup", "inverse_sqrt", "warmup_stable_decay"):
            with pytest.raises(ValueError, match="num_training_steps"):
                get_scheduler(name, make_opt(), 2, None, **kw)
        else:
            get_scheduler(name, make_opt(), 2, None, **({"num_stable_steps": 3, **kw} if kw else {}))
    with pytest.raises(ConfigError, match="unknown scheduler 'cosin', did you mean cosine"):
        get_scheduler("cosin", make_opt(), 1, 2)
    with pytest.raises(ConfigError, match="lr_scheduler_kwargs.num_cycle: unknown key for cosine, did you mean num_cycles"):
        get_scheduler("cosine", make_opt(), 1, 10, num_cycle=2)
    with pytest.raises(ValueError, match="lr_end"):
        get_scheduler("polynomial", make_opt(), 1, 10, lr_end=0.5)
    for name in ("cosine_with_min_lr", "cosine_warmup_with_min_lr"):
        with pytest.raises(ValueError, match="exactly one"):
            get_scheduler(name, make_opt(), 1, 10)
        with pytest.raises(ValueError, match="exactly one"):
            get_scheduler(name, make_opt(), 1, 10, min_lr=0.01, min_lr_rate=0.1)
    with pytest.raises(ValueError, match="num_decay_steps"):
        get_scheduler("warmup_stable_decay", make_opt(), 1, 10)
    with pytest.raises(ValueError, match="num_stable_steps"):
        get_scheduler("warmup_stable_decay", make_opt(), 1, None, num_decay_steps=3)
    with pytest.raises(ValueError, match="decay_type"):
        get_scheduler("warmup_stable_decay", make_opt(), 1, 10, num_decay_steps=3, decay_type="exp")
    with pytest.warns(UserWarning, match="num_stable_steps wins"):
        get_scheduler("warmup_stable_decay", make_opt(), 1, 10, num_decay_steps=3, num_stable_steps=2)


def test_reduce_lr_on_plateau_drops_on_twelfth_flat_call():
    opt = make_opt()
    sched = get_scheduler("reduce_lr_on_plateau", opt, 5, 100)
    assert isinstance(sched, torch.optim.lr_scheduler.ReduceLROnPlateau)
    for call in range(1, 13):
        sched.step(1.0)
        want = [lr * 0.1 for lr in LRS] if call >= 12 else list(LRS)
        assert_lrs(group_lrs(opt), want, f"plateau call {call}")
    with pytest.raises(ConfigError, match="did you mean patience"):
        get_scheduler("reduce_lr_on_plateau", make_opt(), patiense=3)


def test_lambda_schedules_state_dict_round_trip():
    opt = make_opt()
    sched = get_scheduler("cosine", opt, 2, 10)
    for _ in range(4):
        advance(opt, sched)
    state = sched.state_dict()
    opt2 = make_opt()
    sched2 = get_scheduler("cosine", opt2, 2, 10)
    sched2.load_state_dict(state)
    advance(opt, sched)
    advance(opt2, sched2)
    assert group_lrs(opt) == group_lrs(opt2)


# ----------------------------------------------------------------------------------------
# resolve_warmup_steps (choice 7, 8.15)

@pytest.mark.parametrize(
    "n,steps,ratio,want",
    [
        (100, 1.5, 0.0, 1),  # 5.x: truncated
        (10, 0.99, 0.0, 10),  # 5.x: ratio, ceil
        (10, 0.25, 0.0, 3),
        (100, 7, 0.5, 7),  # 4.x: steps > 0 win over ratio
        (10, 0, 0.25, 3),  # 4.x: ratio when steps == 0
        (10, 0, 0.0, 0),
        (0, 0.5, 0.0, 0),
    ],
)
def test_resolve_warmup_steps(n, steps, ratio, want):
    assert resolve_warmup_steps(n, steps, ratio) == want


def test_resolve_warmup_steps_rejects_bad_values():
    with pytest.raises(ConfigError, match="warmup_steps"):
        resolve_warmup_steps(10, -1)
    with pytest.raises(ConfigError, match="warmup_ratio"):
        resolve_warmup_steps(10, 0, 1.5)
    with pytest.raises(ConfigError, match="warmup_ratio"):
        resolve_warmup_steps(10, 0, -0.1)


# ----------------------------------------------------------------------------------------
# DeepSpeed reference, from the spec text of 3.1 (`it` = last_batch_iteration)

def ds_gamma(it, n, kind):
    W = max(2, n)
    if it < 0:
        return 0.0
    if it >= W:
        return 1.0
    return it / W if kind == "linear" else math.log(it + 1) / math.log(W)


def ref_warmup(it, lo, hi, n, kind):
    return lo + (hi - lo) * ds_gamma(it, n, kind)


def ref_warmup_decay(it, lo, hi, n, total, kind):
    W = max(2, n)
    gamma = ds_gamma(it, n, kind) if it < W else max(0.0, (total - it) / max(1, total - W))
    return lo + (hi - lo) * gamma


def ref_cosine_ratio(it, n, total, wmin, cmin, kind):
    W = max(2, n)
    if it < 0:
        return 0.0
    if it < W:
        return wmin + ds_gamma(it, n, kind) * (1 - wmin)
    p = min(1.0, (it - W + 1) / max(1, total - W))
    return max(0.0, cmin + (1 - cmin) * (1 + math.cos(math.pi * p)) / 2)


def ref_range(it, lo, size, rate, stair):
    interval = (it + 1) / size
    return lo * (1 + rate * (math.floor(interval) if stair else interval))


def ref_scale(it, first, second, c1, c2):
    total = first + second
    ratio = first / total
    b = it + 1
    x = 1 + b / total - math.floor(1 + b / total)
    ci = b % total
    if x <= ratio:
        scale, count = x / ratio, c1
    else:
        scale, count = (x - 1) / (ratio - 1), c2
    if count > 0:
        pos = ci * count / first if ci <= first else (total - ci) * count / second
        scale = math.floor(pos) / count
    return scale


def ref_one_cycle(it, lo, hi, mlo, mhi, first, second, c1, c2, dlr, dmom, dsize):
    total = first + second
    if it < total:
        s = ref_scale(it, first, second, c1, c2)
        return lo + (hi - lo) * s, mhi - (mhi - mlo) * s
    k = it - total + 1
    lr = lo if (dsize == 0 or dlr == 0) else lo / (1 + dlr * k / dsize)
    mom = mhi if (dsize == 0 or dmom == 0) else mhi * (1 + dmom * k / dsize)
    return lr, mom


def drive(opt, sched, steps, ref, mom_ref=None):
    """Check the construction value, then the value after every step()."""
    assert_lrs(group_lrs(opt), ref(-1), "construction")
    for it in range(steps):
        advance(opt, sched)
        assert_lrs(group_lrs(opt), ref(it), f"it={it}")
        assert_lrs(sched.get_last_lr(), ref(it), f"get_last_lr it={it}")
        assert_lrs(sched.get_lr(), ref(it), f"get_lr it={it}")
        if mom_ref is not None:
            assert [g["betas"][1] for g in opt.param_groups] == [0.99] * len(LRS)
            assert_lrs([g["betas"][0] for g in opt.param_groups], mom_ref(it), f"beta1 it={it}")


@pytest.mark.parametrize("n", [1, 2, 5, 10])
@pytest.mark.parametrize("kind", ["log", "linear"])
@pytest.mark.parametrize("hi", [0.05, None, [0.3, 0.03]])
def test_warmup_lr_matches_spec(n, kind, hi):
    opt = make_opt()
    sched = WarmupLR(opt, warmup_min_lr=0.001, warmup_max_lr=hi, warmup_num_steps=n, warmup_type=kind)
    his = list(LRS) if hi is None else (hi if isinstance(hi, list) else [hi, hi])
    drive(opt, sched, n + 6, lambda it: [ref_warmup(it, 0.001, h, n, kind) for h in his])


@pytest.mark.parametrize("n,total", [(5, 20), (10, 10), (10, 4), (1, 8)])
@pytest.mark.parametrize("kind", ["log", "linear"])
def test_warmup_decay_lr_matches_spec(n, total, kind):
    opt = make_opt()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sched = WarmupDecayLR(opt, total, warmup_min_lr=0.001, warmup_max_lr=[0.05, 0.01], warmup_num_steps=n,
                              warmup_type=kind)
    drive(opt, sched, total + 6, lambda it: [ref_warmup_decay(it, 0.001, h, n, total, kind) for h in (0.05, 0.01)])


@pytest.mark.parametrize("n,total", [(5, 20), (10, 10), (10, 4), (1, 8)])
@pytest.mark.parametrize("kind", ["log", "linear"])
@pytest.mark.parametrize("wmin,cmin", [(0.0, 1e-4), (0.2, 0.05)])
def test_warmup_cosine_lr_matches_spec(n, total, kind, wmin, cmin):
    opt = make_opt()
    sched = WarmupCosineLR(opt, total, warmup_min_ratio=wmin, warmup_num_steps=n, cos_min_ratio=cmin, warmup_type=kind)
    drive(opt, sched, max(total, n) + 6, lambda it: [lr * ref_cosine_ratio(it, n, total, wmin, cmin, kind) for lr in LRS])


@pytest.mark.parametrize("size", [1, 3, 10])
@pytest.mark.parametrize("stair", [False, True])
@pytest.mark.parametrize("rate", [1.0, 0.5])
def test_lr_range_test_matches_spec(size, stair, rate):
    opt = make_opt()
    sched = LRRangeTest(opt, lr_range_test_min_lr=[1e-3, 2e-4], lr_range_test_step_size=size,
                        lr_range_test_step_rate=rate, lr_range_test_staircase=stair)
    drive(opt, sched, 3 * size + 4, lambda it: [ref_range(it, lo, size, rate, stair) for lo in (1e-3, 2e-4)])


ONE_CYCLE_SHAPES = [(4, None, 0, None), (4, 0, 0, None), (3, 5, 0, None), (5, 2, 0, None), (6, None, 2, None),
                    (6, 4, 3, 2), (7, 3, 0, 3), (5, 5, 5, None)]


@pytest.mark.parametrize("first,second,c1,c2", ONE_CYCLE_SHAPES)
@pytest.mark.parametrize("dlr,dmom,dsize", [(0.0, 0.0, 0), (0.5, 0.1, 3), (0.5, 0.0, 0)])
def test_one_cycle_matches_spec(first, second, c1, c2, dlr, dmom, dsize):
    opt = make_opt()
    sched = OneCycle(opt, cycle_min_lr=[0.01, 0.002], cycle_max_lr=[0.1, 0.02], decay_lr_rate=dlr,
                     cycle_first_step_size=first, cycle_second_step_size=second, cycle_first_stair_count=c1,
                     cycle_second_stair_count=c2, decay_step_size=dsize, cycle_min_mom=0.85, cycle_max_mom=0.95,
                     decay_mom_rate=dmom)
    sec = first if second is None else second
    c2 = c1 if c2 is None else c2
    args = (first, sec, c1, c2, dlr, dmom, dsize)
    groups = ((0.01, 0.1), (0.002, 0.02))
    assert [g["betas"] for g in opt.param_groups] == [(0.85, 0.99)] * 2  # 8.12: min_mom at construction
    drive(opt, sched, first + sec + 10,
          lambda it: [ref_one_cycle(it, lo, hi, 0.85, 0.95, *args)[0] for lo, hi in groups],
          lambda it: [ref_one_cycle(it, lo, hi, 0.85, 0.95, *args)[1] for lo, hi in groups])


# ----------------------------------------------------------------------------------------
# Spec section 7 intents and section 8 edge cases

def lrs_after_steps(opt, sched, steps):
    out = []
    for _ in range(steps):
        advance(opt, sched)
        out.append(group_lrs(opt)[0])
    return out


@pytest.mark.parametrize("W", [10, 15, 19, 33])
@pytest.mark.parametrize("kind", ["log", "linear"])
def test_warmup_starts_at_min_and_peaks_at_index_w(W, kind):
    opt = make_opt(lrs=(0.1,))
    lrs = lrs_after_steps(opt, WarmupLR(opt, 0.01, 0.1, W, kind), W + 10)
    assert lrs[0] == 0.01
    assert all(close(v, 0.1) for v in lrs[W:])
    assert all(a < b for a, b in zip(lrs[:W - 1], lrs[1:W]))

    opt = make_opt(lrs=(0.1,))
    lrs = lrs_after_steps(opt, WarmupDecayLR(opt, 3 * W, 0.01, 0.1, W, kind), 3 * W + 5)
    assert lrs[0] == 0.01 and close(lrs[W], 0.1)
    assert all(a > b for a, b in zip(lrs[W:3 * W], lrs[W + 1:3 * W + 1]))
    assert all(v == 0.01 for v in lrs[3 * W:])  # reaches min at it == total and stays


def test_get_lr_before_training_matches_optimizer_and_is_harmless():
    for make in ALL_DS:
        opt = make_opt()
        sched = make(opt)
        assert group_lrs(opt) == sched.get_lr() == sched.get_lr()
        assert sched.last_batch_iteration == -1


ALL_DS = [
    lambda o: LRRangeTest(o),
    lambda o: OneCycle(o, 0.01, 0.1, cycle_first_step_size=4),
    lambda o: WarmupLR(o, warmup_num_steps=5),
    lambda o: WarmupDecayLR(o, 20, warmup_num_steps=5),
    lambda o: WarmupCosineLR(o, 20, warmup_num_steps=5),
]


def test_every_scheduler_keeps_a_tensor_lr_in_place():
    for make in ALL_DS:
        opt = make_opt(tensor_lr=True)
        tensors = [g["lr"] for g in opt.param_groups]
        sched = make(opt)
        for it in range(8):
            advance(opt, sched)
            for g, t in zip(opt.param_groups, tensors):
                assert g["lr"] is t and t.dtype == torch.float64 and t.shape == ()
            assert_lrs(group_lrs(opt), sched.get_lr(), f"{type(sched).__name__} it={it}")


def test_lr_range_staircase_blocks_and_continuous_growth():
    opt = make_opt(lrs=(0.1,))
    sched = LRRangeTest(opt, 1e-3, 4, 1.0, True)
    assert group_lrs(opt)[0] == 1e-3
    lrs = [1e-3] + lrs_after_steps(opt, sched, 15)  # index i is the lr before step i
    assert [len(set(lrs[i:i + 4])) for i in range(0, 16, 4)] == [1, 1, 1, 1]
    opt = make_opt(lrs=(0.1,))
    lrs = [1e-3] + lrs_after_steps(opt, LRRangeTest(opt, 1e-3, 4), 15)
    assert all(a < b for a, b in zip(lrs, lrs[1:]))


def one_cycle_trace(first, second=None, c1=0, c2=None, **kw):
    opt = make_opt(lrs=(0.1,))
    sched = OneCycle(opt, 0.01, 0.1, cycle_first_step_size=first, cycle_second_step_size=second,
                     cycle_first_stair_count=c1, cycle_second_stair_count=c2, **kw)
    lrs, moms = [], []
    for _ in range(40):  # get_lr / get_mom read before each step, as DeepSpeed's tests do
        lrs.append(sched.get_lr()[0])
        moms.append(sched.get_mom()[0][0])
        advance(opt, sched)
    return lrs, moms


def test_one_cycle_step_ratio_and_a_cycle_without_second_half():
    opt = make_opt(lrs=(0.1,))
    assert OneCycle(opt, 0.01, 0.1, cycle_first_step_size=30, cycle_second_step_size=10).step_ratio == 0.75
    lrs, _ = one_cycle_trace(100, second=0)
    assert OneCycle(make_opt(lrs=(0.1,)), 0.01, 0.1, cycle_first_step_size=100,
                    cycle_second_step_size=0).step_ratio == 1.0
    assert lrs[0] == 0.01 and all(a < b for a, b in zip(lrs, lrs[1:]))


def test_one_cycle_peak_rise_fall_decay_and_mom_mirror():
    F = 10
    lrs, moms = one_cycle_trace(F, decay_lr_rate=0.5, decay_step_size=2, decay_mom_rate=0.1)
    assert lrs[0] == 0.01 and close(lrs[F], 0.1)
    assert all(a < b for a, b in zip(lrs[:F], lrs[1:F + 1]))
    assert all(a > b for a, b in zip(lrs[F:2 * F], lrs[F + 1:2 * F + 1]))
    assert all(a > b for a, b in zip(lrs[2 * F:], lrs[2 * F + 1:]))
    assert moms[0] == 0.9 and close(moms[F], 0.8)
    assert all(a > b for a, b in zip(moms[:F], moms[1:F + 1]))
    assert all(a < b for a, b in zip(moms[F:2 * F], moms[F + 1:2 * F + 1]))
    assert max(moms[2 * F:]) > 1.0  # 8.12: decay-phase momentum is not clamped


def test_one_cycle_stairs():
    lrs, _ = one_cycle_trace(8, c1=2)
    # Each half is two stairs of four: flat within a stair, and the peak is exact.
    assert lrs[0] == lrs[3] == 0.01 and lrs[4] == lrs[7] and lrs[8] == 0.1
    assert len(set(lrs[:8])) == 2
    smooth, _ = one_cycle_trace(8)
    stair_full, _ = one_cycle_trace(8, c1=8)
    assert all(close(a, b) for a, b in zip(smooth[:16], stair_full[:16]))
    # Asymmetric: each count shapes only its own half.
    only_up, _ = one_cycle_trace(6, 4, c1=3, c2=0)
    only_down, _ = one_cycle_trace(6, 4, c1=0, c2=2)
    cont, _ = one_cycle_trace(6, 4)
    assert all(close(a, b) for a, b in zip(only_up[6:10], cont[6:10])) and only_up[:6] != cont[:6]
    assert all(close(a, b) for a, b in zip(only_down[:7], cont[:7])) and only_down[7:10] != cont[7:10]
    assert close(only_up[6], 0.1) and close(only_down[6], 0.1)
    both, _ = one_cycle_trace(6, 4, c1=3, c2=2)
    assert both[6] == 0.1  # with stairs on both halves the peak is exact, not 1 ulp off
    assert both[:6] == only_up[:6] and both[7:10] == only_down[7:10]


def test_one_cycle_without_betas_does_not_cycle_momentum():
    opt = make_opt("sgd", lrs=(0.1,))
    with pytest.warns(UserWarning, match="momentum is not cycled"):
        sched = OneCycle(opt, 0.01, 0.1, cycle_first_step_size=3)
    advance(opt, sched)
    assert opt.param_groups[0]["momentum"] == 0.9 and "betas" not in opt.param_groups[0]
    assert sched.get_mom() is None


def test_warmup_cosine_lr_spec_points():
    W, total, wmin, cmin = 10, 30, 0.1, 0.01
    opt = make_opt(lrs=(0.1,))
    lrs = lrs_after_steps(opt, WarmupCosineLR(opt, total, wmin, W, cmin), total + 3)
    assert abs(lrs[0] - 0.1 * wmin) < 1e-7 and abs(lrs[W - 1] - 0.1) < 1e-7
    assert abs(lrs[total - 1] - 0.1 * cmin) < 1e-7 and lrs[W] < 0.1
    assert all(a < b for a, b in zip(lrs[:W - 1], lrs[1:W]))
    assert all(a > b for a, b in zip(lrs[W - 1:total - 1], lrs[W:total]))
    # Every group, 0 at construction even with warmup_min_ratio > 0 (8.10), then log(2)/log(10).
    opt = make_opt()
    sched = WarmupCosineLR(opt, 100, warmup_min_ratio=0.3, warmup_num_steps=10)
    assert group_lrs(opt) == [0.0, 0.0]
    sched = WarmupCosineLR(make_opt(), 100, warmup_num_steps=10)
    sched.step(1)
    assert_lrs(group_lrs(sched.optimizer), [lr * math.log(2) / math.log(10) for lr in LRS], "step(1)")
    # total == warmup: cos_min right after warmup.
    opt = make_opt(lrs=(0.1,))
    lrs = lrs_after_steps(opt, WarmupCosineLR(opt, 5, warmup_num_steps=5, cos_min_ratio=0.01), 12)
    assert all(close(v, 0.1 * 0.01) for v in lrs[5:])


def test_warmup_types():
    with pytest.warns(UserWarning, match="using 'log'"):
        weird = WarmupCosineLR(make_opt(lrs=(0.1,)), 100, warmup_num_steps=10, warmup_type="exp")
    log = WarmupCosineLR(make_opt(lrs=(0.1,)), 100, warmup_num_steps=10, warmup_type="log")
    lin = WarmupCosineLR(make_opt(lrs=(0.1,)), 100, warmup_num_steps=10, warmup_type="linear")
    for it in range(10):
        for s in (weird, log, lin):
            s.step()
        assert weird.get_lr() == log.get_lr()
        assert close(lin.get_lr_ratio(), it / 10)


def test_warmup_defaults_and_small_warmup():
    sched = WarmupLR(make_opt(), warmup_num_steps=3)
    assert sched.max_lrs == list(LRS)  # inherits each group's own lr
    assert WarmupDecayLR(make_opt(), 100, warmup_num_steps=5).max_lrs == [0.001, 0.001]  # 8.11: literal default
    # 8.9: warmup_num_steps 1 becomes 2, so linear gives 0, 0.05, 0.1.
    opt = make_opt(lrs=(0.1,))
    assert lrs_after_steps(opt, WarmupLR(opt, 0.0, 0.1, 1, "linear"), 3) == [0.0, 0.05, 0.1]
    assert WarmupCosineLR(make_opt(), 10, warmup_num_steps=1).warmup_num_steps == 2


def test_validation_errors():
    for cls, extra in ((WarmupLR, ()), (WarmupDecayLR, (100,)), (WarmupCosineLR, (100,))):
        for bad in (None, 0, -3, 4.0, True):
            with pytest.raises(ValueError, match="warmup_num_steps"):
                cls(make_opt(), *extra, warmup_num_steps=bad)
    for bad in (0, -5, 2.5):
        with pytest.raises(ValueError, match="step_size"):
            LRRangeTest(make_opt(), lr_range_test_step_size=bad)
    for first, second in ((0, 0), (0, None), (-1, None), (0, 100), (100, -1)):
        with pytest.raises(ValueError, match="step_size"):
            OneCycle(make_opt(), 0.01, 0.1, cycle_first_step_size=first, cycle_second_step_size=second)
    OneCycle(make_opt(), 0.01, 0.1, cycle_first_step_size=100, cycle_second_step_size=0)
    with pytest.raises(ValueError, match="one per param group"):
        OneCycle(make_opt(), [0.01, 0.02, 0.03], 0.1)
    with pytest.raises(ValueError, match="one per param group"):
        WarmupLR(make_opt(), warmup_max_lr=[0.1])
    with pytest.raises(AssertionError, match="step"):
        WarmupLR(make_opt(), last_batch_iteration=5).get_last_lr()


def test_state_dict_round_trip():
    for make in ALL_DS:
        opt = make_opt()
        sched = make(opt)
        for _ in range(7):
            advance(opt, sched)
        state = sched.state_dict()
        assert state == {"last_batch_iteration": 6}
        opt2 = make_opt()
        sched2 = make(opt2)
        sched2.load_state_dict(state)
        advance(opt, sched)
        advance(opt2, sched2)
        assert group_lrs(opt) == group_lrs(opt2) and sched2.last_batch_iteration == 7


# ----------------------------------------------------------------------------------------
# build_scheduler: the config "scheduler" block

def test_build_scheduler_lookup():
    sched = build_scheduler("WarmupLR", make_opt(), {"warmup_num_steps": 5, "warmup_max_lr": 0.01})
    assert isinstance(sched, WarmupLR)
    assert isinstance(build_scheduler("warmupdecaylr", make_opt(), {"total_num_steps": 10, "warmup_num_steps": 2}), WarmupDecayLR)
    step_lr = build_scheduler("StepLR", make_opt(), {"step_size": 2})
    assert isinstance(step_lr, torch.optim.lr_scheduler.StepLR)
    assert isinstance(build_scheduler("OneCycle", make_opt(), {"cycle_min_lr": 0.01, "cycle_max_lr": 0.1}), OneCycle)


def test_build_scheduler_errors():
    with pytest.raises(ConfigError, match=r"^scheduler.type: unknown scheduler 'WarmpLR', did you mean WarmupLR\?$"):
        build_scheduler("WarmpLR", make_opt(), {})
    with pytest.raises(ConfigError, match=r"^scheduler.params.warmup_num_step: unknown key, did you mean warmup_num_steps\?$"):
        build_scheduler("WarmupLR", make_opt(), {"warmup_num_step": 10})
    with pytest.raises(ConfigError, match=r"^scheduler.params.total_num_steps: required"):
        build_scheduler("WarmupCosineLR", make_opt(), {"warmup_num_steps": 10})
    with pytest.raises(ConfigError, match=r"^scheduler.params: warmup_num_steps: must be an int > 0"):
        build_scheduler("WarmupLR", make_opt(), {"warmup_num_steps": -1})
    with pytest.raises(ConfigError, match=r"^scheduler.params: "):
        build_scheduler("LRRangeTest", make_opt(), {"lr_range_test_step_size": 0})
    with pytest.raises(ConfigError, match=r"^scheduler.params.gama: unknown key, did you mean gamma\?$"):
        build_scheduler("StepLR", make_opt(), {"step_size": 2, "gama": 0.5})


# ----------------------------------------------------------------------------------------
# Defaults, resumes, edges and messages (each found unpinned by harness/mutation.py)

# Under mutmut (harness/mutation.py) every mutated function is called through a trampoline,
# a stack frame more, so where a warning points is checked outside mutmut only.
UNDER_MUTMUT = "MUTANT_UNDER_TEST" in os.environ


def points_at_caller(warning) -> bool:
    return UNDER_MUTMUT or warning.filename == __file__


def _ds_lrs(make, steps=12):
    opt = make_opt()
    sched = make(opt)
    out = [group_lrs(opt)]
    for _ in range(steps):
        advance(opt, sched)
        out.append(group_lrs(opt))
    return out


@pytest.mark.parametrize("implicit,explicit", [
    (lambda o: LRRangeTest(o), lambda o: LRRangeTest(o, 1e-3, 2000, 1.0, False)),
    (lambda o: WarmupLR(o), lambda o: WarmupLR(o, 0.0, None, 1000, "log")),
    (lambda o: WarmupDecayLR(o, 5000), lambda o: WarmupDecayLR(o, 5000, 0.0, 0.001, 1000, "log")),
    (lambda o: WarmupCosineLR(o, 5000), lambda o: WarmupCosineLR(o, 5000, 0.0, 1000, 1e-4, "log")),
    (lambda o: OneCycle(o, 0.01, 0.1),
     lambda o: OneCycle(o, 0.01, 0.1, 0.0, 2000, 2000, 0, 0, 0, True, 0.8, 0.9, 0.0)),
], ids=["LRRangeTest", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle"])
def test_deepspeed_defaults_are_the_spec_defaults(implicit, explicit):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the defaults are valid: nothing to warn about
        assert _ds_lrs(implicit) == _ds_lrs(explicit)


def test_one_cycle_defaults_past_the_cycle():
    # a short cycle with the default decay (none): lr parks at min and beta1 at max
    opt = make_opt(lrs=(0.1,))
    sched = OneCycle(opt, 0.01, 0.1, cycle_first_step_size=2)
    for _ in range(8):
        advance(opt, sched)
    assert group_lrs(opt) == [0.01] and opt.param_groups[0]["betas"] == (0.9, 0.99)


@pytest.mark.parametrize("make", ALL_DS, ids=["LRRangeTest", "OneCycle", "WarmupLR", "WarmupDecayLR",
                                              "WarmupCosineLR"])
def test_a_scheduler_built_at_an_iteration_continues_from_it(make):
    opt = make_opt()
    sched = make(opt)
    for _ in range(6):
        advance(opt, sched)  # last_batch_iteration 5
    opt2 = make_opt()
    resumed = make_resumed(make, opt2, 5)
    assert resumed.state_dict() == {"last_batch_iteration": 5}
    advance(opt, sched)
    advance(opt2, resumed)
    assert group_lrs(opt2) == group_lrs(opt)
    sched.step(9)
    resumed.step(9)  # an explicit iteration, as the engine's lr_kwargs may pass it
    assert group_lrs(opt2) == group_lrs(opt) and resumed.last_batch_iteration == 9


def make_resumed(make, opt, it):
    """`make` with last_batch_iteration=it: the factories of ALL_DS take keyword overrides."""
    probe = make(make_opt())
    cls = type(probe)
    args = {LRRangeTest: {}, OneCycle: {"cycle_min_lr": 0.01, "cycle_max_lr": 0.1, "cycle_first_step_size": 4},
            WarmupLR: {"warmup_num_steps": 5}, WarmupDecayLR: {"total_num_steps": 20, "warmup_num_steps": 5},
            WarmupCosineLR: {"total_num_steps": 20, "warmup_num_steps": 5}}[cls]
    return cls(opt, **args, last_batch_iteration=it)


def test_one_cycle_momentum_decays_by_its_own_rate_and_step_size():
    lrs, moms = one_cycle_trace(2, decay_lr_rate=0.0, decay_mom_rate=0.5, decay_step_size=1)
    # read before each step, so index i is it = i - 1; past the 4-step cycle (it >= 4)
    # beta1 = max * (1 + rate * k / size) with k = it - total + 1
    assert [round(m, 12) for m in moms[5:8]] == [round(0.9 * (1 + 0.5 * k), 12) for k in (1, 2, 3)]
    assert lrs[5:8] == [0.01] * 3
    _, moms = one_cycle_trace(2, decay_mom_rate=0.5, decay_step_size=0)  # no step size: no decay
    assert moms[5:8] == [0.9] * 3


def test_one_cycle_accepts_a_one_step_rise_and_refuses_bad_stairs():
    lrs, _ = one_cycle_trace(1, 1)
    assert lrs[:3] == [0.01, 0.1, 0.01]
    for key in ("cycle_first_stair_count", "cycle_second_stair_count"):
        for bad in (-1, 1.5):
            with pytest.raises(ValueError, match=rf"^{key}: must be an int >= 0, got {bad}$"):
                OneCycle(make_opt(), 0.01, 0.1, **{key: bad})
    with pytest.raises(ValueError, match=r"^decay_step_size: must be >= 0, got -1$"):
        OneCycle(make_opt(), 0.01, 0.1, decay_step_size=-1)


@pytest.mark.parametrize("make,key", [
    (lambda o, v: LRRangeTest(o, lr_range_test_min_lr=v), "lr_range_test_min_lr"),
    (lambda o, v: OneCycle(o, v, 0.1), "cycle_min_lr"),
    (lambda o, v: OneCycle(o, 0.01, v), "cycle_max_lr"),
    (lambda o, v: OneCycle(o, 0.01, 0.1, cycle_min_mom=v), "cycle_min_mom"),
    (lambda o, v: OneCycle(o, 0.01, 0.1, cycle_max_mom=v), "cycle_max_mom"),
    (lambda o, v: WarmupLR(o, warmup_min_lr=v), "warmup_min_lr"),
    (lambda o, v: WarmupLR(o, warmup_max_lr=v), "warmup_max_lr"),
])
def test_a_per_group_list_of_the_wrong_length_names_its_key(make, key):
    with pytest.raises(ValueError, match=rf"^{key}: expected 2 values \(one per param group\), got 3$"):
        make(make_opt(), [0.1, 0.2, 0.3])


def test_one_cycle_writes_tensor_betas_in_place():
    b1, b2 = torch.tensor(0.5), torch.tensor(0.5)
    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))], lr=0.1, betas=(b1, b2))
    sched = OneCycle(opt, 0.01, 0.1, cycle_first_step_size=2)
    betas = opt.param_groups[0]["betas"]
    assert betas[0] is b1 and betas[1] is b2 and float(b1) == pytest.approx(0.8) and float(b2) == pytest.approx(0.99)
    advance(opt, sched)
    assert betas[0] is b1 and float(b1) == pytest.approx(sched.get_mom()[0][0])
    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    b1 = torch.tensor(0.5)
    opt.param_groups[0]["betas"] = (b1, 0.5)  # a tensor beta1 beside a float beta2
    OneCycle(opt, 0.01, 0.1, cycle_first_step_size=2)
    assert opt.param_groups[0]["betas"][0] is b1 and opt.param_groups[0]["betas"][1] == 0.99
    assert float(b1) == pytest.approx(0.8)


class _DuckOptimizer:
    """Not a torch Optimizer, but with param_groups: DeepSpeed's schedulers accept it."""

    def __init__(self, lr):
        self.param_groups = [{"lr": lr}]


def test_schedulers_take_any_object_with_param_groups_and_refuse_others():
    duck = _DuckOptimizer(0.1)
    sched = WarmupLR(duck, warmup_num_steps=4)
    sched.step()
    sched.step()
    assert 0 < duck.param_groups[0]["lr"] < 0.1
    with pytest.warns(UserWarning, match="^OneCycle: _DuckOptimizer has no `betas`") as caught:
        assert OneCycle(duck, 0.01, 0.1).get_mom() is None
    assert points_at_caller(caught[0])  # the warning points at the caller's line
    with pytest.raises(TypeError, match="^int is not an optimizer$"):
        WarmupLR(3)


def test_an_unknown_warmup_type_warns_at_the_caller_and_uses_log():
    with pytest.warns(UserWarning, match=r"^warmup_type: unknown 'exp', using 'log'$") as caught:
        sched = WarmupLR(make_opt(), warmup_num_steps=4, warmup_type="exp")
    assert points_at_caller(caught[0]) and sched.warmup_type == "log"


def test_get_last_lr_before_any_write_says_what_to_do():
    with pytest.raises(AssertionError, match=r"^get_last_lr\(\) called before the scheduler wrote any lr; "
                                             r"call step\(\) first$"):
        WarmupLR(make_opt(), last_batch_iteration=5).get_last_lr()


@pytest.mark.parametrize("cls", [WarmupDecayLR, WarmupCosineLR])
def test_total_num_steps_must_be_a_number_at_least_zero(cls):
    for bad in (None, True, -1):
        with pytest.raises(ValueError, match=rf"^total_num_steps: must be a number >= 0, got {bad}$"):
            cls(make_opt(), bad, warmup_num_steps=2)
    with pytest.warns(UserWarning) if cls is WarmupDecayLR else warnings.catch_warnings():
        cls(make_opt(), 0, warmup_num_steps=2)  # 0 is allowed (WarmupDecayLR warns: total < warmup)


def test_warmup_decay_lr_warns_only_when_total_is_below_warmup():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        WarmupDecayLR(make_opt(), 5, warmup_num_steps=5)
    with pytest.warns(UserWarning, match=r"^WarmupDecayLR: total_num_steps \(4\) < warmup_num_steps \(5\); "
                                         r"the lr drops to min right after warmup$") as caught:
        WarmupDecayLR(make_opt(), 4, warmup_num_steps=5)
    assert points_at_caller(caught[0])


def test_warmup_decay_lr_decays_over_one_step_after_warmup():
    # total - warmup == 1: max at it == W - 1 (log), max again at it == W (gamma 1/1), min at total
    opt = make_opt(lrs=(0.1,))
    lrs = lrs_after_steps(opt, WarmupDecayLR(opt, 6, 0.0, 0.1, 5, "linear"), 8)
    assert lrs[5] == pytest.approx(0.1) and lrs[6] == 0.0 and lrs[7] == 0.0


@pytest.mark.parametrize("ds,hf", [
    ({"type": "WarmupDecayLR", "params": {"total_num_steps": 10, "warmup_max_lr": 0.1}}, ("linear", {})),
    ({"type": "WarmupCosineLR", "params": {"total_num_steps": 10, "cos_min_ratio": 0.05}},
     ("cosine_with_min_lr", {"min_lr_rate": 0.05})),
    ({"type": "WarmupLR", "params": {"warmup_max_lr": 0.1}}, ("constant", {})),
], ids=["WarmupDecayLR", "WarmupCosineLR", "WarmupLR"])
def test_no_warmup_through_the_config_is_hf_schedule_with_no_warmup(ds, hf):
    """`warmup_num_steps: 0` (HF's "auto" with no warmup): at the peak from the first step,
    then the decay over total_num_steps, step for step what HF's schedule gives up to N
    (past N DeepSpeed's cosine stays at its floor where HF's rises again)."""
    opt = make_opt(lrs=(0.1,))
    sched = build_scheduler(ds["type"], opt, {**ds["params"], "warmup_num_steps": 0})
    assert sched.warmup_num_steps == 0
    ref_opt = make_opt(lrs=(0.1,))
    ref = get_scheduler(hf[0], ref_opt, num_warmup_steps=0, num_training_steps=10, scheduler_specific_kwargs=hf[1])
    got, want = [group_lrs(opt)[0]], [group_lrs(ref_opt)[0]]
    for _ in range(12):
        advance(opt, sched)
        advance(ref_opt, ref)
        got.append(group_lrs(opt)[0])
        want.append(group_lrs(ref_opt)[0])
    assert all(close(g, w) for g, w in zip(got[:11], want[:11])), (got, want)
    assert got[11] == got[12]  # and past N it stays put


def test_build_scheduler_params_none_and_not_an_object():
    assert isinstance(build_scheduler("LRRangeTest", make_opt(), None), LRRangeTest)
    with pytest.raises(ConfigError, match=r"^scheduler.params: expected an object, got list$"):
        build_scheduler("LRRangeTest", make_opt(), [1])
    with pytest.raises(ConfigError, match=r"^scheduler.type: expected a string, got 3$"):
        build_scheduler(3, make_opt(), {})


@pytest.mark.parametrize("name", ["LRScheduler", "_LRScheduler", "Optimizer", "Counter"])
def test_build_scheduler_refuses_names_in_torch_that_are_not_schedulers(name):
    with pytest.raises(ConfigError, match=rf"^scheduler.type: unknown scheduler '{name}'"):
        build_scheduler(name, make_opt(), {})


# ---- HF schedules: edges the grid does not reach -------------------------------------------

def _hf_curve(name, W, N, steps=None, **kw):
    opt = make_opt(lrs=(0.1,))
    sched = get_scheduler(name, opt, num_warmup_steps=W, num_training_steps=N, scheduler_specific_kwargs=kw)
    out = [group_lrs(opt)[0] / 0.1]
    for _ in range(steps if steps is not None else N + 2):
        advance(opt, sched)
        out.append(group_lrs(opt)[0] / 0.1)
    return out


def test_hf_one_step_decays():
    # N - W == 1: the decay is one step long, so the step after warmup is still at the peak
    assert _hf_curve("linear", 4, 5)[4:7] == [1.0, 0.0, 0.0]
    poly = _hf_curve("polynomial", 4, 5, lr_end=1e-3)
    assert close(poly[4], 1.0) and close(poly[5], 0.01) and close(poly[6], 0.01)
    # power 0: flat at the peak through step N, lr_end only after it
    flat = _hf_curve("polynomial", 2, 6, power=0.0, lr_end=1e-3)
    assert all(close(v, 1.0) for v in flat[2:7]) and close(flat[7], 0.01)


def test_hf_warmup_with_a_warmup_lr_rate_over_two_steps():
    f = _hf_curve("cosine_warmup_with_min_lr", 2, 10, min_lr_rate=0.1, warmup_lr_rate=0.5)
    assert f[:2] == [0.5, 1.0]


def test_hf_num_cycles_reaches_the_warmup_min_lr_curve():
    f = _hf_curve("cosine_warmup_with_min_lr", 0, 4, min_lr_rate=0.0, num_cycles=1.0)
    # a whole cycle: 1 -> 0 at the middle -> 1 at the end (shifted by one step)
    assert [round(v, 9) for v in f[:4]] == [0.5, 0.0, 0.5, 1.0]


def test_hf_constant_with_last_epoch_and_lambda_resume():
    opt = make_opt(lrs=(0.1,))
    for g in opt.param_groups:
        g["initial_lr"] = g["lr"]
    sched = get_scheduler("constant", opt, last_epoch=3)
    assert sched.last_epoch == 4
    resumed_opt = make_opt(lrs=(0.1,))
    for g in resumed_opt.param_groups:
        g["initial_lr"] = g["lr"]
    resumed = get_scheduler("linear", resumed_opt, 2, 10, scheduler_specific_kwargs={"last_epoch": 3})
    assert resumed.last_epoch == 4 and close(group_lrs(resumed_opt)[0], 0.1 * F_linear(4, 2, 10))


def F_linear(step, W, N):
    return step / W if step < W else max(0.0, (N - step) / max(1, N - W))


def test_hf_names_aliases_and_kwargs_given_twice():
    assert isinstance(get_scheduler("reduce_on_plateau", make_opt(), factor=0.5), torch.optim.lr_scheduler.ReduceLROnPlateau)
    assert get_scheduler("reduce_lr_on_plateau", make_opt(), factor=0.5, patience=0).factor == 0.5
    assert _hf_curve("cosine-with-restarts", 0, 4) == _hf_curve("cosine_with_restarts", 0, 4)
    with pytest.raises(ConfigError, match=r"^lr_scheduler_type: expected a string, got int$"):
        get_scheduler(3, make_opt())
    with pytest.raises(ConfigError, match=r"^lr_scheduler_type: 'greedy' is not supported by zerotrain$"):
        get_scheduler("GREEDY", make_opt())
    same = get_scheduler("cosine", make_opt(), 0, 10, scheduler_specific_kwargs={"num_cycles": 1.0}, num_cycles=1.0)
    assert sched_lrs_equal(same, get_scheduler("cosine", make_opt(), 0, 10, num_cycles=1.0))
    with pytest.raises(ConfigError, match=r"^lr_scheduler_kwargs.num_cycles: given twice with different values$"):
        get_scheduler("cosine", make_opt(), 0, 10, scheduler_specific_kwargs={"num_cycles": 1.0}, num_cycles=2.0)
    with pytest.raises(ConfigError, match=r"^lr_scheduler_kwargs.zzz: unknown key for cosine, cosine accepts "
                                          r"num_cycles, last_epoch$"):
        get_scheduler("cosine", make_opt(), 0, 10, zzz=1)
    with pytest.raises(ConfigError, match=r"^lr_scheduler_kwargs.zzz: unknown key for linear, linear accepts last_epoch$"):
        get_scheduler("linear", make_opt(), 0, 10, zzz=1)


def sched_lrs_equal(a, b, steps=8):
    for _ in range(steps):
        a.optimizer.step()
        a.step()
        b.optimizer.step()
        b.step()
        if group_lrs(a.optimizer) != group_lrs(b.optimizer):
            return False
    return True


def test_hf_argument_errors_name_what_is_wrong():
    with pytest.raises(ValueError, match=r"^num_warmup_steps must be >= 0, got -1$"):
        get_scheduler("linear", make_opt(), -1, 10)
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=1e-3)
    with pytest.raises(ValueError, match=r"must be smaller than the initial lr"):
        get_scheduler("polynomial", opt, 0, 10, lr_end=1e-3)  # equal is not smaller
    with pytest.raises(ValueError, match=r"^exactly one of min_lr and min_lr_rate must be set$"):
        get_scheduler("cosine_with_min_lr", make_opt(), 0, 10)
    with pytest.raises(ValueError, match=r"^warmup_linear_decay_exp needs num_training_steps > 0, got 0$"):
        get_scheduler("warmup_linear_decay_exp", make_opt(), 0, 0)
    assert _hf_curve("warmup_linear_decay_exp", 0, 1)[:2] == [1.0, 1.0]  # one step is enough
    for key, bad in (("decay_rate", True), ("decay_rate", 0), ("decay_steps", True)):
        with pytest.raises(ValueError, match=rf"^{key}: should be a number"):
            get_scheduler("warmup_linear_decay_exp", make_opt(), 2, 10, **{key: bad})
    with pytest.raises(ValueError, match=r"^warmup_stable_decay requires `num_decay_steps` in the scheduler kwargs$"):
        get_scheduler("warmup_stable_decay", make_opt(), 2, 10)
    with pytest.raises(ValueError, match=r"^warmup_stable_decay requires `num_training_steps` or `num_stable_steps`$"):
        get_scheduler("warmup_stable_decay", make_opt(), 2, None, num_decay_steps=3)
    with pytest.raises(ValueError, match=r"^decay_type: unknown 'exp', expected one of linear, cosine, 1-sqrt$"):
        get_scheduler("warmup_stable_decay", make_opt(), 2, 10, num_decay_steps=3, decay_type="exp")


def test_wsd_warnings_point_at_the_caller():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warmup + decay == N: no stable phase, nothing wrong
        get_scheduler("warmup_stable_decay", make_opt(), 4, 10, num_decay_steps=6)
    with pytest.warns(UserWarning, match=r"^warmup_stable_decay: warmup \(4\) \+ decay \(7\) exceed the 10 training "
                                         r"steps; decay starts before warmup ends$") as caught:
        get_scheduler("warmup_stable_decay", make_opt(), 4, 10, num_decay_steps=7)
    assert points_at_caller(caught[0])
    with pytest.warns(UserWarning, match=r"^warmup_stable_decay: both num_training_steps and num_stable_steps "
                                         r"given, num_stable_steps wins$") as caught:
        get_scheduler("warmup_stable_decay", make_opt(), 4, 10, num_decay_steps=3, num_stable_steps=2)
    assert points_at_caller(caught[0])


def test_resolve_warmup_steps_defaults_edges_and_messages():
    assert resolve_warmup_steps(100) == 0
    assert resolve_warmup_steps(10, 1) == 1  # a count from 1 on; below 1 it is a ratio
    assert resolve_warmup_steps(10, 0, 1.0) == 10  # a ratio of 1 is allowed
    for key, kw in (("warmup_steps", {"warmup_steps": "5"}), ("warmup_steps", {"warmup_steps": True}),
                    ("warmup_ratio", {"warmup_ratio": float("nan")})):
        with pytest.raises(ConfigError, match=rf"^{key}: expected a number, got "):
            resolve_warmup_steps(10, **kw)
    with pytest.raises(ConfigError, match=r"^num_training_steps: must be >= 0, got -1$"):
        resolve_warmup_steps(-1)


# The curves of functional.py carry the spec's defaults too (callers of the module use them).
from zerotrain.schedules import functional as Fn  # noqa: E402

FUNCTION_DEFAULTS = [
    (Fn.cosine_multiplier, dict(num_warmup_steps=2, num_training_steps=12), dict(num_cycles=0.5)),
    (Fn.cosine_with_restarts_multiplier, dict(num_warmup_steps=2, num_training_steps=12), dict(num_cycles=1.0)),
    (Fn.polynomial_multiplier, dict(num_warmup_steps=2, num_training_steps=12, lr_init=0.1),
     dict(lr_end=1e-7, power=1.0)),
    (Fn.cosine_with_min_lr_multiplier, dict(num_warmup_steps=2, num_training_steps=12, min_lr_rate=0.1),
     dict(num_cycles=0.5)),
    (Fn.cosine_warmup_with_min_lr_multiplier, dict(num_warmup_steps=2, num_training_steps=12, min_lr_rate=0.1),
     dict(num_cycles=0.5, warmup_lr_rate=None)),
    (Fn.warmup_stable_decay_multiplier, dict(num_warmup_steps=3, num_stable_steps=2, num_decay_steps=5),
     dict(warmup_type="linear", decay_type="cosine", min_lr_ratio=0.0, num_cycles=0.5)),
    (Fn.warmup_linear_decay_exp_multiplier, dict(num_training_steps=3000, warmup=0.001),
     dict(decay_rate=0.99, decay_steps=1000)),
    (Fn.warmup_cosine_ratio, dict(warmup_num_steps=3, total_num_steps=12), dict(warmup_min_ratio=0.0,
                                                                                cos_min_ratio=1e-4)),
    (Fn.lr_range_test_lr, dict(min_lr=0.1, step_size=3, step_rate=1.0), dict(staircase=False)),
    (Fn.one_cycle_scale, dict(first_step_size=3, second_step_size=3), dict(first_stair_count=0,
                                                                            second_stair_count=0)),
    (Fn.one_cycle_lr, dict(min_lr=0.01, max_lr=0.1, first_step_size=3, second_step_size=3),
     dict(first_stair_count=0, second_stair_count=0, decay_lr_rate=0.0, decay_step_size=0)),
    (Fn.one_cycle_mom, dict(min_mom=0.8, max_mom=0.9, first_step_size=3, second_step_size=3),
     dict(first_stair_count=0, second_stair_count=0, decay_mom_rate=0.0, decay_step_size=0)),
]


@pytest.mark.parametrize("fn,required,defaults", FUNCTION_DEFAULTS, ids=lambda v: getattr(v, "__name__", ""))
def test_curve_defaults_are_the_spec_defaults(fn, required, defaults):
    first = next(iter(inspect.signature(fn).parameters))  # "step" (HF) or "it" (DeepSpeed)
    steps = [0, 1, 2, 3, 4, 5, 6, 8, 10, 12, 14, 1500, 2999]
    assert [fn(**{first: s}, **required) for s in steps] == [fn(**{first: s}, **required, **defaults) for s in steps]


def test_warmup_cosine_default_floor_past_warmup():
    # past a short warmup the default floor (cos_min_ratio 1e-4) is what the lr decays to
    assert _ds_lrs(lambda o: WarmupCosineLR(o, 6, warmup_num_steps=2), 8) == \
        _ds_lrs(lambda o: WarmupCosineLR(o, 6, warmup_num_steps=2, cos_min_ratio=1e-4), 8)


def test_one_cycle_writes_every_groups_tensor_betas():
    groups = [{"params": [torch.nn.Parameter(torch.zeros(1))], "betas": (torch.tensor(0.5), torch.tensor(0.5))}
              for _ in range(2)]
    opt = torch.optim.Adam(groups, lr=0.1)
    OneCycle(opt, 0.01, 0.1, cycle_first_step_size=2, cycle_min_mom=[0.8, 0.7])
    assert [float(g["betas"][0]) for g in opt.param_groups] == pytest.approx([0.8, 0.7])


def test_wsd_curve_names_a_bad_type_itself_and_no_warmup_over_one_step():
    with pytest.raises(ValueError, match=r"^warmup_type: unknown 'exp', expected one of \('linear', 'cosine', "
                                         r"'1-sqrt'\)$"):
        Fn.warmup_stable_decay_multiplier(0, 2, 2, 2, warmup_type="exp")
    with pytest.raises(ValueError, match=r"^decay_type: unknown 'exp', expected one of "):
        Fn.warmup_stable_decay_multiplier(4, 2, 2, 2, decay_type="exp")
    opt = make_opt(lrs=(0.1,))
    with warnings.catch_warnings():
        # no warning about "total 1 < warmup 2": the stand-in warmup the class is built with
        # before W is set to 0 is not the config's
        warnings.simplefilter("error")
        build_scheduler("WarmupDecayLR", opt, {"total_num_steps": 1, "warmup_num_steps": 0, "warmup_max_lr": 0.1})
    assert group_lrs(opt) == [0.1]  # one decay step: at the peak until it is taken
    with pytest.warns(UserWarning, match=r"^warmup_type: unknown 'exp', using 'log'$"):  # others still come
        build_scheduler("WarmupDecayLR", make_opt(), {"total_num_steps": 1, "warmup_num_steps": 0,
                                                      "warmup_type": "exp"})
    with pytest.warns(UserWarning, match=r"^WarmupDecayLR: total_num_steps \(1\) < warmup_num_steps \(3\)"):
        build_scheduler("WarmupDecayLR", make_opt(), {"total_num_steps": 1, "warmup_num_steps": 3})
