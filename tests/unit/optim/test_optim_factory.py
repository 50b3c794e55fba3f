"""Config-named optimizers (DeepSpeed semantics) and client-supplied optimizers."""

import pytest
import torch

from zerotrain.errors import ConfigError
from zerotrain.optim import adapt_client_optimizer, build_optimizer


def flat(n=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=gen).requires_grad_(True)


def groups(*lrs):
    if not lrs:
        return [{"params": [flat()]}]
    return [{"params": [flat(seed=i)], "lr": lr} for i, lr in enumerate(lrs)]


def hyper(opt, *keys):
    return {k: opt.param_groups[0][k] for k in keys}


def test_sgd_and_momentum():
    opt = build_optimizer("SGD", {"lr": 0.1, "momentum": 0.5, "dampening": 0.1,
                                  "weight_decay": 0.01}, groups())
    assert type(opt) is torch.optim.SGD
    assert hyper(opt, "lr", "momentum", "dampening", "weight_decay", "nesterov") == \
        {"lr": 0.1, "momentum": 0.5, "dampening": 0.1, "weight_decay": 0.01, "nesterov": False}
    mom = build_optimizer("Momentum", {"lr": 0.2, "nesterov": True}, groups())
    assert type(mom) is torch.optim.SGD
    assert hyper(mom, "lr", "momentum", "nesterov") == {"lr": 0.2, "momentum": 0.9,
                                                        "nesterov": True}


def test_adam_defaults_to_decoupled_weight_decay():
    opt = build_optimizer("Adam", {"lr": 3e-4, "betas": [0.8, 0.95], "eps": 1e-6,
                                   "weight_decay": 0.1, "torch_adam": True}, groups())
    assert type(opt) is torch.optim.AdamW
    assert hyper(opt, "lr", "betas", "eps", "weight_decay", "amsgrad") == \
        {"lr": 3e-4, "betas": (0.8, 0.95), "eps": 1e-6, "weight_decay": 0.1, "amsgrad": False}
    assert hyper(build_optimizer("adam", {}, groups()), "weight_decay", "lr", "eps") == \
        {"weight_decay": 0.0, "lr": 1e-3, "eps": 1e-8}
    classic = build_optimizer("adam", {"adam_w_mode": False, "amsgrad": True}, groups())
    assert type(classic) is torch.optim.Adam and classic.defaults["amsgrad"] is True


def test_adamw_defaults():
    opt = build_optimizer("adamw", None, groups())
    assert type(opt) is torch.optim.AdamW
    assert hyper(opt, "lr", "betas", "eps", "weight_decay") == \
        {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}


def run_steps(opt, param, steps=3):
    for i in range(steps):
        param.grad = torch.full_like(param, 0.5) + 0.1 * i
        opt.step()
    return param.detach().clone()


@pytest.mark.parametrize("adam_w_mode, reference", [(True, torch.optim.AdamW),
                                                   (False, torch.optim.Adam)])
def test_adam_w_mode_matches_torch_math(adam_w_mode, reference):
    settings = {"lr": 0.1, "weight_decay": 0.5, "betas": (0.9, 0.99), "eps": 1e-8}
    ours_p, ref_p = flat(), flat()
    ours = build_optimizer("adam", {**settings, "adam_w_mode": adam_w_mode}, [{"params": [ours_p]}])
    ref = reference([ref_p], foreach=False, **settings)
    torch.testing.assert_close(run_steps(ours, ours_p), run_steps(ref, ref_p))


def test_adam_w_mode_changes_the_update():
    settings = {"lr": 0.1, "weight_decay": 0.5}
    a, b = flat(), flat()
    decoupled = run_steps(build_optimizer("adam", settings, [{"params": [a]}]), a)
    coupled = run_steps(build_optimizer("adam", {**settings, "adam_w_mode": False},
                                        [{"params": [b]}]), b)
    assert not torch.allclose(decoupled, coupled)


@pytest.mark.parametrize("name", ["sgd", "momentum", "adam", "adamw", "Adagrad"])
def test_fused_kernel_chosen_when_supported(name):
    opt = build_optimizer(name, {}, groups())
    assert opt.defaults["fused"] is True  # torch 2.13 CPU has fused kernels for float32
    assert not opt.defaults.get("foreach")


def test_fused_off_falls_back_to_foreach():
    opt = build_optimizer("adamw", {"fused": False}, groups())
    assert opt.defaults["foreach"] is True and not opt.defaults["fused"]
    rms = build_optimizer("RMSprop", {"lr": 0.01, "alpha": 0.9}, groups())  # no fused kernel
    assert type(rms) is torch.optim.RMSprop and rms.defaults["foreach"] is True
    assert hyper(rms, "lr", "alpha") == {"lr": 0.01, "alpha": 0.9}


