"""zerotrain.comm as deepspeed.comm, in one process: a world of one without a process group, and
init_distributed making one (idempotent)."""

import pytest
import torch

import zerotrain
import zerotrain.comm as dist


@pytest.fixture(autouse=True)
def _no_world(monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    yield
    dist.destroy_process_group()


def test_without_a_group_every_call_answers_for_one_process():
    assert not dist.is_initialized()
    assert (dist.get_rank(), dist.get_world_size(), dist.get_local_rank()) == (0, 1, 0)
    t = torch.arange(3.0)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    dist.broadcast(t, src=0)
    assert torch.equal(t, torch.arange(3.0))
    out = [torch.zeros(3)]
    assert dist.all_gather(out, t, async_op=True).wait()
    big = torch.zeros(3)
    dist.all_gather_into_tensor(big, t)
    objs = [None]
    dist.all_gather_object(objs, {"a": 1})
    assert torch.equal(out[0], t) and torch.equal(big, t) and objs == [{"a": 1}]
    dist.barrier()


def test_init_distributed_makes_a_world_of_one_once():
    zerotrain.init_distributed()
    assert dist.is_initialized() and dist.get_world_size() == 1
    assert dist.get_backend() == zerotrain.get_accelerator().communication_backend_name()
    zerotrain.init_distributed(dist_backend="gloo")  # already there: nothing changes
    t = torch.ones(2)
    dist.all_reduce(t)
    assert torch.equal(t, torch.ones(2))


def test_log_summary_counts_the_calls():
    before = {op: list(v) for op, v in dist.facade._sent.items()}
    dist.all_reduce(torch.ones(4))
    dist.all_reduce(torch.ones(4))
    text = dist.log_summary()
    calls = dist.facade._sent["all_reduce"][0] - before.get("all_reduce", [0])[0]
    assert calls == 2 and "all_reduce" in text and "MiB sent" in text
