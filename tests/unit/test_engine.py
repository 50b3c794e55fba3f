"""The engine in one process, checked against hand-written plain-PyTorch training loops.

Every model here is tiny (a two-layer MLP or a 2-layer, 32-wide GPT) so the file runs in
seconds on one CPU thread. `initialize` rebinds the model's parameters into flat buffers in
place, so each reference loop trains a deep copy taken before `initialize`.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import re

import pytest
import torch
from torch import nn

import zerotrain
from zerotrain.errors import ConfigError
from zerotrain.models import GPT, GPTConfig

ATOL = 1e-6


@pytest.fixture(autouse=True)
def _single_process(monkeypatch):
    # The engine reads torchrun's variables; a stray one would make it try to join a world.
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)


# ---- helpers -------------------------------------------------------------------------------
def mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))


def micro_batch(i: int, n: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + i)
    return torch.randn(n, 6, generator=g), torch.randn(n, 3, generator=g)


def mse(model, x, y) -> torch.Tensor:
    return ((model(x).float() - y) ** 2).mean()


def config(micro: int = 2, ga: int = 1, optimizer: dict | None = None, **extra) -> dict:
    cfg = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": ga,
           "gradient_clipping": 0.0,
           "optimizer": optimizer or {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}}}
    cfg.update(extra)
    return cfg


def adamw(params, lr=1e-2):
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


def train_engine(engine, steps: int, ga: int, dtype=torch.float32, between=None) -> list[float]:
    """`steps` optimizer steps of `ga` micro-batches each; returns the mean loss per step."""
    losses = []
    for s in range(steps):
        total = 0.0
        for m in range(ga):
            x, y = micro_batch(s * ga + m)
            loss = mse(engine, x.to(dtype), y)
            engine.backward(loss)
            engine.step()
            total += loss.item() / ga
        losses.append(total)
        if between is not None:
            between()
    return losses


def train_reference(model, optimizer, steps: int, ga: int, clip: float = 0.0, scheduler=None):
    """The plain loop: mean loss over the micro-batches, one optimizer step."""
    norms = []
    for s in range(steps):
        optimizer.zero_grad()
        loss = sum(mse(model, *micro_batch(s * ga + m)) for m in range(ga)) / ga
        loss.backward()
        if clip > 0:
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip)))
        else:
            norms.append(float(torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(p.grad) for p in model.parameters()]))))
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
    return norms


def assert_same_params(model, reference, atol=ATOL):
    got, want = model.state_dict(), reference.state_dict()
    assert got.keys() == want.keys()
    for k in want:
        torch.testing.assert_close(got[k].float(), want[k].float(), rtol=0, atol=atol, msg=k)


def snapshot(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ---- 1. gradient accumulation --------------------------------------------------------------
def test_backward_scales_the_loss_by_one_over_ga():
    model = mlp()
    reference = copy.deepcopy(model)
    engine, *_ = zerotrain.initialize(model=model, config=config(ga=4))
    x, y = micro_batch(0)
    loss = mse(engine, x, y)
    returned = engine.backward(loss)
    assert returned is loss  # the unscaled loss comes back
    mse(reference, x, y).backward()
    for p, r in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, r.grad / 4, rtol=0, atol=1e-7)


@pytest.mark.parametrize("opt", ["AdamW", "SGD"])
def test_gradient_accumulation_matches_the_plain_loop(opt):
    model = mlp()
    reference = copy.deepcopy(model)
    opt_cfg = ({"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}} if opt == "AdamW"
               else {"type": "SGD", "params": {"lr": 0.1}})
    engine, *_ = zerotrain.initialize(model=model, config=config(ga=4, optimizer=opt_cfg))
    assert engine.gradient_accumulation_steps() == 4 and engine.train_batch_size() == 8
    start = snapshot(model)
    boundaries = []
    for s in range(2):
        for m in range(4):
            boundaries.append(engine.is_gradient_accumulation_boundary())
            x, y = micro_batch(s * 4 + m)
            engine.backward(mse(engine, x, y))
            engine.step()
            micro = s * 4 + m + 1
            assert engine.micro_steps == micro
            assert engine.global_steps == micro // 4
            assert engine.global_samples == (micro // 4) * 8
            if micro < 4:
                assert same(snapshot(model), start), f"params moved after micro-step {micro}"
            if micro == 4:
                assert not same(snapshot(model), start), "no update at the boundary"
    assert boundaries == [False, False, False, True] * 2
    ref_opt = adamw(reference.parameters()) if opt == "AdamW" else torch.optim.SGD(reference.parameters(), lr=0.1)
    train_reference(reference, ref_opt, steps=2, ga=4)
    assert_same_params(model, reference)


# ---- 2. gradient clipping ------------------------------------------------------------------
def test_clipping_uses_the_global_norm_and_matches_clip_grad_norm():
    model = mlp()
    reference = copy.deepcopy(model)
    sgd = {"type": "SGD", "params": {"lr": 0.5}}
    engine, *_ = zerotrain.initialize(model=model, config=config(ga=2, optimizer=sgd, gradient_clipping=0.05))
    norms = []
    for s in range(3):
        for m in range(2):
            x, y = micro_batch(s * 2 + m)
            engine.backward(mse(engine, x, y))
            engine.step()
        norms.append(engine.get_global_grad_norm())
    ref_norms = train_reference(reference, torch.optim.SGD(reference.parameters(), lr=0.5), 3, 2, clip=0.05)
    assert all(n > 0.05 for n in ref_norms)  # clipping was active on every step
    assert norms == pytest.approx(ref_norms, rel=1e-6)
    assert_same_params(model, reference)


def test_fused_optimizer_applies_the_clip_factor_itself(monkeypatch):
    """With torch's fused AdamW the unscale x clip factor travels as `grad_scale` into the
    kernel rather than as a pass over the gradients; the result is clip_grad_norm_'s."""
    model = mlp()
    reference = copy.deepcopy(model)
    adam = {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}}
    engine, *_ = zerotrain.initialize(model=model, config=config(optimizer=adam, gradient_clipping=0.05))
    assert engine.optimizer.defaults["fused"]
    factors = []
    prepare = engine.strategy.prepare_step
    monkeypatch.setattr(engine.strategy, "prepare_step", lambda coef: (factors.append(coef), prepare(coef)))
    train_engine(engine, 3, 1)
    ref_norms = train_reference(reference, torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.01,
                                                             fused=True), 3, 1, clip=0.05)
    assert all(n > 0.05 for n in ref_norms)
    assert factors == [1.0, 1.0, 1.0]  # the gradients themselves were never scaled
    assert not hasattr(engine.optimizer, "grad_scale")
    assert_same_params(model, reference)


