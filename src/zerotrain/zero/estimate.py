"""Model-state memory per rank: zerotrain's own accounting, and DeepSpeed's formulas.

`estimate_memory` predicts what `engine.memory_breakdown()` reports after a step, derived
from what each stage actually allocates (stage0.py .. stage3/stage.py), so a user can size a job
before launching it and a test can hold the engine to it. `deepspeed_estimate` reproduces
DeepSpeed's `estimate_zero{2,3}_model_states_mem_needs` (spec section 6) so the two can be
shown side by side; they differ on purpose (DeepSpeed counts an fp16 gradient and an fp32
gradient per parameter, gives CPU memory per node, and has no stage 0/1 estimator).
"""

from __future__ import annotations

import math

from .layout import chunked_shard_numel, flat_padded_numel, ceil_div

CATEGORIES = ("params", "grads", "master_params", "optimizer_states")
PLACES = ("device", "host", "nvme")

# fp32 optimizer state bytes per master element (torch state tensors with more than one element)
OPTIMIZER_BYTES = {"sgd": 0, "momentum": 4, "adagrad": 4, "rmsprop": 4, "lion": 4,
                   "adam": 8, "adamw": 8, "lamb": 8}
DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2}
OFFLOAD_PLACES = {"none": "device", "cpu": "host", "nvme": "nvme"}


def _check(name: str, value: str, allowed) -> str:
    value = str(value).lower()
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(sorted(allowed))}, got {value!r}")
    return value


def estimate_memory(num_params: int, world_size: int, stage: int, *, dtype: str = "bf16",
                    optimizer: str = "adamw", offload_optimizer: str = "none", offload_param: str = "none",
                    largest_layer_params: int = 0, compute_on_host: bool = False,
                    accumulation: str = "compute") -> dict[str, dict[str, int]]:
    """Bytes of model states one rank holds at rest after a step, {category: {place: bytes}},
    the same shape and categories as `engine.memory_breakdown()`.

    `dtype` is the compute dtype (fp32, bf16, fp16). With fp16/bf16 an fp32 master copy is
    kept; with fp32 the master is the model's own buffer (or shard) and costs nothing,
    unless the optimizer is offloaded, which needs its own fp32 copy where it steps. The step
    reads the gradients in the compute dtype (offload/blockwise_optimizer.py): no fp32 gradient copy,
    unless `accumulation` is "fp32" (gradient_accumulation_steps > 1 with
    data_types.grad_accum_dtype fp32, the default then), which keeps one (whole at stages 0-1,
    this rank's shard at 2-3). Offloading the optimizer puts masters on the host (cpu) or in
    files (nvme) with its state, and stage 2-3 gradient shards on the host; `offload_param`
    (stage 3) moves the parameter shards. `compute_on_host`: the model computes on the CPU
    itself (no accelerator), so an fp32 master offloaded to the host is the model's own
    buffer again.
    `largest_layer_params` adds stage 3's working set, one gathered layer in compute dtype,
    to params on device (0: memory at rest, what memory_breakdown sees after a step).
    """
    if int(num_params) <= 0 or int(world_size) <= 0:
        raise ValueError("num_params and world_size must be positive")
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"stage must be 0, 1, 2 or 3, got {stage!r}")
    cb = DTYPE_BYTES[_check("dtype", dtype, DTYPE_BYTES)]
    ob = OPTIMIZER_BYTES[_check("optimizer", optimizer, OPTIMIZER_BYTES)]
    opt_place = OFFLOAD_PLACES[_check("offload_optimizer", offload_optimizer, OFFLOAD_PLACES)]
    param_place = OFFLOAD_PLACES[_check("offload_param", offload_param, OFFLOAD_PLACES)]
    if stage == 0 and opt_place != "device":
        raise ValueError("offload_optimizer needs ZeRO stage 1, 2 or 3")
    if stage != 3 and param_place != "device":
        raise ValueError("offload_param needs ZeRO stage 3")
    mixed = cb != 4
    P, N = int(num_params), int(world_size)

    if stage == 3:
        full = shard = chunked_shard_numel(ceil_div(P, N))  # a few elements per tensor are left out
    else:
        full = flat_padded_numel(P, N)
        shard = full if stage == 0 else full // N
    out = {c: dict.fromkeys(PLACES, 0) for c in CATEGORIES}
    # model parameters in compute dtype: whole at stages 0-2, this rank's chunks at stage 3
    out["params"][param_place if stage == 3 else "device"] += cb * full
    if stage == 3:
        out["params"]["device"] += cb * int(largest_layer_params)
    # separate fp32 masters live with the optimizer state (host for cpu, files for nvme)
    separate = (mixed or opt_place == "nvme" or (opt_place != "device" and not compute_on_host)
                or (stage == 3 and param_place == "nvme"))
    step_place = "device" if opt_place == "device" else "host"
    wide = 4 if _check("accumulation", accumulation, ("compute", "fp32")) == "fp32" else cb
    # gradients: the whole compute-dtype buffer at stages 0-1 (plus a whole fp32 accumulator
    # when accumulating wider), this rank's reduced shard at 2-3 where the optimizer steps
    if stage <= 1:
        out["grads"]["device"] += cb * full + (4 * full if wide > cb else 0)
    else:
        out["grads"][step_place] += wide * shard
    if separate:
        out["master_params"][opt_place if opt_place == "nvme" else step_place] += 4 * shard
    out["optimizer_states"][opt_place] += ob * shard
    return out


