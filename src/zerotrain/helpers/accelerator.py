"""The device this process computes on, behind DeepSpeed's accelerator interface.

    acc = get_accelerator()                       # CUDA when torch sees a GPU, else the CPU
    acc.set_device(local_rank); x = x.to(acc.device_name(local_rank))

Two kinds: CUDA (torch.cuda underneath) and CPU, where the collectives run on gloo and the
memory figures are the host's: `memory_allocated` is this process's resident memory,
`total_memory` and `available_memory` the machine's. `DS_ACCELERATOR=cpu|cuda` picks one, as
DeepSpeed reads it; without it the choice is initialize's own (CUDA when torch sees a GPU).
"""

from __future__ import annotations

import contextlib
import os
import resource

import torch

from ..errors import ConfigError, NotBuiltError



def meminfo_available() -> int:
    """The host's MemAvailable in bytes, from /proc/meminfo (0 where there is none): what the
    kernel can hand out without swapping, page cache included, unlike sysconf's free pages."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0

class _Accelerator:
    """What both kinds answer the same way."""

    _name = ""
    _backend = ""

    def device_name(self, device_index: int | None = None) -> str:
        return self._name if device_index is None else f"{self._name}:{device_index}"

    def device(self, device_index: int | None = None) -> torch.device:
        return torch.device(self.device_name(device_index))

    def current_device_name(self) -> str:
        return self.device_name(self.current_device())

    def communication_backend_name(self) -> str:
        return self._backend

    def random(self):
        return torch.random

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def initial_seed(self) -> int:
        return torch.initial_seed()

    def supported_dtypes(self) -> list[torch.dtype]:
        return [torch.float32] + [t for t, ok in ((torch.float16, self.is_fp16_supported()),
                                                   (torch.bfloat16, self.is_bf16_supported())) if ok]

    def on_accelerator(self, tensor: torch.Tensor) -> bool:
        return tensor.device.type == self._name

    def memory_cached(self, device_index: int | None = None) -> int:
        return self.memory_reserved(device_index)

    def max_memory_cached(self, device_index: int | None = None) -> int:
        return self.max_memory_reserved(device_index)

    def reset_max_memory_cached(self, device_index: int | None = None) -> None:
        self.reset_peak_memory_stats(device_index)

    def reset_max_memory_allocated(self, device_index: int | None = None) -> None:
        self.reset_peak_memory_stats(device_index)

    def use_host_timers(self) -> bool:
        return self.is_synchronized_device()

    def resolves_data_dependency(self) -> bool:
        return self.is_synchronized_device()

    def handles_memory_backpressure(self) -> bool:
        return self.is_synchronized_device()

    def get_compile_backend(self) -> str:
        return "inductor"

    def export_envs(self) -> list[str]:
        return ["NCCL"] if self._backend == "nccl" else []

    def visible_devices_envs(self) -> list[str]:
        return ["CUDA_VISIBLE_DEVICES"]

    def set_visible_devices_envs(self, current_env: dict, local_accelerator_ids: list[int]) -> None:
        for name in self.visible_devices_envs():
            current_env[name] = ",".join(map(str, local_accelerator_ids))

    def create_op_builder(self, class_name: str):
        raise NotBuiltError(f"get_accelerator().create_op_builder({class_name!r}): zerotrain builds no C++/CUDA "
                            "extensions; its optimizers are torch's (zerotrain.ops.adam.FusedAdam)")

    get_op_builder = create_op_builder

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise NotBuiltError(f"get_accelerator().{name}: not in zerotrain's {self._name} accelerator; "
                            "docs/migrating.md lists what it answers", name=name)


class CUDA_Accelerator(_Accelerator):
    """torch.cuda, named as DeepSpeed's accelerator names it."""

    _name, _backend = "cuda", "nccl"

    def is_available(self) -> bool:
        return torch.cuda.is_available()

    def is_synchronized_device(self) -> bool:
        return False

    def set_device(self, device_index) -> None:
        torch.cuda.set_device(device_index)

    def current_device(self) -> int:
        return torch.cuda.current_device()

    def device_count(self) -> int:
        return torch.cuda.device_count()

    def synchronize(self, device_index: int | None = None) -> None:
        torch.cuda.synchronize(device_index)

    def manual_seed(self, seed: int) -> None:
        torch.cuda.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.cuda.manual_seed_all(seed)

    def get_rng_state(self, device_index: int | None = None) -> torch.Tensor:
        return torch.cuda.get_rng_state("cuda" if device_index is None else device_index)

    def set_rng_state(self, new_state: torch.Tensor, device_index: int | None = None) -> None:
        torch.cuda.set_rng_state(new_state, "cuda" if device_index is None else device_index)

    def default_generator(self, device_index: int):
        return torch.cuda.default_generators[device_index]

    def is_bf16_supported(self) -> bool:
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()

    def is_fp16_supported(self) -> bool:
        return torch.cuda.is_available()

    def empty_cache(self) -> None:
        torch.cuda.empty_cache()

    def memory_allocated(self, device_index: int | None = None) -> int:
        return torch.cuda.memory_allocated(device_index)

    def max_memory_allocated(self, device_index: int | None = None) -> int:
        return torch.cuda.max_memory_allocated(device_index)

    def memory_reserved(self, device_index: int | None = None) -> int:
        return torch.cuda.memory_reserved(device_index)

    def max_memory_reserved(self, device_index: int | None = None) -> int:
        return torch.cuda.max_memory_reserved(device_index)

    def reset_peak_memory_stats(self, device_index: int | None = None) -> None:
        torch.cuda.reset_peak_memory_stats(device_index)

    def memory_stats(self, device_index: int | None = None) -> dict:
        return torch.cuda.memory_stats(device_index)

    def total_memory(self, device_index: int | None = None) -> int:
        return torch.cuda.get_device_properties(device_index or 0).total_memory

    def available_memory(self, device_index: int | None = None) -> int:
        return torch.cuda.mem_get_info(device_index)[0]

    def pin_memory(self, tensor: torch.Tensor, align_bytes: int = 1) -> torch.Tensor:
        return tensor.pin_memory()

    def is_pinned(self, tensor: torch.Tensor) -> bool:
        return tensor.is_pinned()

    def amp(self):
        return torch.amp

    def range_push(self, msg: str) -> None:
        torch.cuda.nvtx.range_push(msg)

    def range_pop(self) -> None:
        torch.cuda.nvtx.range_pop()

    def lazy_call(self, callback) -> None:
        torch.cuda._lazy_call(callback)

    def stream(self, stream):
        return torch.cuda.stream(stream)

    def current_stream(self, device_index: int | None = None):
        return torch.cuda.current_stream(device_index)

    def default_stream(self, device_index: int | None = None):
        return torch.cuda.default_stream(device_index)

    @property
    def Stream(self):
        return torch.cuda.Stream

    @property
    def Event(self):
        return torch.cuda.Event


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return _peak_rss_bytes()


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


