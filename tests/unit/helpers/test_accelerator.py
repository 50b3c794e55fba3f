"""get_accelerator() on a CPU machine, and the CUDA kind's names (torch.cuda itself is not
reachable here)."""

import torch

import zerotrain
from zerotrain.accelerator import CPU_Accelerator, CUDA_Accelerator, get_accelerator, set_accelerator


def test_the_cpu_machine_gets_the_cpu_accelerator_with_gloo(monkeypatch):
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    set_accelerator(None)
    acc = get_accelerator()
    assert acc is zerotrain.get_accelerator()  # one per process
    expected = CUDA_Accelerator if torch.cuda.is_available() else CPU_Accelerator
    assert type(acc) is expected
    if expected is CPU_Accelerator:
        assert acc.device_name() == acc.device_name(1) == acc.current_device_name() == "cpu"
        assert acc.communication_backend_name() == "gloo" and acc.device_count() == 1 and acc.is_available()


def test_cpu_memory_figures_are_the_process_and_the_machine():
    acc = CPU_Accelerator()
    before = acc.memory_allocated()
    block = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
    grown = acc.memory_allocated() - before
    assert grown > 48 * 2**20, grown
    assert acc.max_memory_allocated() >= acc.memory_allocated()
    assert 0 < acc.available_memory() <= acc.total_memory()
    del block


def test_cpu_seeding_pinning_and_dtypes():
    acc = CPU_Accelerator()
    acc.manual_seed_all(7)
    a = torch.rand(3)
    acc.manual_seed(7)
    assert torch.equal(a, torch.rand(3))
    t = torch.ones(2)
    assert acc.pin_memory(t) is t and not acc.is_pinned(t) and acc.on_accelerator(t)
    assert acc.is_bf16_supported() and torch.bfloat16 in acc.supported_dtypes()
    acc.synchronize(); acc.set_device(0); acc.empty_cache()  # accepted, nothing to do


def test_cuda_names_follow_the_index():
    acc = CUDA_Accelerator()
    assert acc.device_name() == "cuda" and acc.device_name(3) == "cuda:3"
    assert acc.device(2) == torch.device("cuda", 2) and acc.communication_backend_name() == "nccl"
    env = {}
    acc.set_visible_devices_envs(env, [1, 3])
    assert env == {"CUDA_VISIBLE_DEVICES": "1,3"}


def test_ds_accelerator_picks_the_kind(monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    set_accelerator(None)
    try:
        assert type(get_accelerator()) is CPU_Accelerator
    finally:
        set_accelerator(None)


def test_a_call_it_does_not_have_is_one_line():
    import pytest

    from zerotrain.errors import NotBuiltError

    with pytest.raises(NotBuiltError, match=r"get_accelerator\(\)\.FloatTensor: not in zerotrain's cpu accelerator"):
        CPU_Accelerator().FloatTensor
