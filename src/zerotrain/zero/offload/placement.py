"""Where the fp32 masters and the optimizer state of a ZeRO stage live, and which optimizer
steps them.

    device "none"  on the compute device (the default)
    device "cpu"   on the host (pinned when a GPU is present); the optimizer steps there
    device "nvme"  in files under nvme_path, stepped block by block through the host

Masters are the model's own tensors only in fp32 with nothing offloaded away from where
the model computes; then torch's optimizer steps them directly (flat, fused). Otherwise
they are separate and blockwise_optimizer.BlockwiseOptimizer keeps and steps them.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from ...config.zero import NVME_BLOCK_NUMEL as BLOCK_NUMEL  # the largest swap block (config resolves it)
from .blockwise_optimizer import RESIDENT_BLOCK_NUMEL, BlockwiseOptimizer, MasterGroup
from ...helpers.accelerator import meminfo_available as available_memory
from .nvme_swap import check_nvme_path, rank_folder


class OptimizerOffload:
    def __init__(self, config, rank: int, device, block_numel: int = BLOCK_NUMEL, local_ranks: int = 1):
        self.kind = getattr(config, "device", "none") if config is not None else "none"
        self.enabled = self.kind != "none"
        self.place = "host" if self.enabled else "device"
        self.master_device = torch.device("cpu") if self.enabled else torch.device(device)
        self.pin = bool(self.enabled and getattr(config, "pin_memory", False) and torch.cuda.is_available())
        self.nvme_path = getattr(config, "nvme_path", None)
        self.rank = rank
        self.local_ranks = max(1, local_ranks)  # ranks sharing this host's memory
        self.block_numel = max(1, min(int(block_numel), BLOCK_NUMEL))
        self.buffer_count = int(getattr(config, "buffer_count", 4))  # nvme blocks in host memory at once
        self.stepper: BlockwiseOptimizer | None = None
        self.pool: ThreadPoolExecutor | None = None

    @property
    def master_place(self) -> str:
        return "nvme" if self.kind == "nvme" else self.place

    def separate_from(self, device: torch.device, mixed: bool) -> bool:
        """Whether the masters must be tensors of their own (not the model's)."""
        return mixed or self.kind == "nvme" or self.master_device != device

    def check_space(self, numel: int, state_bytes: int, also: tuple[str | None, int] = (None, 0)) -> None:
        """Before any file exists: room under nvme_path for `numel` fp32 master elements and
        their optimizer state (`state_bytes` per element), plus `also` = (path, bytes) of
        stage-3 parameter files when they go to the same folder."""
        path, extra = also
        if self.kind == "nvme":
            same = path is not None and Path(path).resolve() == Path(self.nvme_path).resolve()
            needed = (4 + state_bytes) * numel + (extra if same else 0)
            check_nvme_path(self.nvme_path, needed, f"fp32 masters and optimizer state{', parameters' if same else ''}")
            if same:
                return
        if path is not None:
            check_nvme_path(path, extra, "parameter shards")

    def new_grad(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A reduced-gradient shard where the optimizer steps (stages 2-3)."""
        t = torch.zeros(numel, dtype=dtype, device=self.master_device)
        return t.pin_memory() if self.pin else t

    def build_stepper(self, build, hyper: list[dict], groups: list[MasterGroup]) -> BlockwiseOptimizer:
        folder = None
        if self.kind == "nvme":
            self.pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="zerotrain-nvme")
            folder = rank_folder(self.nvme_path, self.rank)
        self.stepper = BlockwiseOptimizer(
            build, hyper, groups, device=self.master_device, pin=self.pin, folder=folder, pool=self.pool,
            block_numel=self.block_numel if folder is not None else RESIDENT_BLOCK_NUMEL, buffer_count=self.buffer_count)
        return self.stepper

    def before_backward(self, boundary: bool) -> None:
        """The backward that ends an accumulation window starts: with nvme, the step's first
        blocks are read into the page cache while it computes (an I/O thread asks the kernel,
        see BlockwiseOptimizer.read_ahead), within this rank's share of half the
        host's available memory, so the disk works during backward too."""
        if boundary and self.kind == "nvme" and self.stepper is not None:
            self.stepper.read_ahead(available_memory() // (2 * self.local_ranks))

    def nvme_bytes(self) -> dict[str, int]:
        return self.stepper.nvme_bytes() if self.stepper is not None and self.kind == "nvme" else {}

    def close(self) -> None:
        if self.stepper is not None:
            self.stepper.close()
        if self.pool is not None:
            self.pool.shutdown()