def test_clipping_zero_disables_it():
    model = mlp()
    ref_plain, ref_clipped = copy.deepcopy(model), copy.deepcopy(model)
    sgd = {"type": "SGD", "params": {"lr": 0.5}}
    engine, *_ = zerotrain.initialize(model=model, config=config(optimizer=sgd, gradient_clipping=0.0))
    train_engine(engine, 3, 1)
    norms = train_reference(ref_plain, torch.optim.SGD(ref_plain.parameters(), lr=0.5), 3, 1)
    train_reference(ref_clipped, torch.optim.SGD(ref_clipped.parameters(), lr=0.5), 3, 1, clip=0.05)
    assert all(n > 0.05 for n in norms)
    assert engine.get_global_grad_norm() == pytest.approx(norms[-1], rel=1e-6)
    assert_same_params(model, ref_plain)
    with pytest.raises(AssertionError):
        assert_same_params(model, ref_clipped)


def test_default_clipping_is_one():
    model = mlp()
    cfg = config(optimizer={"type": "SGD", "params": {"lr": 0.5}})
    del cfg["gradient_clipping"]
    reference = copy.deepcopy(model)
    engine, *_ = zerotrain.initialize(model=model, config=cfg)
    # scale the targets so the gradient norm is well above 1
    x, y = micro_batch(0)
    engine.backward(mse(engine, x, 40 * y))
    engine.step()
    opt = torch.optim.SGD(reference.parameters(), lr=0.5)
    mse(reference, x, 40 * y).backward()
    norm = float(torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0))
    opt.step()
    assert norm > 1.0
    assert engine.get_global_grad_norm() == pytest.approx(norm, rel=1e-6)
    assert_same_params(model, reference)


# ---- 3. precision and non-finite steps -----------------------------------------------------
def test_fp16_dynamic_scale_grows_after_the_window():
    model = mlp()
    cfg = config(fp16={"enabled": True, "initial_scale_power": 4, "loss_scale_window": 2})
    engine, *_ = zerotrain.initialize(model=model, config=cfg)
    assert next(model.parameters()).dtype == torch.float16
    assert engine.loss_scale == 16
    scales = []
    for s in range(5):
        x, y = micro_batch(s)
        engine.backward(mse(engine, x.half(), y))
        engine.step()
        scales.append(engine.loss_scale)
    assert engine.skipped_steps == 0
    # first growth on good step window + 1, then every window good steps
    assert scales == [16, 16, 32, 32, 64]


