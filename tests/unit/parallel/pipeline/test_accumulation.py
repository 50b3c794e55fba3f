"""A pipeline's micro-batches add their gradients into .grad inside torch's schedule, so
data_types.grad_accum_dtype fp32 cannot act there: no fp32 accumulator is kept, and a key
set to fp32 is named as having no effect (a plain model keeps and fills one)."""

from __future__ import annotations

import logging

import torch

import zerotrain
from zerotrain.pipe import PipelineModule

NOTICE = ("data_types.grad_accum_dtype fp32: no effect with a PipelineModule; torch's schedule adds each "
          "micro-batch's gradients into the parameters' bf16 gradients (DeepSpeed's pipeline engine does the same "
          "without this key)")


def _config(**extra) -> dict:
    return {"train_batch_size": 2, "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
            "zero_optimization": {"stage": 1}, "optimizer": {"type": "Adam", "params": {"lr": 1e-3}}, **extra}


def _layers():
    return [torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)]


def test_a_pipeline_keeps_no_fp32_accumulator_and_names_the_key(caplog):
    with caplog.at_level(logging.INFO, logger="zerotrain"):
        pipe, *_ = zerotrain.initialize(model=PipelineModule(_layers(), num_stages=1, loss_fn=lambda o, _: o.mean()),
                                        config=_config(data_types={"grad_accum_dtype": "fp32"}))
    assert pipe.strategy.flat.accumulators == [] and NOTICE in caplog.messages
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="zerotrain"):
        default, *_ = zerotrain.initialize(model=PipelineModule(_layers(), num_stages=1,
                                                                loss_fn=lambda o, _: o.mean()), config=_config())
    assert default.strategy.flat.accumulators == [] and NOTICE not in caplog.messages  # unset: nothing to name
    plain, *_ = zerotrain.initialize(model=torch.nn.Sequential(*_layers()), config=_config())
    assert [a.dtype for a in plain.strategy.flat.accumulators] == [torch.float32]
    for engine in (pipe, default, plain):
        engine.destroy()