def total_bytes(breakdown: dict[str, dict[str, int]], place: str | None = None) -> int:
    return sum(b for by_place in breakdown.values() for p, b in by_place.items() if place in (None, p))


def deepspeed_estimate(num_params: int, largest_layer_params: int, gpus_per_node: int, num_nodes: int,
                       stage: int, cpu_offload: bool, cpu_offload_params: bool, zero_init: bool,
                       additional_buffer_factor: float = 1.5) -> tuple[int, int]:
    """(cpu bytes per node, gpu bytes per GPU) by DeepSpeed's model-state estimators.

    Stage 2 ignores largest_layer_params, cpu_offload_params and zero_init, as DeepSpeed's
    does. Results are truncated with int() (DeepSpeed does so at stage 2; its stage 3 CPU
    figure is a float, truncated here to whole bytes).
    """
    P, L, n, k, b = num_params, largest_layer_params, gpus_per_node, num_nodes, additional_buffer_factor
    G = n * k
    if stage == 2:
        if cpu_offload:
            gpu, cpu = 2 * P, P * max(4 * G, 16) * b
        else:
            gpu, cpu = 2 * P + int(18 * P / G), 4 * P * n * b
        return int(cpu), int(gpu)
    if stage == 3:
        LL, f = 4 * L, 1 / k
        if cpu_offload and cpu_offload_params:
            gpu = LL
            cpu = P * 18 * f * b if zero_init else P * max(4 * n, 18 * f) * b
        elif cpu_offload:
            gpu = LL + int(2 * P / G)
            cpu = P * 16 * f * b if zero_init else P * max(4 * n, 16 * f) * b
        elif cpu_offload_params:
            raise ValueError("DeepSpeed does not estimate parameter offload without optimizer offload")
        else:
            gpu = LL + int(18 * P / G)
            cpu = 4 * L * n * b if zero_init else 4 * P * n * b
        return int(cpu), int(gpu)
    raise ValueError(f"DeepSpeed has no model-state memory estimator for stage {stage} (only stages 2 and 3)")


def human_bytes(n: float) -> str:
    """1536 -> '1.50 KiB'; binary units, three significant-ish digits."""
    if n < 1024:
        return f"{int(n)} B"
    exp = min(int(math.log(n, 1024)), 5)
    return f"{n / 1024 ** exp:.2f} {'BKMGTP'[exp]}iB"
