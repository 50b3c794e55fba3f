"""zerotrain.checkpointing: the same gradients as without it, activations recomputed in backward,
configured from the activation_checkpointing block."""

import logging

import pytest
import torch

import zerotrain
from zerotrain import checkpointing
from zerotrain.helpers import activation_checkpointing as impl


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setattr(impl, "_settings", None)
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)


def test_checkpoint_gives_the_same_gradients_and_recomputes():
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))
    x = torch.randn(3, 4, requires_grad=True)
    calls = []
    block.register_forward_pre_hook(lambda *a: calls.append(1))
    block(x).pow(2).sum().backward()
    reference = [p.grad.clone() for p in block.parameters()] + [x.grad.clone()]
    block.zero_grad(); x.grad = None
    out = checkpointing.checkpoint(block, x)
    assert len(calls) == 2
    out.pow(2).sum().backward()
    assert len(calls) == 3  # run again in backward: its activations were not kept
    for got, want in zip([p.grad for p in block.parameters()] + [x.grad], reference):
        assert torch.allclose(got, want)


def test_configure_reads_the_block_and_arguments_override():
    assert not checkpointing.is_configured()
    checkpointing.configure(None, deepspeed_config={"train_batch_size": 1, "activation_checkpointing": {
        "partition_activations": True, "profile": True, "number_checkpoints": 4}}, profile=False)
    assert checkpointing.is_configured()
    assert impl._settings.partition_activations and impl._settings.number_checkpoints == 4
    assert impl._settings.profile is False


def test_initialize_configures_it_and_profile_logs(caplog):
    model = torch.nn.Linear(2, 2)
    zerotrain.initialize(model=model, config={"train_batch_size": 1, "activation_checkpointing": {"profile": True}})
    assert checkpointing.is_configured()
    logger = logging.getLogger("zerotrain")
    logger.addHandler(caplog.handler)
    try:
        checkpointing.checkpoint(model, torch.ones(1, 2, requires_grad=True)).sum().backward()
    finally:
        logger.removeHandler(caplog.handler)
    assert any("checkpointed forward of Linear" in r.getMessage() for r in caplog.records)


def test_the_block_is_classed_key_by_key():
    from zerotrain.config import load_config
    from zerotrain.config.report import notice

    cfg = load_config({"train_batch_size": 1, "activation_checkpointing": {"partition_activations": True,
                                                                          "cpu_checkpointing": True,
                                                                          "synchronize_checkpoint_boundary": True}})
    assert notice(cfg).endswith("activation_checkpointing.partition_activations")
    with pytest.raises(zerotrain.ConfigError, match="profil"):
        load_config({"train_batch_size": 1, "activation_checkpointing": {"profiles": True}})


def test_cpu_checkpointing_keeps_a_host_copy_and_the_same_gradients(monkeypatch):
    """On a CPU the inputs are in host memory already and stay (no copy); forced to copy, the
    path an accelerator takes runs here: the checkpoint keeps the copy, gradients unchanged."""
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))
    x = torch.randn(3, 4, requires_grad=True)
    h = x * 2  # not a leaf: its gradient reaches x only through the offload's backward
    block(h).pow(2).sum().backward()
    reference = [p.grad.clone() for p in block.parameters()] + [x.grad.clone()]
    block.zero_grad(); x.grad = None
    checkpointing.configure(None, checkpoint_in_cpu=True)
    seen = []
    block.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    h = x * 2
    checkpointing.checkpoint(block, h)
    assert seen[-1] is h  # nothing to move on a CPU
    monkeypatch.setattr(impl, "_COPY_ON_HOST", True)
    out = checkpointing.checkpoint(block, h)
    assert seen[-1] is not h and seen[-1].data_ptr() != h.data_ptr() and torch.equal(seen[-1], h)
    out.pow(2).sum().backward()
    for got, want in zip([p.grad for p in block.parameters()] + [x.grad], reference):
        assert torch.allclose(got, want, rtol=1e-6, atol=0)