def test_fp16_trains_like_fp32():
    """Scaling and unscaling must cancel: fp16 training tracks the fp32 loop closely."""
    model = mlp()
    reference = copy.deepcopy(model)
    sgd = {"type": "SGD", "params": {"lr": 0.1}}
    engine, *_ = zerotrain.initialize(model=model, config=config(optimizer=sgd, fp16={"enabled": True}))
    train_engine(engine, 3, 1, dtype=torch.float16)
    train_reference(reference, torch.optim.SGD(reference.parameters(), lr=0.1), 3, 1)
    assert engine.loss_scale == 2.0**16
    assert_same_params(model, reference, atol=5e-3)


def warmup_linear(max_lr=1e-2, steps=10):
    return {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": max_lr,
                                           "warmup_num_steps": steps, "warmup_type": "linear"}}


def test_fp16_inf_loss_skips_the_step():
    model = mlp()
    cfg = config(fp16={"enabled": True, "initial_scale_power": 8, "hysteresis": 1}, scheduler=warmup_linear())
    engine, optimizer, _, scheduler = zerotrain.initialize(model=model, config=cfg)
    train_engine(engine, 2, 1, dtype=torch.float16)
    before, masters = snapshot(model), [m.detach().clone() for m in optimizer.param_groups[0]["params"]]
    lr, sched_state = engine.get_lr(), dict(scheduler.state_dict())
    x, y = micro_batch(50)
    engine.backward(mse(engine, x.half(), y) * math.inf)
    engine.step()
    assert not math.isfinite(engine.get_global_grad_norm())
    assert engine.skipped_steps == 1
    assert engine.global_steps == 3 and engine.global_samples == 6  # counters still advance
    assert same(snapshot(model), before)
    assert all(torch.equal(m, b) for m, b in zip(optimizer.param_groups[0]["params"], masters))
    assert engine.get_lr() == lr and scheduler.state_dict() == sched_state  # no scheduler step
    assert engine.loss_scale == 128.0  # halved once (hysteresis 1)
    # the next good step trains again, with clean gradients
    train_engine(engine, 1, 1, dtype=torch.float16)
    assert not same(snapshot(model), before)
    assert math.isfinite(engine.get_global_grad_norm())
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert engine.get_lr() != lr


def test_fp16_static_scale_stays_fixed():
    model = mlp()
    engine, *_ = zerotrain.initialize(model=model, config=config(fp16={"enabled": True, "loss_scale": 128}))
    train_engine(engine, 3, 1, dtype=torch.float16)
    assert engine.loss_scale == 128
    x, y = micro_batch(9)
    engine.backward(mse(engine, x.half(), y) * math.inf)
    engine.step()
    assert engine.skipped_steps == 1
    train_engine(engine, 3, 1, dtype=torch.float16)
    assert engine.loss_scale == 128


def test_bf16_trains_on_a_learnable_task():
    torch.manual_seed(0)
    model = nn.Linear(6, 3)
    w_true = torch.randn(6, 3)
    cfg = config(micro=8, optimizer={"type": "AdamW", "params": {"lr": 5e-2, "weight_decay": 0.0}},
                 bf16={"enabled": True})
    engine, *_ = zerotrain.initialize(model=model, config=cfg)
    assert model.weight.dtype == torch.bfloat16
    losses = []
    for s in range(30):
        x = torch.randn(8, 6, generator=torch.Generator().manual_seed(s))
        loss = ((engine(x.bfloat16()).float() - x @ w_true) ** 2).mean()
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    assert engine.skipped_steps == 0
    assert sum(losses[-5:]) / 5 < 0.3 * sum(losses[:5]) / 5


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_nan_loss_skips_the_step(precision):
    model = mlp()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    extra = {"bf16": {"enabled": True}} if precision == "bf16" else {}
    engine, _, _, scheduler = zerotrain.initialize(model=model, config=config(scheduler=warmup_linear(), **extra))
    train_engine(engine, 2, 1, dtype=dtype)
    before, lr = snapshot(model), engine.get_lr()
    x, y = micro_batch(7)
    engine.backward(mse(engine, x.to(dtype), y) * math.nan)
    engine.step()
    assert engine.skipped_steps == 1 and engine.global_steps == 3
    assert same(snapshot(model), before)
    assert engine.get_lr() == lr
    assert engine.loss_scale == 1.0
    train_engine(engine, 1, 1, dtype=dtype)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert not same(snapshot(model), before)


