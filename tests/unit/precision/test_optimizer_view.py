"""The loss-scale readings DeepSpeed scripts take from the optimizer (precision/optimizer_view.py)."""

from __future__ import annotations

import copy
import pickle

import torch

from zerotrain.precision import DynamicLossScaler, StaticLossScaler
from zerotrain.precision.optimizer_view import expose_loss_scale


def _adamw():
    return torch.optim.AdamW([torch.nn.Parameter(torch.ones(3))], lr=0.1)


def _fresh():
    """An optimizer of a class no earlier test exposed (the view classes are cached per class)."""

    class MyAdamW(torch.optim.AdamW):
        """A user's own optimizer class."""

    return MyAdamW([torch.nn.Parameter(torch.ones(3))], lr=0.1)


def test_the_optimizer_keeps_its_class_and_reads_the_scaler():
    opt = _fresh()
    torch_cls = type(opt)
    scaler = DynamicLossScaler(init_scale=2**8, scale_window=7)
    assert expose_loss_scale(opt, scaler) is opt
    assert isinstance(opt, torch_cls) and isinstance(opt, torch.optim.AdamW)
    cls = type(opt)
    assert cls is not torch_cls
    assert (cls.__name__, cls.__qualname__, cls.__module__, cls.__doc__) == (
        "MyAdamW", torch_cls.__qualname__, torch_cls.__module__, "A user's own optimizer class.")
    assert (opt.cur_scale, opt.loss_scale, opt.dynamic_loss_scale, opt.scale_window) == (256.0, 256.0, True, 7)
    assert opt.loss_scale_config is scaler
    scaler.update_scale(True)
    scaler.update_scale(True)
    assert opt.cur_scale == 128.0  # a live reading, not a copy


def test_one_view_class_per_torch_class_and_a_second_expose_swaps_the_scaler():
    a = _fresh()
    b = type(a)([torch.nn.Parameter(torch.ones(3))], lr=0.1)
    expose_loss_scale(a, DynamicLossScaler())
    expose_loss_scale(b, StaticLossScaler(4.0))
    assert type(a) is type(b) and type(a).__bases__[1].__name__ == "MyAdamW"
    view = type(a)
    expose_loss_scale(a, StaticLossScaler(8.0))
    assert type(a) is view and a.loss_scale == 8.0 and a.dynamic_loss_scale is False and a.scale_window is None


def test_copies_and_pickles_are_the_plain_torch_optimizer():
    opt = _adamw()
    expose_loss_scale(opt, DynamicLossScaler())
    opt.zero_grad()
    opt.param_groups[0]["params"][0].grad = torch.ones(3)
    opt.step()
    for twin in (copy.deepcopy(opt), pickle.loads(pickle.dumps(opt))):
        assert type(twin) is torch.optim.AdamW and not hasattr(twin, "cur_scale")
        assert twin.param_groups[0]["lr"] == 0.1
        assert torch.equal(twin.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
