"""Where a stage-3 rank keeps its parameter shard: on the compute device, on the host
(offload_param cpu) or in an NVMe file (offload_param nvme). The gatherer only asks for
element ranges, so it does not care which."""

from __future__ import annotations

import torch

from .nvme_swap import FileStore, copy_into


class ParamStore:
    """A zeroed shard of `numel` elements; the strategy fills it chunk by chunk (stage3_gather.
    ShardedGroup.fill), so building it never holds more than one parameter's chunk twice."""

    def __init__(self, numel: int, dtype: torch.dtype, kind: str, compute_device, folder=None,
                 name: str = "params", pin: bool = False):
        self.kind = kind
        self.dtype = dtype
        self.numel = numel
        self.compute_device = torch.device(compute_device)
        self.place = {"none": "device", "cpu": "host", "nvme": "nvme"}[kind]
        self.file = None
        if kind == "nvme":
            self.tensor = None
            self.file = FileStore(folder / f"{name}.bin", numel, dtype)  # a sparse file of zeros
        else:
            device = "cpu" if kind == "cpu" else compute_device
            self.tensor = torch.zeros(numel, dtype=dtype, device=device)
            if kind == "cpu" and pin:
                self.tensor = self.tensor.pin_memory()

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

    def full(self):
        """The whole shard for a checkpoint: a copy, or its file (copied file to file)."""
        return self.file if self.file is not None else self.read(0, self.numel).clone()

    def load(self, value) -> None:
        """The whole shard from a checkpoint's tensor or RawTensor."""
        copy_into(self.file if self.file is not None else self.tensor, value)

    @property
    def nvme_bytes(self) -> int:
        return self.file.nbytes if self.file is not None else 0

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