def nan_step(engine, i: int, dtype=torch.float32) -> None:
    x, y = micro_batch(i)
    engine.backward(mse(engine, x.to(dtype), y) * math.nan)
    engine.step()


@pytest.mark.parametrize("precision", ["fp16", "bf16", "fp32"])
def test_consecutive_skips_stop_the_run_at_the_limit_with_the_last_good_state(precision, tmp_path):
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[precision]
    extra = {precision: {"enabled": True}} if precision != "fp32" else {}
    model = mlp()
    engine, *_ = zerotrain.initialize(model=model, config=config(max_consecutive_skipped_steps=3, **extra))
    train_engine(engine, 2, 1, dtype=dtype)
    good = snapshot(model)
    nan_step(engine, 10, dtype)
    nan_step(engine, 11, dtype)
    train_engine(engine, 1, 1, dtype=dtype)  # a good step resets the count
    good = snapshot(model)
    nan_step(engine, 12, dtype)
    nan_step(engine, 13, dtype)
    with pytest.raises(zerotrain.NonFiniteStepsError, match=r"step 8: 3 optimizer steps in a row.*after step 5") as err:
        nan_step(engine, 14, dtype)
    assert err.value.last_good_step == 5
    assert "\n" not in str(err.value)
    assert engine.global_steps == 8 and engine.skipped_steps == 5
    assert same(snapshot(model), good)
    # the state saved after the stop is the last good one, and it loads
    engine.save_checkpoint(tmp_path, tag="halted")
    model2 = mlp(seed=1)
    engine2, *_ = zerotrain.initialize(model=model2, config=config(**extra))
    engine2.load_checkpoint(tmp_path)
    assert same(snapshot(model2), good) and engine2.global_steps == 8


def test_skip_limit_zero_never_stops():
    engine, *_ = zerotrain.initialize(model=mlp(), config=config(max_consecutive_skipped_steps=0))
    for i in range(120):
        nan_step(engine, i)
    assert engine.skipped_steps == 120


def test_skip_limit_defaults_to_100():
    engine, *_ = zerotrain.initialize(model=mlp(), config=config())
    for i in range(99):
        nan_step(engine, i)
    with pytest.raises(zerotrain.NonFiniteStepsError):
        nan_step(engine, 99)


# ---- 4. param groups -----------------------------------------------------------------------
def test_param_groups_keep_their_own_lr():
    model = mlp()
    reference = copy.deepcopy(model)
    groups = [{"params": model[0].parameters(), "lr": 0.2},
              {"params": model[2].parameters(), "lr": 0.01}]
    sgd = {"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9}}
    engine, *_ = zerotrain.initialize(model=model, model_parameters=groups, config=config(optimizer=sgd))
    assert engine.get_lr() == [0.2, 0.01]
    train_engine(engine, 3, 1)
    ref_opt = torch.optim.SGD([{"params": reference[0].parameters(), "lr": 0.2},
                               {"params": reference[2].parameters(), "lr": 0.01}], lr=0.05, momentum=0.9)
    train_reference(reference, ref_opt, 3, 1)
    assert engine.get_lr() == [0.2, 0.01]
    assert_same_params(model, reference)


# ---- 5. client optimizers and schedulers ---------------------------------------------------
def no_optimizer_config(**extra) -> dict:
    cfg = config(**extra)
    del cfg["optimizer"]
    return cfg


def test_client_optimizer_instance():
    model = mlp()
    reference = copy.deepcopy(model)
    client = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    engine, optimizer, _, _ = zerotrain.initialize(model=model, optimizer=client, config=no_optimizer_config())
    assert optimizer is client
    train_engine(engine, 3, 1)
    train_reference(reference, torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9), 3, 1)
    assert_same_params(model, reference)


def test_client_optimizer_callable():
    model = mlp()
    reference = copy.deepcopy(model)
    built = []

    def factory(groups):
        built.append(adamw(groups))
        return built[-1]

    engine, optimizer, _, _ = zerotrain.initialize(model=model, optimizer=factory, config=no_optimizer_config())
    assert optimizer is built[0]
    train_engine(engine, 3, 1)
    train_reference(reference, adamw(reference.parameters()), 3, 1)
    assert_same_params(model, reference)


