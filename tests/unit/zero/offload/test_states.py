"""What offload_states refuses and which states it takes, as DeepSpeed 0.19.8 decides them;
the move itself is tested on 2 ranks (tests/distributed/test_offload_states.py)."""

from __future__ import annotations

import logging

import pytest
import torch

import zerotrain
from zerotrain.errors import ConfigError
from zerotrain.runtime.zero.offload_config import OffloadDeviceEnum, OffloadStateTypeEnum as S


def _engine(stage: int, **zero):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    cfg = {"train_batch_size": 2, "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
           "zero_optimization": {"stage": stage, **zero}}
    engine, *_ = zerotrain.initialize(model=model, config=cfg)
    x = torch.randn(2, 4)
    engine.backward(engine(x).sum())
    engine.step()
    return engine


@pytest.mark.parametrize("call, words", [
    (lambda e: e.offload_states(device=OffloadDeviceEnum.nvme), "device 'nvme' is not built"),
    (lambda e: e.offload_states(include=["optim_state"]), "include has 'optim_state', not a state type"),
])
def test_wrong_arguments_are_one_line(call, words):
    engine = _engine(1)
    with pytest.raises(ConfigError, match=words) as info:
        call(engine)
    assert "\n" not in str(info.value)
    engine.destroy()


def test_stage_0_and_parameter_offload_are_refused():
    engine = _engine(0)
    with pytest.raises(ConfigError, match=r"needs ZeRO stage 1, 2 or 3 \(zero_optimization.stage is 0\)"):
        engine.offload_states()
    engine.destroy()
    engine = _engine(3, offload_param={"device": "cpu"})
    with pytest.raises(ConfigError, match="not built with parameter offload"):
        engine.offload_states()
    engine.destroy()


def test_device_none_moves_nothing_and_says_so(caplog):
    engine = _engine(2)
    logging.getLogger("zerotrain").addHandler(caplog.handler)  # initialize turns propagation off
    try:
        engine.offload_states(device=OffloadDeviceEnum.none)
    finally:
        logging.getLogger("zerotrain").removeHandler(caplog.handler)
    assert "offload_states: device 'none' moves nothing" in caplog.text
    assert not engine._state_mover().offloaded
    engine.destroy()


@pytest.mark.parametrize("stage, offload, include, kinds", [
    (2, None, None, list(S)),
    (2, None, ["lp_params", S.lp_params, S.optim_states], [S.lp_params, S.optim_states]),
    # the optimizer offloaded: its state and masters are in host memory already
    (2, "cpu", None, [S.lp_params, S.lp_grads, S.contiguous_grad_buffer]),
    # ... and at stage 3 the gradient shards it steps from too
    (3, "cpu", None, [S.lp_params, S.contiguous_grad_buffer]),
])
def test_the_states_taken(stage, offload, include, kinds):
    engine = _engine(stage, **({"offload_optimizer": {"device": offload}} if offload else {}))
    assert engine._state_mover().kinds(include) == kinds
    engine.destroy()


def test_states_the_optimizer_offload_keeps_are_named(caplog):
    engine = _engine(3, offload_optimizer={"device": "cpu"})
    logging.getLogger("zerotrain").addHandler(caplog.handler)
    try:
        engine.offload_states(include=[S.optim_states, S.lp_params])
        engine.offload_states(include=[S.optim_states])
    finally:
        logging.getLogger("zerotrain").removeHandler(caplog.handler)
    kept = [r.getMessage() for r in caplog.records if "offload_optimizer keeps" in r.getMessage()]
    assert kept == ["offload_states: optim_states stay where zero_optimization.offload_optimizer keeps them, "
                    "in host memory"]
    assert engine._state_mover().offloaded == {S.lp_params}
    engine.destroy()


def test_reload_after_offload_trains_on():
    engine = _engine(2)
    engine._state_mover().offload(include=[S.optim_states], copy_host=True)
    assert engine._state_mover().offloaded == {S.optim_states}
    engine.reload_states()
    assert not engine._state_mover().offloaded and not engine._state_mover().away
    x = torch.randn(2, 4)
    engine.backward(engine(x).sum())
    engine.step()
    assert engine.global_steps == 2
    engine.destroy()
