"""Stage-3 parameters outside their own module's hooks, in one process: shapes answer whole,
uses outside a pass fail in one line, external parameters join their user's gathers,
zero.Init survives deep copies and feeds GatheredParameters, frozen parameters are
sharded, gradients assigned after backward are used or refused, and a second initialize
on the same model takes it over from the first engine."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import zerotrain
from zerotrain.errors import ModelInterfaceError
from zerotrain.zero.stage3.partitioned_param import PartitionedParameter


@pytest.fixture(autouse=True)
def _single_process(monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(4, 6)
        self.b = nn.Linear(6, 3)

    def forward(self, x):
        return ((self.b(torch.tanh(self.a(x)))) ** 2).mean()


def config(stage: int, **zero) -> dict:
    return {"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 0.0,
            "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0, **zero},
            "optimizer": {"type": "SGD", "params": {"lr": 0.1}}}


def batch(i: int) -> torch.Tensor:
    return torch.randn(2, 4, generator=torch.Generator().manual_seed(i))


def test_shapes_answer_whole_while_the_values_are_released():
    model = Net()
    engine, *_ = zerotrain.initialize(model=model, config=config(3))
    w = model.a.weight
    assert type(w) is PartitionedParameter and w.untyped_storage().nbytes() == 0
    assert w.shape == (6, 4) and w.size(1) == 4 and w.dim() == 2 and w.numel() == 24
    assert sum(p.numel() for p in model.parameters()) == 6 * 4 + 6 + 6 * 3 + 3


def test_a_released_parameter_used_outside_a_pass_is_one_clear_line():
    model = Net()
    zerotrain.initialize(model=model, config=config(3))
    with pytest.raises(ModelInterfaceError, match=r"a\.weight is partitioned .*GatheredParameters"):
        torch.nn.functional.linear(torch.randn(1, 4), model.a.weight)
    with zerotrain.zero.GatheredParameters(model.a.weight):  # the way to do it
        assert torch.nn.functional.linear(torch.randn(1, 4), model.a.weight).shape == (1, 6)


class ParentReadsChild(nn.Module):
    """The parent calls its child's weight itself, never the child's forward (as
    nn.MultiheadAttention does with out_proj)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.scale = nn.Parameter(torch.ones(4))
        self.child = nn.Linear(4, 4)

    def forward(self, x):
        return (torch.nn.functional.linear(x * self.scale, self.child.weight, self.child.bias) ** 2).mean()


@pytest.mark.parametrize("declared", [False, True])
def test_a_parameter_used_by_another_module_joins_its_gathers(declared):
    reference = ParentReadsChild()
    model = ParentReadsChild()
    if declared:
        zerotrain.zero.register_external_parameter(model, model.child.weight)
    engine, *_ = zerotrain.initialize(model=model, config=config(3))
    schedule = engine.strategy.schedule
    k = schedule._module_index[id(model)]
    assert any(p is model.child.weight for p in schedule.owner_params[k]) == declared
    opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for i in range(3):
        loss = engine(batch(i))
        engine.backward(loss)
        engine.step()
        opt.zero_grad()
        want = reference(batch(i))
        want.backward()
        opt.step()
        assert loss.item() == pytest.approx(want.item(), rel=1e-6)
    assert any(p is model.child.weight for p in schedule.owner_params[k])  # found on the first pass
    assert engine.strategy.gatherer.live_numel == 0


def test_register_external_parameter_refuses_a_foreign_tensor():
    model = ParentReadsChild()
    engine, *_ = zerotrain.initialize(model=model, config=config(3))
    other = nn.Parameter(torch.ones(2))
    with pytest.raises(ModelInterfaceError, match="not one the ZeRO-3 engine manages"):
        engine.strategy.schedule.add_external(model, other)  # the engine asked about a tensor it does not shard
    from zerotrain.zero.stage3.gathered_parameters import register_owner

    register_owner([other], engine.strategy)  # a stale entry (an id reused): not taken for the engine's
    zerotrain.zero.register_external_parameter(model, other)
    assert any(q is other for q in model.__dict__["_zt_external_params"])
    with zerotrain.zero.GatheredParameters([other]):  # and no gather is asked of the engine for it
        assert torch.equal(other, torch.ones(2))


def test_deep_copies_under_init_keep_their_chunks_and_init_sees_whole_values():
    with zerotrain.zero.Init():
        torch.manual_seed(0)
        layer = nn.Linear(4, 5)
        twin = copy.deepcopy(layer)
        nn.init.constant_(twin.bias, 3.0)  # an init call on a parameter already cut
        holder = nn.ModuleList([layer, twin])
    assert holder[1].weight.zt_chunk.numel() == 20 and holder[1].weight.shape == (5, 4)
    with zerotrain.zero.GatheredParameters(list(holder.parameters())):
        assert torch.equal(holder[0].weight, holder[1].weight)
        assert torch.equal(holder[1].bias, torch.full((5,), 3.0))


def test_gathered_parameters_writes_into_a_model_built_under_init():
    with zerotrain.zero.Init():
        model = Net()
    with zerotrain.zero.GatheredParameters([model.a.weight], modifier_rank=0):
        model.a.weight.data.fill_(0.5)
    assert torch.equal(model.a.weight.zt_chunk, torch.full((24,), 0.5))
    zerotrain.initialize(model=model, config=config(3))
    with zerotrain.zero.GatheredParameters(model.a.weight):
        assert torch.equal(model.a.weight, torch.full((6, 4), 0.5))