class CPU_Accelerator(_Accelerator):
    """The host: one device, nothing to synchronize, memory figures of this process and machine.
    Peak figures are the process's peak resident memory, which the OS cannot reset."""

    _name, _backend = "cpu", "gloo"

    def is_available(self) -> bool:
        return True

    def is_synchronized_device(self) -> bool:
        return True

    def set_device(self, device_index) -> None:
        pass

    def current_device(self) -> int:
        return 0

    def current_device_name(self) -> str:
        return "cpu"

    def device_name(self, device_index: int | None = None) -> str:
        return "cpu"  # the host is one device whatever the index

    def device_count(self) -> int:
        return 1

    def synchronize(self, device_index: int | None = None) -> None:
        pass

    def get_rng_state(self, device_index: int | None = None) -> torch.Tensor:
        return torch.get_rng_state()

    def set_rng_state(self, new_state: torch.Tensor, device_index: int | None = None) -> None:
        torch.set_rng_state(new_state)

    def default_generator(self, device_index: int = 0):
        return torch.default_generator

    def is_bf16_supported(self) -> bool:
        return True

    def is_fp16_supported(self) -> bool:
        return True

    def empty_cache(self) -> None:
        pass

    def memory_allocated(self, device_index: int | None = None) -> int:
        return _rss_bytes()

    def max_memory_allocated(self, device_index: int | None = None) -> int:
        return max(_peak_rss_bytes(), _rss_bytes())

    memory_reserved = memory_allocated
    max_memory_reserved = max_memory_allocated

    def reset_peak_memory_stats(self, device_index: int | None = None) -> None:
        pass

    def memory_stats(self, device_index: int | None = None) -> dict:
        return {"allocated_bytes.all.current": self.memory_allocated(),
                "allocated_bytes.all.peak": self.max_memory_allocated()}

    def total_memory(self, device_index: int | None = None) -> int:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

    def available_memory(self, device_index: int | None = None) -> int:
        return meminfo_available() or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")

    def pin_memory(self, tensor: torch.Tensor, align_bytes: int = 1) -> torch.Tensor:
        return tensor  # pinning is for copies to a GPU; there is none

    def is_pinned(self, tensor: torch.Tensor) -> bool:
        return False

    def amp(self):
        return torch.amp

    def range_push(self, msg: str) -> None:
        pass

    def range_pop(self) -> None:
        pass

    def lazy_call(self, callback) -> None:
        callback()

    def stream(self, stream):
        return contextlib.nullcontext()

    def current_stream(self, device_index: int | None = None):
        return None

    default_stream = current_stream


_KINDS = {"cuda": CUDA_Accelerator, "cpu": CPU_Accelerator}
_current: _Accelerator | None = None


def get_accelerator() -> _Accelerator:
    """The process's accelerator, chosen once: DS_ACCELERATOR if set, else CUDA when available."""
    global _current
    if _current is None:
        name = os.environ.get("DS_ACCELERATOR", "").lower()
        if name and name not in _KINDS:
            raise ConfigError(f"DS_ACCELERATOR={name!r}: zerotrain runs on {' or '.join(_KINDS)}")
        if name == "cuda" and not torch.cuda.is_available():
            raise ConfigError("DS_ACCELERATOR=cuda but torch sees no CUDA device")
        _current = _KINDS[name or ("cuda" if torch.cuda.is_available() else "cpu")]()
    return _current


def set_accelerator(accel: _Accelerator) -> None:
    global _current
    _current = accel
