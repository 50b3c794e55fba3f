"""engine.offload_states / reload_states on 2 real ranks at ZeRO stage 3: the states leave
their storages and come back, and training after the round trip is exactly training without
it (fp32, where the masters are the parameter shards, and bf16, where they are separate)."""

from __future__ import annotations

import logging

import torch

import zerotrain
from zerotrain.zero.offload.states import KINDS, _key, _tensors, state_seeds
from scenarios import base_config, global_batch, rank_and_world, tiny_gpt


def _train(engine, steps, losses):
    rank, world = rank_and_world()
    for _ in range(steps):
        mine = global_batch(engine.global_steps, 4)[rank * 2 : rank * 2 + 2]
        loss = engine(mine, labels=mine)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())


def _state_keys(engine) -> set:
    return {_key(t) for t in _tensors(s for k in KINDS for s in state_seeds(engine.strategy, engine.optimizer, k))}


def round_trip(bf16: bool) -> dict:
    cfg = base_config(4, 2, zero_optimization={"stage": 3, "stage3_param_persistence_threshold": 0},
                      bf16={"enabled": bf16})
    runs = {}
    for trip in (False, True):
        engine, *_ = zerotrain.initialize(model=tiny_gpt(), config=cfg)
        losses = []
        _train(engine, 1, losses)
        if trip:
            said = []
            handler = logging.Handler()
            handler.emit = lambda record: said.append(record.getMessage())
            logging.getLogger("zerotrain").addHandler(handler)
            before = _state_keys(engine)
            engine.offload_states()  # no GPU: the states are in host memory, nothing moves
            engine.offload_states()
            logging.getLogger("zerotrain").removeHandler(handler)
            runs["public_moved_nothing"] = _state_keys(engine) == before
            runs["said"] = [s for s in said if s.startswith("offload_states")]
            engine.reload_states()
            engine._state_mover().offload(copy_host=True)  # what a GPU machine does: every state copied away
            away = _state_keys(engine)
            runs["moved_away"] = not (away & before) and bool(engine.optimizer.state)
            engine.reload_states()
            runs["moved_back"] = not (_state_keys(engine) & away)
        _train(engine, 1, losses)
        with zerotrain.zero.GatheredParameters(list(engine.module.parameters())):
            runs[trip] = (losses, [p.detach().clone() for p in engine.module.parameters()])
        engine.destroy()
    (losses, params), (trip_losses, trip_params) = runs.pop(False), runs.pop(True)
    runs["same_losses"] = losses == trip_losses
    runs["same_params"] = all(torch.equal(a, b) for a, b in zip(params, trip_params))
    return runs


def round_trips() -> list[dict]:
    return [round_trip(bf16) for bf16 in (False, True)]


def test_round_trip_moves_every_state_and_changes_no_step(world2):
    got = world2.run(round_trips)
    nothing = ("offload_states: the optim_states, hp_params, lp_params, lp_grads, contiguous_grad_buffer are in host "
               "memory already (the engine computes on cpu, no GPU to pin for); nothing moves")
    assert got == [[{"public_moved_nothing": True, "said": [nothing], "moved_away": True, "moved_back": True,
                     "same_losses": True, "same_params": True}] * 2] * 2