def test_client_scheduler_instance_built_before_initialize_drives_the_lr():
    model = mlp()
    reference = copy.deepcopy(model)
    client = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(client, step_size=1, gamma=0.5)
    engine, _, _, scheduler = zerotrain.initialize(model=model, optimizer=client, lr_scheduler=sched,
                                                   config=no_optimizer_config())
    assert scheduler is sched
    lrs = []
    for s in range(3):
        train_engine_one(engine, s)
        lrs.append(engine.get_lr())
    assert lrs == [[pytest.approx(0.1 * 0.5**k)] for k in (1, 2, 3)]
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    train_reference(reference, ref_opt, 3, 1,
                    scheduler=torch.optim.lr_scheduler.StepLR(ref_opt, step_size=1, gamma=0.5))
    assert_same_params(model, reference)


def train_engine_one(engine, s: int) -> None:
    x, y = micro_batch(s)
    engine.backward(mse(engine, x, y))
    engine.step()


def test_client_scheduler_callable():
    model = mlp()
    made = []

    def factory(optimizer):
        made.append(torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1)))
        return made[-1]

    cfg = config(optimizer={"type": "SGD", "params": {"lr": 0.3}})
    engine, optimizer, _, scheduler = zerotrain.initialize(model=model, lr_scheduler=factory, config=cfg)
    assert scheduler is made[0] and scheduler.optimizer is optimizer
    assert engine.get_lr() == [pytest.approx(0.3)]
    for s in range(3):
        train_engine_one(engine, s)
        assert engine.get_lr() == [pytest.approx(0.3 / (s + 2))]


def test_config_warmup_lr_follows_the_schedule():
    model = mlp()
    engine, *_ = zerotrain.initialize(model=model, config=config(scheduler=warmup_linear(1e-2, 4)))
    assert engine.get_lr() == [0.0]
    got = []
    for s in range(6):
        train_engine_one(engine, s)
        got.append(engine.get_lr()[0])
    # DeepSpeed's linear warmup: after step k the iteration is k-1, lr = max * min(1, (k-1)/4)
    assert got == pytest.approx([1e-2 * min(1.0, k / 4) for k in range(6)])


# ---- 6. progress lines ---------------------------------------------------------------------
@pytest.fixture
def zerotrain_log(caplog):
    logger = logging.getLogger("zerotrain")
    logger.addHandler(caplog.handler)  # initialize turns propagation off
    yield caplog
    logger.removeHandler(caplog.handler)


def progress_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("step=")]


def test_steps_per_print(zerotrain_log):
    model = mlp()
    engine, *_ = zerotrain.initialize(model=model, config=config(ga=2, steps_per_print=2))
    zerotrain_log.clear()
    losses = train_engine(engine, 5, 2)
    lines = progress_lines(zerotrain_log)
    assert [int(re.match(r"step=(\d+)", ln).group(1)) for ln in lines] == [2, 4]
    pattern = r"step=\d+ loss=([0-9.]+) lr=([0-9.e+-]+) samples/s=[0-9.]+"
    for ln, window in zip(lines, (losses[0:2], losses[2:4])):
        found = re.search(pattern, ln)
        assert found, ln
        assert float(found.group(1)) == pytest.approx(sum(window) / 2, abs=1e-4)
        assert float(found.group(2)) == pytest.approx(1e-2)
        assert "forward=" not in ln


def test_wall_clock_breakdown_adds_timings(zerotrain_log):
    model = mlp()
    engine, *_ = zerotrain.initialize(model=model, config=config(steps_per_print=2, wall_clock_breakdown=True))
    zerotrain_log.clear()
    train_engine(engine, 2, 1)
    lines = progress_lines(zerotrain_log)
    assert len(lines) == 1
    assert re.search(r"forward=[0-9.]+ms backward=[0-9.]+ms step=[0-9.]+ms", lines[0]), lines[0]


def test_no_progress_lines_without_steps_per_print(zerotrain_log):
    model = mlp()
    engine, *_ = zerotrain.initialize(model=model, config=config())
    zerotrain_log.clear()
    train_engine(engine, 4, 1)
    assert progress_lines(zerotrain_log) == []


# ---- 7. checkpoints ------------------------------------------------------------------------
SEQ, VOCAB = 16, 64


def tiny_gpt(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2, bias=False))


