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


def _refused(call) -> str:
    with pytest.raises(RuntimeError) as err:
        call()
    return str(err.value)


def test_training_while_states_are_offloaded_is_one_line():
    engine = _engine(2)
    x = torch.randn(2, 4)
    engine.offload_states(include=[S.optim_states])
    loss = engine(x).sum()  # the model's values and gradients are in place: forward and backward run
    engine.backward(loss)
    assert _refused(engine.step) == ("engine.step(): the optim_states are offloaded (engine.offload_states()); "
                                     "call engine.reload_states() first")
    engine.offload_states()
    assert _refused(lambda: engine(x)).startswith("engine.forward(): the hp_params, lp_params are offloaded")
    assert _refused(lambda: engine.backward(loss)).startswith("engine.backward(): the hp_params, lp_params, lp_grads")
    engine.reload_states()
    engine.step()
    assert engine.global_steps == 2
    engine.destroy()


def test_a_pipeline_batch_while_states_are_offloaded_is_one_line():
    from zerotrain.pipe import PipelineModule

    model = PipelineModule([torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)], num_stages=1,
                           loss_fn=lambda out, _: out.mean())
    cfg = {"train_batch_size": 2, "train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 1},
           "optimizer": {"type": "Adam", "params": {"lr": 1e-3}}}
    engine, *_ = zerotrain.initialize(model=model, config=cfg)
    batches = [(torch.randn(1, 4), torch.zeros(1)) for _ in range(2)]
    engine.offload_states(include=[S.optim_states])
    engine.eval_batch(iter(batches))
    assert _refused(lambda: engine.train_batch(iter(batches))) == (
        "engine.train_batch(): the optim_states are offloaded (engine.offload_states()); call "
        "engine.reload_states() first")
    engine.offload_states(include=[S.hp_params])  # fp32: the masters are the model's values
    assert _refused(lambda: engine.eval_batch(iter(batches))).startswith(
        "engine.eval_batch(): the hp_params are offloaded")
    engine.reload_states()
    engine.train_batch(iter(batches))
    assert engine.global_steps == 1
    engine.destroy()