def test_frozen_parameters_are_sharded_gathered_and_checkpointed(tmp_path):
    model = Net()
    model.a.requires_grad_(False)
    frozen = {k: v.clone() for k, v in model.a.state_dict().items()}
    engine, *_ = zerotrain.initialize(model=model, config=config(3))
    assert model.a.weight.untyped_storage().nbytes() == 0  # sharded, not kept whole
    for i in range(2):
        engine.backward(engine(batch(i)))
        engine.step()
    engine.save_checkpoint(tmp_path)
    from zerotrain.checkpoint.consolidate import consolidate_checkpoint

    state = consolidate_checkpoint(tmp_path)
    assert torch.equal(state["a.weight"], frozen["weight"]) and torch.equal(state["a.bias"], frozen["bias"])
    assert not torch.equal(state["b.weight"], Net().b.weight.detach())


@pytest.mark.parametrize("stage", [0, 1])
def test_gradients_assigned_after_backward_are_used(stage):
    model, reference = Net(), Net()
    engine, *_ = zerotrain.initialize(model=model, config=config(stage))
    opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for i in range(2):
        engine.backward(engine(batch(i)))
        model.a.weight.grad = torch.full((6, 4), 0.25)  # gradient surgery
        engine.step()
        opt.zero_grad()
        reference(batch(i)).backward()
        reference.a.weight.grad = torch.full((6, 4), 0.25)
        opt.step()
    for got, want in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("stage", [2, 3])
def test_gradients_assigned_after_backward_are_refused_where_they_were_sharded(stage):
    model = Net()
    engine, *_ = zerotrain.initialize(model=model, config=config(stage))
    engine.backward(engine(batch(0)))
    with pytest.raises(RuntimeError, match=f"ZeRO stage {stage}: a gradient was assigned"):
        model.b.bias.grad = torch.ones(3)  # stage 3: the parameter itself is released by now
        engine.step()


@pytest.mark.parametrize("first,second", [(3, 3), (3, 0), (2, 3), (0, 1)])
def test_initialize_again_on_the_same_model_takes_it_over(first, second):
    model, reference = Net(), Net()
    engine, *_ = zerotrain.initialize(model=model, config=config(first))
    opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for i in range(2):
        engine.backward(engine(batch(i)))
        engine.step()
        opt.zero_grad()
        reference(batch(i)).backward()
        opt.step()
    again, *_ = zerotrain.initialize(model=model, config=config(second))
    loss = again(batch(2))
    assert loss.item() == pytest.approx(reference(batch(2)).item(), rel=1e-6)
    again.backward(loss)
    again.step()
    with pytest.raises(RuntimeError, match="replaced by a later zerotrain.initialize"):
        engine(batch(3))
    if second < 3:
        assert all(type(p) is nn.Parameter for p in model.parameters())


class Checkpointed(nn.Module):
    """A block recomputed in backward with torch's non-reentrant checkpoint, which stops the
    recomputation early (post-forward hooks of the last modules never run)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.c = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 1)

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        h = checkpoint(lambda t: self.b(torch.tanh(self.a(t))), x, use_reentrant=False)
        return (self.c(h) ** 2).mean()


def test_a_pass_ends_with_backward_even_when_recomputation_stops_early():
    """Else a later state_dict() on rank 0 alone would gather: a collective the others never join."""
    model = Checkpointed()
    engine, *_ = zerotrain.initialize(model=model, config=config(3))
    for i in range(2):
        engine.backward(engine(batch(i)))
        engine.step()
        assert not engine.strategy.schedule.in_pass
    assert all(v.numel() == 0 for v in model.state_dict().values())  # stays empty: nothing gathered


def test_init_takes_deepspeeds_arguments(tmp_path):
    import logging

    ds_config = tmp_path / "ds.json"
    ds_config.write_text('{"train_batch_size": "auto", "bf16": {"enabled": true}}')
    lines: list[str] = []
    catch = logging.Handler()
    catch.emit = lambda record: lines.append(record.getMessage())
    logging.getLogger("zerotrain").addHandler(catch)
    try:
        with zerotrain.zero.Init(config_dict_or_path=str(ds_config), remote_device="cpu", pin_memory=True):
            model = Net()
    finally:
        logging.getLogger("zerotrain").removeHandler(catch)
    assert model.a.weight.zt_chunk.dtype == torch.bfloat16  # the config's precision, while built
    assert len(lines) == 1 and "no effect here: pin_memory" in lines[0] and "remote_device" in lines[0]
    with zerotrain.zero.Init(dtype=torch.float16):
        assert Net().a.bias.zt_chunk.dtype == torch.float16
    whole = Net()
    built = Net()
    zerotrain.zero.Init(module=built)  # a model built already: partitioned there and then
    assert built.a.weight.zt_chunk.numel() == 24 and built.a.weight.untyped_storage().nbytes() == 0
    with zerotrain.zero.GatheredParameters(list(built.parameters())):
        assert torch.equal(built.a.weight, whole.a.weight)
    with pytest.raises(zerotrain.ConfigError, match=r"Init\(mpu=...\): not supported; remove it"):
        zerotrain.zero.Init(mpu=object())
    with pytest.raises(zerotrain.ConfigError, match=r"zero_quantized_weights"):
        zerotrain.zero.Init(zero_quantized_weights=True)
    with pytest.raises(TypeError, match="no_such_option"):
        zerotrain.zero.Init(no_such_option=1)