def gpt_config(**extra) -> dict:
    return config(micro=2, scheduler=warmup_linear(3e-3, 4),
                  optimizer={"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}}, **extra)


def train_gpt(engine, until: int, save_dir=None, save_at=None) -> tuple[list[float], list[float]]:
    """Train to global step `until`; the batch depends only on the step, so a resume sees the same data."""
    losses, lrs = [], []
    while engine.global_steps < until:
        tokens = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(engine.global_steps))
        loss = engine(tokens, labels=tokens)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
        lrs.append(engine.get_lr()[0])
        if save_dir is not None and engine.global_steps == save_at:
            engine.save_checkpoint(save_dir, client_state={"epoch": 7, "seen": torch.arange(3)})
    return losses, lrs


def test_checkpoint_resume_gives_identical_losses(tmp_path):
    engine, *_ = zerotrain.initialize(model=tiny_gpt(), config=gpt_config())
    losses, lrs = train_gpt(engine, 6, save_dir=tmp_path, save_at=3)
    final = snapshot(engine.module)

    resumed, *_ = zerotrain.initialize(model=tiny_gpt(seed=1), config=gpt_config())
    path, client_state = resumed.load_checkpoint(tmp_path)
    assert path == str(tmp_path / "global_step3")
    assert client_state["epoch"] == 7 and torch.equal(client_state["seen"], torch.arange(3))
    assert (resumed.global_steps, resumed.global_samples, resumed.micro_steps) == (3, 6, 3)
    more, more_lrs = train_gpt(resumed, 6)
    assert more == losses[3:]  # bit-identical continuation
    assert more_lrs == lrs[3:]
    assert same(snapshot(resumed.module), final)


def test_checkpoint_folder_layout(tmp_path):
    engine, *_ = zerotrain.initialize(model=tiny_gpt(), config=gpt_config())
    train_gpt(engine, 2)
    engine.save_checkpoint(tmp_path)
    assert (tmp_path / "latest").read_text().strip() == "global_step2"
    files = {p.name for p in (tmp_path / "global_step2").iterdir()}
    assert {"model_states.pt", "manifest.json"} <= files
    manifest = json.loads((tmp_path / "global_step2" / "manifest.json").read_text())
    assert "model_states.pt" in manifest["files"]
    engine.save_checkpoint(tmp_path, tag="mine", save_latest=False)
    assert (tmp_path / "mine" / "model_states.pt").is_file()
    assert (tmp_path / "latest").read_text().strip() == "global_step2"


@pytest.mark.parametrize("tag", ["../x", "a/b", "..", "latest"])
def test_checkpoint_tag_must_be_a_plain_name(tmp_path, tag):
    engine, *_ = zerotrain.initialize(model=mlp(), config=config())
    with pytest.raises(ConfigError, match="tag"):
        engine.save_checkpoint(tmp_path / "ckpt", tag=tag)
    assert not (tmp_path / "x").exists()


def test_load_from_an_empty_dir_returns_none(tmp_path):
    engine, *_ = zerotrain.initialize(model=mlp(), config=config())
    before = snapshot(engine.module)
    assert engine.load_checkpoint(tmp_path) == (None, None)
    assert same(snapshot(engine.module), before)


def optimizer_state(optimizer) -> dict:
    return copy.deepcopy(optimizer.state_dict())


def states_equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(states_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(states_equal(x, y) for x, y in zip(a, b))
    return a == b


def test_load_without_optimizer_or_scheduler_states(tmp_path):
    engine, optimizer, _, scheduler = zerotrain.initialize(model=tiny_gpt(), config=gpt_config())
    train_gpt(engine, 3)
    engine.save_checkpoint(tmp_path)
    saved_module, saved_optim = snapshot(engine.module), optimizer_state(optimizer)
    saved_sched = dict(scheduler.state_dict())

    # a second engine with its own (different) history
    other, other_opt, _, other_sched = zerotrain.initialize(model=tiny_gpt(seed=1), config=gpt_config())
    train_gpt(other, 1)
    own_optim, own_sched, own_lr = optimizer_state(other_opt), dict(other_sched.state_dict()), other.get_lr()
    assert not states_equal(own_optim, saved_optim) and own_sched != saved_sched

    other.load_checkpoint(tmp_path, load_optimizer_states=False, load_lr_scheduler_states=False)
    assert same(snapshot(other.module), saved_module)  # the weights always load
    assert states_equal(optimizer_state(other_opt), own_optim)
    assert other_sched.state_dict() == own_sched and other.get_lr() == own_lr
    assert other.global_steps == 3

    other.load_checkpoint(tmp_path, load_optimizer_states=True, load_lr_scheduler_states=False)
    assert states_equal(optimizer_state(other_opt), saved_optim)
    assert other_sched.state_dict() == own_sched

    other.load_checkpoint(tmp_path)
    assert other_sched.state_dict() == saved_sched


def test_fp16_checkpoint_restores_the_loss_scale_and_masters(tmp_path):
    cfg = gpt_config(fp16={"enabled": True, "initial_scale_power": 8, "loss_scale_window": 1})
    engine, *_ = zerotrain.initialize(model=tiny_gpt(), config=cfg)
    losses, _ = train_gpt(engine, 6, save_dir=tmp_path, save_at=3)
    assert engine.skipped_steps == 0

    resumed, *_ = zerotrain.initialize(model=tiny_gpt(seed=1), config=cfg)
    assert resumed.loss_scale == 256
    resumed.load_checkpoint(tmp_path)
    assert resumed.loss_scale == 1024  # 256 -> 256 -> 512 -> 1024 over the first three steps
    more, _ = train_gpt(resumed, 6)
    assert more == losses[3:]
    assert resumed.loss_scale == engine.loss_scale


# ---- 8. accessors, modes, data -------------------------------------------------------------
def test_modes_and_accessors():
    model = mlp()
    engine, *_ = zerotrain.initialize(model=model, config=config(micro=3, ga=2))
    assert engine.module is model
    assert (engine.train_batch_size(), engine.train_micro_batch_size_per_gpu(),
            engine.gradient_accumulation_steps()) == (6, 3, 2)
    assert engine.eval() is engine and not model.training
    assert engine.train() is engine and model.training
    engine.train(False)
    assert not model.training
    assert (engine.global_steps, engine.global_samples, engine.micro_steps, engine.skipped_steps) == (0, 0, 0, 0)
    assert engine.get_global_grad_norm() is None


def test_initialize_returns_a_dataloader_of_micro_batches():
    data = torch.utils.data.TensorDataset(torch.arange(10.0).unsqueeze(1), torch.arange(10))
    engine, _, loader, _ = zerotrain.initialize(model=nn.Linear(1, 1), training_data=data,
                                                config=config(micro=2, ga=2))
    assert loader is not None and engine.training_dataloader is loader
    batches = list(loader)
    assert len(batches) == 5 and all(b[0].shape == (2, 1) for b in batches)
    assert sorted(torch.cat([b[1] for b in batches]).tolist()) == list(range(10))
    _, _, none, _ = zerotrain.initialize(model=nn.Linear(1, 1), config=config())
    assert none is None


# ---- 9. errors -----------------------------------------------------------------------------
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_stage_is_built_or_refused_by_name(stage):
    """A stage this version implements builds that stage; any other is a ConfigError naming it
    (never a silent fallback to stage 0)."""
    from zerotrain.zero import STRATEGIES

    cfg = config(zero_optimization={"stage": stage})
    if stage in STRATEGIES:
        engine, *_ = zerotrain.initialize(model=mlp(), config=cfg)
        assert engine.strategy.stage == stage
    else:
        with pytest.raises(ConfigError, match=f"stage {stage}"):
            zerotrain.initialize(model=mlp(), config=cfg)


@pytest.mark.parametrize("block", [
    {"curriculum_learning": {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": 8,
                             "max_difficulty": 16, "schedule_type": "fixed_linear",
                             "schedule_config": {"total_curriculum_step": 10, "difficulty_step": 8}}},
    {"progressive_layer_drop": {"enabled": True}},
], ids=["curriculum_learning", "progressive_layer_drop"])
def test_enabled_feature_blocks_are_never_ignored(block):
    """An enabled block either attaches a feature to the engine or, in a version that does not
    run it yet, is refused with a ConfigError naming the block; it is never silently dropped."""
    name = next(iter(block))
    try:
        engine, *_ = zerotrain.initialize(model=tiny_gpt(), config=gpt_config(**block))
    except ConfigError as err:
        assert name in str(err)
    else:
        assert engine.features, f"{name} enabled but no feature attached"
    # the same block disabled is accepted and attaches nothing
    engine, *_ = zerotrain.initialize(model=tiny_gpt(), config=gpt_config(**{name: {**block[name], "enabled": False}}))
    assert engine.features == []


def test_model_without_trainable_parameters():
    model = mlp()
    model.requires_grad_(False)
    with pytest.raises(ConfigError, match="trainable"):
        zerotrain.initialize(model=model, config=config())


def test_foreign_tensor_in_model_parameters():
    model = mlp()
    foreign = nn.Parameter(torch.zeros(3))
    with pytest.raises(ConfigError, match="not a parameter of the model"):
        zerotrain.initialize(model=model, model_parameters=[*model.parameters(), foreign], config=config())


def test_step_without_an_optimizer():
    engine, optimizer, _, _ = zerotrain.initialize(model=mlp(), config=no_optimizer_config())
    assert optimizer is None and engine.get_lr() == []
    x, y = micro_batch(0)
    engine.backward(mse(engine, x, y))
    with pytest.raises(RuntimeError, match="optimizer"):
        engine.step()


# ---- 10. user zero_grad ----------------------------------------------------------------------
@pytest.mark.parametrize("ga", [1, 2])
def test_user_zero_grad_between_steps(ga):
    model = mlp()
    reference = copy.deepcopy(model)
    engine, *_ = zerotrain.initialize(model=model, config=config(ga=ga))
    train_engine(engine, 4, ga, between=lambda: model.zero_grad(set_to_none=True))
    assert all(p.grad is None for p in model.parameters())  # the last call left them None
    train_reference(reference, adamw(reference.parameters()), 4, ga)
    assert_same_params(model, reference)
    # after the next backward the gradients live in the flat buffer again
    x, y = micro_batch(99)
    engine.backward(mse(engine, x, y))
    buffer = engine.strategy.grad_buffers[0]
    lo, hi = buffer.data_ptr(), buffer.data_ptr() + buffer.numel() * buffer.element_size()
    for p in model.parameters():
        assert lo <= p.grad.data_ptr() < hi
    assert buffer.abs().sum() > 0


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_user_optimizer_zero_grad_between_steps(precision):
    """Habit from plain PyTorch: `optimizer.zero_grad()` (set_to_none) on the returned optimizer.
    The engine must still step with this step's gradients, as DeepSpeed's returned optimizers do."""
    model = mlp()
    reference = copy.deepcopy(model)
    dtype = torch.float16 if precision == "fp16" else torch.float32
    extra = {"fp16": {"enabled": True}} if precision == "fp16" else {}
    sgd = {"type": "SGD", "params": {"lr": 0.1}}
    engine, optimizer, _, _ = zerotrain.initialize(model=model, config=config(optimizer=sgd, **extra))
    for s in range(3):
        optimizer.zero_grad()
        x, y = micro_batch(s)
        engine.backward(mse(engine, x.to(dtype), y))
        engine.step()
    train_reference(reference, torch.optim.SGD(reference.parameters(), lr=0.1), 3, 1)
    assert engine.skipped_steps == 0
    assert_same_params(model, reference, atol=ATOL if precision == "fp32" else 5e-3)


def test_load_falls_back_to_the_newest_complete_checkpoint_when_asked(tmp_path):
    from zerotrain.errors import CheckpointError

    engine, *_ = zerotrain.initialize(model=mlp(), config=config())
    for step in range(2):
        x, y = micro_batch(step)
        engine.backward(mse(engine, x, y))
        engine.step()
        engine.save_checkpoint(tmp_path)  # global_step1, then global_step2 (latest)
    damaged = tmp_path / "global_step2" / "model_states.pt"
    damaged.write_bytes(damaged.read_bytes()[:-7])  # truncated
    fresh, *_ = zerotrain.initialize(model=mlp(1), config=config())
    with pytest.raises(CheckpointError, match="model_states.pt"):
        fresh.load_checkpoint(tmp_path)
    path, _ = fresh.load_checkpoint(tmp_path, fallback_to_complete=True)
    assert path.endswith("global_step1") and fresh.global_steps == 1
    # latest unreadable, latest gone (a save killed before its first latest): the same fallback
    (tmp_path / "latest").write_bytes(b"\xff")
    with pytest.raises(CheckpointError, match="latest is corrupted"):
        fresh.load_checkpoint(tmp_path)
    assert fresh.load_checkpoint(tmp_path, fallback_to_complete=True)[0].endswith("global_step1")
    (tmp_path / "latest").unlink()
    assert fresh.load_checkpoint(tmp_path) == (None, None)
    assert fresh.load_checkpoint(tmp_path, fallback_to_complete=True)[0].endswith("global_step1")


def test_stage3_weights_load_with_load_module_only(tmp_path):
    """Stage 3 keeps its weights with the per-rank shards, not in the module state."""
    cfg = config(zero_optimization={"stage": 3, "stage3_param_persistence_threshold": 0})
    engine, *_ = zerotrain.initialize(model=mlp(), config=cfg)
    train_engine(engine, 3, 1)
    engine.save_checkpoint(tmp_path)
    fresh, *_ = zerotrain.initialize(model=mlp(seed=1), config=cfg)
    fresh.load_checkpoint(tmp_path, load_module_only=True)
    assert same(fresh.module_state_dict(), engine.module_state_dict())
    assert fresh.global_steps == 0  # only the module
