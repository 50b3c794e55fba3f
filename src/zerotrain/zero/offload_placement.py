"""Where the fp32 masters and the optimizer state of a ZeRO stage live.

    device "none"  on the compute device (the default)
    device "cpu"   on the host (pinned when a GPU is present); the optimizer steps there
    device "nvme"  masters on the host, optimizer state in files (offload.SwappedOptimizer)
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

from ..config.zero import NVME_BLOCK_NUMEL as BLOCK_NUMEL  # the largest swap block (config resolves it)
from .nvme_swap import SwappedOptimizer, rank_folder


class OptimizerOffload:
    def __init__(self, config, rank: int, device, block_numel: int = BLOCK_NUMEL):
        self.kind = getattr(config, "device", "none") if config is not None else "none"
        self.enabled = self.kind != "none"
        self.place = "host" if self.enabled else "device"
        self.master_device = torch.device("cpu") if self.enabled else torch.device(device)
        self.pin = bool(self.enabled and getattr(config, "pin_memory", False) and torch.cuda.is_available())
        self.nvme_path = getattr(config, "nvme_path", None)
        self.rank = rank
        self.block_numel = max(1, min(int(block_numel), BLOCK_NUMEL))
        self.swapped: SwappedOptimizer | None = None

    def new_master(self, like: torch.Tensor) -> torch.nn.Parameter:
        """An fp32 copy of `like` where masters live, with a zeroed fp32 gradient beside it."""
        data = like.detach().to(self.master_device, dtype=torch.float32, copy=True)
        if self.pin:
            data = data.pin_memory()
        master = torch.nn.Parameter(data)
        master.grad = torch.zeros_like(data)
        return master

    def build_optimizer(self, build, groups: list[dict]):
        if self.kind != "nvme":
            return build(groups)
        pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="zerotrain-nvme")
        self.swapped = SwappedOptimizer(build, groups, rank_folder(self.nvme_path, self.rank),
                                        self.block_numel, pool)
        return self.swapped

    def nvme_bytes(self) -> dict[str, int]:
        return {"optimizer_states": self.swapped.nvme_bytes()} if self.swapped is not None else {}

    def close(self) -> None:
        if self.swapped is not None:
            self.swapped.close()
            self.swapped.pool.shutdown()