def test_group_hyperparameters_win_over_params():
    opt = build_optimizer("adamw", {"lr": 0.5, "weight_decay": 0.2},
                          [{"params": [flat(seed=1)], "lr": 0.01},
                           {"params": [flat(seed=2)], "weight_decay": 0.0}])
    assert [g["lr"] for g in opt.param_groups] == [0.01, 0.5]
    assert [g["weight_decay"] for g in opt.param_groups] == [0.2, 0.0]


@pytest.mark.parametrize("type_name, params, message", [
    ("adamx", {}, "optimizer.type: unknown optimizer 'adamx', did you mean adam?"),
    ("rmsprop", {}, "optimizer.type: unknown optimizer 'rmsprop', did you mean RMSprop?"),
    ("lamb2000", {}, "optimizer.type: unknown optimizer 'lamb2000'"),
    ("adam", {"betaz": [0.9, 0.99]}, "optimizer.params.betaz: unknown key, did you mean betas?"),
    ("adam", {"lr": -1.0}, "optimizer.params.lr must be"),
    ("adam", {"betas": [0.9]}, "optimizer.params.betas must be a pair"),
    ("adam", {"betas": [0.9, 1.0]}, "optimizer.params.betas must be a pair"),
    ("adam", {"eps": "small"}, "optimizer.params.eps must be"),
    ("adamw", {"adam_w_mode": False}, "use type Adam"),
    ("sgd", {"nesterov": True}, "nesterov needs momentum > 0"),
    ("sgd", {"betas": [0.9, 0.9]}, "optimizer.params.betas: unknown key"),
    ("Adagrad", {"lr_decai": 0.1}, "did you mean lr_decay?"),
    ("LBFGS", {}, "needs a loss closure"),
])
def test_config_errors(type_name, params, message):
    with pytest.raises(ConfigError) as err:
        build_optimizer(type_name, params, groups())
    assert message in str(err.value)


def test_torch_refusal_becomes_config_error():
    with pytest.raises(ConfigError, match="Adagrad refused"):
        build_optimizer("Adagrad", {"lr": -1.0}, groups())


def test_adapt_client_instance_keeps_class_and_group_settings():
    model_a, model_b = flat(seed=5), flat(seed=6)
    client = torch.optim.Adam([{"params": [model_a], "lr": 0.01},
                               {"params": [model_b], "lr": 0.02, "weight_decay": 0.1}],
                              betas=(0.5, 0.6))
    sched = torch.optim.lr_scheduler.StepLR(client, step_size=1, gamma=0.5)
    client.state[model_a]["stale"] = 1
    ours = [{"params": [flat(seed=7)], "name": "decay"}, {"params": [flat(seed=8)]}]
    adapted = adapt_client_optimizer(client, ours)
    assert type(adapted) is torch.optim.Adam
    assert [g["lr"] for g in adapted.param_groups] == [0.01, 0.02]
    assert [g["weight_decay"] for g in adapted.param_groups] == [0.0, 0.1]
    assert all(g["betas"] == (0.5, 0.6) for g in adapted.param_groups)
    assert adapted.param_groups[0]["name"] == "decay"
    assert [g["params"][0] for g in adapted.param_groups] == [g["params"][0] for g in ours]
    assert len(adapted.state) == 0
    before = ours[0]["params"][0].detach().clone()
    run_steps(adapted, ours[0]["params"][0], steps=1)
    assert not torch.equal(before, ours[0]["params"][0])
    sched.step()  # a scheduler built over the client optimizer still drives it
    assert [g["lr"] for g in adapted.param_groups] == [0.005, 0.01]


def test_adapt_client_instance_group_count_mismatch():
    client = torch.optim.SGD([flat()], lr=0.1)
    with pytest.raises(ConfigError, match="1 param groups but the engine built 2"):
        adapt_client_optimizer(client, groups(0.1, 0.2))


def test_adapt_client_callable():
    ours = groups(0.3, 0.4)
    opt = adapt_client_optimizer(lambda pg: torch.optim.SGD(pg, lr=1.0, momentum=0.9), ours)
    assert type(opt) is torch.optim.SGD
    assert [g["lr"] for g in opt.param_groups] == [0.3, 0.4]
    assert opt.defaults["momentum"] == 0.9


def test_adapt_client_callable_errors():
    stray = flat(seed=9)
    with pytest.raises(ConfigError, match="over the param_groups it is given"):
        adapt_client_optimizer(lambda pg: torch.optim.SGD([stray], lr=1.0), groups())
    with pytest.raises(ConfigError, match="must return a torch.optim.Optimizer"):
        adapt_client_optimizer(lambda pg: None, groups())
    with pytest.raises(ConfigError, match="or a callable"):
        adapt_client_optimizer("adam", groups())
