"""ZeRO-Infinity's I/O buffers bound what NVMe reads hold in host memory: offload_param's
buffer_count reads of at most buffer_size elements in flight (stage 3's read-ahead window),
offload_optimizer's buffer_count blocks in the step; the numbers do not change with them
(one process: the same reads, prefetches and steps as N ranks, without the collectives)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import zerotrain
from zerotrain.errors import ConfigError

WIDTH, DEPTH = 16, 6


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(DEPTH))

    def forward(self, x, labels=None):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return ((x - labels) ** 2).mean()


def train(folder, steps: int = 3, param: dict | None = None, optimizer: dict | None = None, prefetch: int = 10**6):
    zero = {"stage": 3, "stage3_param_persistence_threshold": 0, "sub_group_size": 100,
            "stage3_prefetch_bucket_size": prefetch,  # 1e6: prefetch would read every layer ahead
            "offload_param": {"device": "nvme", "nvme_path": str(folder), **(param or {})},
            "offload_optimizer": {"device": "nvme", "nvme_path": str(folder), **(optimizer or {})}}
    cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_clipping": 0.0,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}}, "zero_optimization": zero}
    engine, *_ = zerotrain.initialize(model=Stack(), config=cfg)
    stores = engine.strategy.stores
    reads = []
    read = stores[0].read
    stores[0].read = lambda lo, hi: (reads.append(hi - lo), read(lo, hi))[1]
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x, y = torch.randn(4, WIDTH, generator=g), torch.randn(4, WIDTH, generator=g)
        loss = engine(x, labels=y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    io, stepper = stores[0].io, engine.strategy.stepper
    engine.destroy()
    return losses, io.peak_held, max(reads), stepper.peak_buffers


def test_parameter_reads_in_flight_never_exceed_buffer_count(tmp_path):
    losses, held, _, _ = train(tmp_path)  # DeepSpeed's default: 5 buffers of 1e8 elements
    assert held == 5  # prefetch asks for more: the window is what bounds it
    small, held, largest, _ = train(tmp_path, param={"buffer_count": 2, "buffer_size": WIDTH * WIDTH})
    assert held == 2
    assert largest == WIDTH * WIDTH  # a layer's weight and bias (272 elements) are read apart
    assert small == losses


def test_optimizer_blocks_in_host_memory_never_exceed_buffer_count(tmp_path):
    losses, _, _, peak = train(tmp_path)
    assert peak == 4  # the default: one stepped, one read ahead, two being written
    for count in (1, 2):
        got, _, _, peak = train(tmp_path, optimizer={"buffer_count": count})
        assert peak == count
        assert got == losses


def test_a_parameter_larger_than_a_buffer_is_one_line_naming_it(tmp_path):
    with pytest.raises(ConfigError, match=r"^zero_optimization\.offload_param\.buffer_size is 100 elements, but "
                       r"parameter 'layers\.\d\.weight' \(256 elements\) needs 256 per rank in one buffer; raise "
                       r"zero_optimization\.offload_param\.buffer_size to at least 256$"):
        train(tmp_path, param={"buffer_size": 100})
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.parametrize("block", ["offload_param", "offload_optimizer"])
def test_no_buffers_is_refused(tmp_path, block):
    with pytest.raises(ConfigError, match=rf"{block}\.buffer_count.*is 0: device 'nvme' needs at least one I/O "
                                          "buffer; set it to 1 or more"):
        train(tmp_path, **{"param" if block == "offload_param" else "optimizer": {"buffer_count": 0}})


def test_reads_are_announced_to_the_kernel_ahead_of_use(tmp_path, monkeypatch):
    """Parameter shards of the modules ahead, the optimizer's next blocks and (at the backward
    that ends the window) the step's first blocks are handed to the kernel's read-ahead."""
    from zerotrain.zero.offload import nvme_swap

    asked = []
    monkeypatch.setattr(nvme_swap.FileStore, "will_need",
                        lambda self, start, count: asked.append((self.path.name, start, count, self.numel)))
    losses, *_ = train(tmp_path, prefetch=WIDTH * WIDTH + WIDTH)  # one layer gathered ahead
    assert all(0 <= start and start + count <= numel for _, start, count, numel in asked if count > 0)
    params = [a for a in asked if a[0].startswith("params.")]
    masters = [a for a in asked if a[0].endswith(".master.bin")]
    moments = [a for a in asked if ".exp_avg" in a[0]]
    assert params and moments
    # before backward: the step's first block (the shard's last: it runs behind the forward),
    # which the step itself reads without asking
    assert any(start + count == numel and count <= 100 for _, start, count, numel in masters)
    assert any(start + count < numel for _, start, count, numel in masters)  # the blocks after the one being read
    monkeypatch.undo()
    assert train(tmp_path, prefetch=WIDTH * WIDTH + WIDTH)[0] == losses
