"""What DeepSpeed's test harness asks of its environment, on CPU with gloo.

None of this is zerotrain behaviour: it is the accelerator abstraction DeepSpeed's tests use
to pick a device, seed and skip (answered from torch's CPU calls, as DeepSpeed's own CPU
accelerator answers), `init_distributed` (torch.distributed.init_process_group with
DeepSpeed's argument names), torch's version info, and DeepSpeed's op builders (see _BUILT).
"""

from __future__ import annotations

import logging
import os
import re

import torch
import torch.distributed as dist

logger = logging.getLogger("zerotrain")


class CpuAccelerator:
    """DeepSpeed's accelerator interface over torch's CPU device. fp16 counts as supported:
    zerotrain trains in fp16 on CPU (DeepSpeed's CPU accelerator asks oneDNN instead)."""

    _name = "cpu"
    _communication_backend_name = "gloo"

    def device_name(self, device_index=None):
        return "cpu"

    def device(self, device_index=None):
        return torch.device("cpu")

    def current_device(self):
        return "cpu"

    def current_device_name(self):
        return "cpu"

    def set_device(self, device_index):
        return None

    def is_available(self):
        return True

    def device_count(self):
        # gloo runs any number of ranks on the host; 8 bounds the worlds the tests ask for
        return int(os.environ.get("LOCAL_SIZE", 0)) or 8

    def communication_backend_name(self):
        return "gloo"

    def is_bf16_supported(self):
        return True

    def is_fp16_supported(self):
        return True

    def supported_dtypes(self):
        return [torch.float, torch.bfloat16, torch.float16]

    def is_synchronized_device(self):
        return True

    def is_triton_supported(self):
        return False

    def synchronize(self, device_index=None):
        return None

    def empty_cache(self):
        return None

    def manual_seed(self, seed):
        return torch.manual_seed(seed)

    def manual_seed_all(self, seed):
        return torch.manual_seed(seed)

    def initial_seed(self):
        return torch.initial_seed()

    def get_rng_state(self, device_index=None):
        return torch.get_rng_state()

    def set_rng_state(self, new_state, device_index=None):
        return torch.set_rng_state(new_state)

    def memory_allocated(self, device_index=None):
        return 0

    def max_memory_allocated(self, device_index=None):
        return 0

    def reset_peak_memory_stats(self, device_index=None):
        return None

    def pin_memory(self, tensor, align_bytes=1):
        return tensor

    def is_pinned(self, tensor):
        return tensor.is_pinned()

    def on_accelerator(self, tensor):
        return tensor.device.type == "cpu"

    def use_host_timers(self):
        return True

    def resolves_data_dependency(self):
        return True

    def handles_memory_backpressure(self):
        return True


_ACCELERATOR = CpuAccelerator()


def get_accelerator():
    return _ACCELERATOR


def accelerator_supported():
    return True


def init_distributed(dist_backend=None, auto_mpi_discovery=True, distributed_port=29500, verbose=True,
                     timeout=None, init_method=None, dist_init_required=None, config=None, rank=-1,
                     world_size=-1):
    if dist.is_initialized():
        return
    kwargs = {"timeout": timeout} if timeout is not None else {}
    dist.init_process_group(backend=dist_backend or "gloo", init_method=init_method or "env://",
                            rank=rank, world_size=world_size, **kwargs)


def _version(text: str | None) -> str:
    return ".".join((text or "0.0").split(".")[:2])


torch_info = {"version": _version(torch.__version__), "cuda_version": _version(torch.version.cuda),
              "nccl_version": "0.0", "hip_version": "0.0", "bf16_support": False}


def _tuple(version) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", str(version))[:2])


def required_torch_version(min_version=None, max_version=None):
    have = _tuple(torch.__version__)
    return (min_version is None or have >= _tuple(min_version)) and \
        (max_version is None or have <= _tuple(max_version))


def see_memory_usage(message, force=False):
    return None


# DeepSpeed's op builders. The two Adam kernels stand for what zerotrain builds from the same
# config ("Adam" on the device: torch's fused/foreach AdamW; offloaded: torch's Adam(W) on
# the host), so the tests gated on them run; no other DeepSpeed kernel has a counterpart.
_BUILT = {"fused_adam": True, "cpu_adam": True}


class _Compatible(dict):
    """deepspeed.ops.__compatible_ops__"""

    def __missing__(self, key):
        return False


compatible_ops = _Compatible(_BUILT)


class OpBuilder:
    NAME = "op"

    def is_compatible(self, verbose=False):
        return compatible_ops[self.NAME]

    def load(self, verbose=True):
        raise RuntimeError(f"{self.NAME}: DeepSpeed kernels are not built for zerotrain")


def _builder(name: str):
    if not name.endswith("Builder"):
        return None
    words = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name[: -len("Builder")])
    return type(name, (OpBuilder,), {"NAME": words.lower()})


# module -> factory(name) for names the harness makes up on demand
FACTORIES = {"deepspeed.ops.op_builder": _builder}
