"""Adam / AdamW with bias_correction false (spec 9.1): golden values from the formula, in
float64, at every step of a grid; then through the engine with fp16 compute and fp32 masters."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import zerotrain
from zerotrain.optim import build_optimizer
from zerotrain.optim.uncorrected_adam import UncorrectedAdam

STEPS = 12


def golden(p0, grads, lr, b1, b2, eps, wd, decoupled, amsgrad):
    """The spec's recurrence, element by element in float64: the moments used as they are."""
    p, m, v, vmax, out = list(p0), [0.0] * len(p0), [0.0] * len(p0), [0.0] * len(p0), []
    for g in grads:
        for i in range(len(p)):
            gi = g[i] + (wd * p[i] if wd and not decoupled else 0.0)
            m[i] = b1 * m[i] + (1 - b1) * gi
            v[i] = b2 * v[i] + (1 - b2) * gi * gi
            vmax[i] = max(vmax[i], v[i])
            if wd and decoupled:
                p[i] -= lr * wd * p[i]
            p[i] -= lr * m[i] / (math.sqrt(vmax[i] if amsgrad else v[i]) + eps)
        out.append(list(p))
    return out


# AdamW with adam_w_mode false is refused (test_optim_factory), so it is not in the grid
GRID = [c for c in itertools.product(("Adam", "AdamW"), (1e-3, 0.05), ((0.9, 0.999), (0.5, 0.9)), (1e-8, 1e-3),
                                     (0.0, 0.1), (True, False), (False, True)) if c[0] == "Adam" or c[5]]


@pytest.mark.parametrize("kind,lr,betas,eps,wd,w_mode,amsgrad", GRID)
def test_every_step_matches_the_formula(kind, lr, betas, eps, wd, w_mode, amsgrad):
    gen = torch.Generator().manual_seed(7)
    p = torch.randn(5, generator=gen, dtype=torch.float32).requires_grad_(True)
    p0 = p.detach().double().tolist()
    grads = [torch.randn(5, generator=gen) * (10.0 ** (s % 3 - 1)) for s in range(STEPS)]
    params = {"lr": lr, "betas": list(betas), "eps": eps, "weight_decay": wd, "bias_correction": False,
              "amsgrad": amsgrad, "adam_w_mode": w_mode}
    opt = build_optimizer(kind, params, [{"params": [p]}])
    assert type(opt) is UncorrectedAdam
    expect = golden(p0, [g.double().tolist() for g in grads], lr, *betas, eps, wd, w_mode, amsgrad)
    for step, g in enumerate(grads):
        p.grad = g.clone()
        opt.step()
        assert torch.allclose(p.detach().double(), torch.tensor(expect[step], dtype=torch.float64),
                              rtol=2e-6, atol=1e-7), f"step {step + 1}"


def test_differs_from_corrected_adam():
    # the first step of corrected Adam moves each weight by about lr; uncorrected by lr (1-b1)/sqrt(1-b2)
    p = torch.ones(3, requires_grad=True)
    opt = build_optimizer("Adam", {"lr": 0.1, "bias_correction": False}, [{"params": [p]}])
    p.grad = torch.ones(3)
    opt.step()
    assert torch.allclose(p.detach(), torch.full((3,), 1 - 0.1 * 0.1 / (math.sqrt(0.001) + 1e-8)))


def test_state_names_and_fused_refusal():
    p = torch.ones(3, requires_grad=True)
    opt = build_optimizer("AdamW", {"bias_correction": False, "amsgrad": True}, [{"params": [p]}])
    p.grad = torch.ones(3)
    opt.step()
    assert set(opt.state[p]) == {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"} and opt.state[p]["step"] == 1
    with pytest.raises(zerotrain.ConfigError, match="no fused kernel for bias_correction false"):
        build_optimizer("Adam", {"bias_correction": False, "fused": True}, [{"params": [p]}])


@pytest.mark.parametrize("kind,wd", [("Adam", 0.0), ("AdamW", 0.05)])
def test_fp16_engine_masters_follow_the_formula(kind, wd):
    """fp16 compute, fp32 masters: y = w . x, loss = sum(y) gives grad w = sum of the batch's x,
    exact in fp16 (quarters), and a fixed loss scale of 8 unscales exactly."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1, bias=False)
    w0 = model.weight.detach().half().double().flatten().tolist()  # the fp16 weights the masters start from
    lr, b1, b2, eps = 0.01, 0.9, 0.99, 1e-6
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 0.0,
              "fp16": {"enabled": True, "loss_scale": 8},
              "optimizer": {"type": kind, "params": {"lr": lr, "betas": [b1, b2], "eps": eps, "weight_decay": wd,
                                                     "bias_correction": False}}}
    engine, optimizer, _, _ = zerotrain.initialize(model=model, config=config)
    assert type(optimizer) is UncorrectedAdam
    gen = torch.Generator().manual_seed(3)
    batches = [torch.randint(-8, 9, (2, 4), generator=gen).float() / 4 for _ in range(STEPS)]
    expect = golden(w0, [b.sum(0).double().tolist() for b in batches], lr, b1, b2, eps, wd, kind == "AdamW", False)
    master = optimizer.param_groups[0]["params"][0]
    for step, x in enumerate(batches):
        loss = engine(x.half()).float().sum()
        engine.backward(loss)
        engine.step()
        got = master.detach()[:4].double()
        assert torch.allclose(got, torch.tensor(expect[step], dtype=torch.float64), rtol=2e-6, atol=1e-7), step
        assert torch.equal(model.weight.detach().flatten(), got.float().half())  # cast back after each step
    engine.destroy()
