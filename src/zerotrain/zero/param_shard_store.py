"""Where a stage-3 rank keeps its parameter shard: on the compute device, on the host
(offload_param cpu) or in an NVMe file (offload_param nvme). The gatherer only asks for
element ranges, so it does not care which."""

from __future__ import annotations

import torch

from .nvme_swap import FileStore


class ParamStore:
    def __init__(self, shard: torch.Tensor, kind: str, compute_device, folder=None, name: str = "params",
                 pin: bool = False):
        self.kind = kind
        self.dtype = shard.dtype
        self.numel = shard.numel()
        self.compute_device = torch.device(compute_device)
        self.place = {"none": "device", "cpu": "host", "nvme": "nvme"}[kind]
        self.file = None
        if kind == "nvme":
            self.tensor = None
            self.file = FileStore(folder / f"{name}.bin", self.numel, self.dtype)
            self.file.write_from(0, shard.cpu())
        elif kind == "cpu":
            self.tensor = shard.cpu().pin_memory() if pin else shard.cpu()
        else:
            self.tensor = shard

    def read(self, lo: int, hi: int) -> torch.Tensor:
        """Elements [lo, hi) on the compute device (a view when they already live there)."""
        if self.file is None:
            return self.tensor[lo:hi].to(self.compute_device, non_blocking=True)
        out = torch.empty(hi - lo, dtype=self.dtype)
        self.file.read_into(lo, out)
        return out.to(self.compute_device)

    def write(self, lo: int, src: torch.Tensor) -> None:
        if self.file is None:
            self.tensor[lo : lo + src.numel()].copy_(src)
        else:
            self.file.write_from(lo, src.detach().to("cpu", self.dtype))

    def full(self) -> torch.Tensor:
        return self.read(0, self.numel).clone()

    @property
    def nvme_bytes(self) -> int:
        return self.file.nbytes if self.file is not None else 0

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
