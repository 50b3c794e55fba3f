"""The pure parts of the pipeline: DeepSpeed's partitions and topology, stage placement,
the "pipeline" config block, and the one-line errors for bad input (single process)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import zerotrain
from zerotrain.config import load_config
from zerotrain.errors import ConfigError
from zerotrain.pipe import LayerSpec, PipelineModule, ProcessTopology
from zerotrain.parallel.pipeline.module import stage_indices
from zerotrain.parallel.pipeline.partition import partition, partition_balanced, partition_uniform
from zerotrain.parallel.pipeline.spec import trainable_count
from zerotrain.parallel.pipeline.ties import holder_of


# expected values: DeepSpeed 0.19's ds_utils.partition_balanced / partition_uniform on the same input
@pytest.mark.parametrize("weights,parts,expected", [
    ([0, 0, 1, 1, 1, 1, 0, 0], 2, [0, 4, 8]),
    ([10, 100, 100, 100, 100, 1000], 3, [0, 3, 5, 6]),
    ([1, 2, 3, 4, 5, 6, 7, 8, 9], 3, [0, 5, 7, 9]),
    ([5, 0, 0, 5, 0, 5], 2, [0, 5, 6]),
    ([0, 1, 1, 1, 1, 1, 1, 1, 1, 0], 4, [0, 3, 5, 7, 10]),
    ([3, 3], 2, [0, 1, 2]),
])
def test_balanced_partition_is_deepspeeds(weights, parts, expected):
    assert partition_balanced(weights, parts) == expected


@pytest.mark.parametrize("items,parts,expected", [(10, 4, [0, 3, 6, 8, 10]), (3, 5, [0, 1, 2, 3, 3, 3]),
                                                  (8, 3, [0, 3, 6, 8])])
def test_uniform_partition_is_deepspeeds(items, parts, expected):
    assert partition_uniform(items, parts) == expected


def test_partition_methods():
    layers = [LayerSpec(nn.Embedding, 100, 8)] + [LayerSpec(nn.Linear, 8, 8) for _ in range(4)] + [nn.LayerNorm(8)]
    assert trainable_count(layers[0]) == 800 and trainable_count(layers[1]) == 72
    assert partition(layers, 2, "parameters", trainable_count) == [0, 1, 6]
    assert partition(layers, 2, "uniform", trainable_count) == [0, 3, 6]
    assert partition(layers, 2, "type:linear", trainable_count) == [0, 3, 6]  # case-insensitive
    with pytest.raises(ConfigError, match="'type:Conv' matches no layer \\(layer types: Embedding, LayerNorm, Linear\\)"):
        partition(layers, 2, "type:Conv", trainable_count)
    with pytest.raises(ConfigError, match="not a partition method; use 'parameters', 'uniform'"):
        partition(layers, 2, "profile", trainable_count)


def test_topology_answers_as_deepspeed_documents():
    topo = ProcessTopology(axes=["pipe", "data", "model"], dims=[2, 2, 2])
    assert topo.get_axis_comm_lists("pipe") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert topo.filter_match(pipe=0, data=1) == [2, 3]
    assert topo.get_rank(pipe=1, data=0, model=1) == 5
    assert topo.get_coord(5) == topo.ProcessCoord(pipe=1, data=0, model=1)
    assert topo.get_rank_repr(3) == "model_01" and topo.get_dim("tensor") == 0
    xy = ProcessTopology(axes=["x", "y"], dims=[2, 3])
    assert xy.get_axis_list("x", 0) == [0, 1, 2] and xy.get_axis_list("y", 0) == [0, 3]


@pytest.mark.parametrize("placement,virtual", [("loop", 1), ("loop", 3), ("v", 2)])
def test_each_stage_has_one_holder(placement, virtual):
    pipe = 4
    held = {s: r for r in range(pipe) for s in stage_indices(placement, r, pipe, virtual)}
    assert sorted(held) == list(range(pipe * virtual))
    assert all(holder_of(s, pipe, placement) == r for s, r in held.items())


def test_pipeline_config_block():
    cfg = load_config({"train_batch_size": 4, "pipeline": {"stages": "auto", "use_reentrant": False}})
    assert cfg.pipeline.schedule == "1f1b" and cfg.pipeline.virtual_stages == 1
    for block, message in [
        ({"schedule": "interleaved_1f1b"}, "pipeline.virtual_stages: schedule interleaved_1f1b needs 2 or more"),
        ({"schedule": "gpipe", "virtual_stages": 2}, "schedule gpipe runs one stage per rank, got 2"),
        ({"schedule": "zbv_zero_bubble", "virtual_stages": 3}, "runs exactly 2 stages per rank, got 3"),
        ({"schedule": "dualpipev", "virtual_stages": 2, "use_reentrant": True}, "pipeline.use_reentrant: reentrant"),
        ({"schedule": "zero_bubble"}, "pipeline.schedule"),
        ({"stage": 2}, "pipeline.stage: unknown key, did you mean stages?"),
    ]:
        with pytest.raises(ConfigError, match=message.replace("(", "\\(")):
            load_config({"train_batch_size": 4, "pipeline": block})


def _specs(n: int):
    return [LayerSpec(nn.Linear, 4, 4) for _ in range(n)]


@pytest.mark.parametrize("kwargs,message", [
    (dict(layers=_specs(4), num_stages=2), "the world size 1 is not divisible by the pipeline size 2 (num_stages)"),
    (dict(layers=_specs(1), num_stages=1, virtual_stages=2), "PipelineModule has 1 layers for 2 stages"),
    (dict(layers=_specs(2)), "PipelineModule needs num_stages"),
    (dict(layers=_specs(2), num_stages=1, droppable_layers="Linear"), "droppable_layers 'Linear': give 'type:"),
    (dict(layers=_specs(2), num_stages=1, partition_method="best"), "partition_method 'best': not a partition"),
    (dict(layers=[LayerSpec(nn.Linear, 4, 4), 3], num_stages=1), "PipelineModule layer 1 is a int"),
])
def test_bad_pipeline_modules_are_one_line(kwargs, message):
    with pytest.raises(ConfigError) as info:
        PipelineModule(**kwargs)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_plain_module_where_a_pipeline_module_is_required():
    model = nn.Linear(4, 4)
    cfg = {"train_batch_size": 2, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}}
    with pytest.raises(ConfigError, match="pipeline: the model is a Linear, not a zerotrain.pipe.PipelineModule"):
        zerotrain.initialize(model=model, config=dict(cfg, pipeline={"schedule": "1f1b"}))
    engine, *_ = zerotrain.initialize(model=model, config=cfg)
    with pytest.raises(TypeError, match="engine.train_batch runs a pipeline: build the model as "
                                        "zerotrain.pipe.PipelineModule"):
        engine.train_batch(iter([]))
    foreign = type("PipelineModule", (nn.Linear,), {"__module__": "deepspeed.runtime.pipe.module"})(4, 4)
    with pytest.raises(ConfigError, match="the model is deepspeed.runtime.pipe.module.PipelineModule; build it "
                                          "with zerotrain.pipe.PipelineModule"):
        zerotrain.initialize(model=foreign, config=cfg)


def test_pipeline_config_must_fit_the_module():
    net = PipelineModule(_specs(2), num_stages=1)
    base = {"train_batch_size": 2, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}}
    for block, message in [({"stages": 2}, "pipeline.stages is 2 but the PipelineModule has num_stages=1"),
                           ({"schedule": "zbv_zero_bubble", "virtual_stages": 2},
                            "build the PipelineModule with virtual_stages=2, placement='v'")]:
        with pytest.raises(ConfigError, match=message):
            zerotrain.initialize(model=net, config=dict(base, pipeline=block))
    with pytest.raises(ConfigError, match="zero_optimization.stage 2 with pipeline parallelism: use stage 0 or 1"):
        zerotrain.initialize(model=net, config=dict(base, zero_optimization={"stage": 2}))


def test_one_stage_forward_runs_every_layer_and_drops_by_plan():
    torch.manual_seed(0)
    net = PipelineModule(_specs(3), num_stages=1, droppable_layers="type:Linear")
    x = torch.randn(2, 4)
    want = x
    for i in range(3):
        want = getattr(net, str(i))(want)
    assert torch.equal(net(x), want)
    net.train()
    net.set_step({"progressive_layer_drop": True, "pld_theta": 0.01}, key=5)
    assert len(net._drop) == 3 and any(not keep for keep, _ in net._drop.values())


class Counted(nn.Linear):
    calls = 0

    def forward(self, x):
        Counted.calls += 1
        return super().forward(x)


def test_activation_checkpointing_recomputes_each_interval():
    net = PipelineModule([LayerSpec(Counted, 4, 4) for _ in range(4)], num_stages=1)
    net.activation_checkpoint_interval = 2
    net.train()
    x = torch.randn(3, 4, requires_grad=True)
    Counted.calls = 0
    out = net(x)
    assert Counted.calls == 4
    out.sum().backward()
    assert Counted.calls == 8  # both runs of two layers ran again in backward
    grads = [p.grad.clone() for p in net.parameters()]
    net.activation_checkpoint_interval = 0
    for p in net.parameters():
        p.grad = None
    net(x).sum().backward()
    assert all(torch.allclose(g, p.grad) for g, p in zip(grads, net.parameters()))
