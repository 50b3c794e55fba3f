"""`zerotrain estimate`: model-state memory per rank for every ZeRO stage and offload choice,
before a job is launched, with DeepSpeed's own formula beside ours for comparison."""

from __future__ import annotations

import re

from ..errors import ConfigError
from ..zero.estimate import deepspeed_estimate, estimate_memory, human_bytes, total_bytes

_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}
_COUNT = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)(?:e([+-]?\d+))?\s*([kmbgt]?)\s*$", re.IGNORECASE)

# (stage, label, offload_optimizer, offload_param, DeepSpeed (cpu_offload, cpu_offload_params) or None)
ROWS = [(0, "none", "none", "none", None)]
for _s in (1, 2, 3):
    ROWS += [(_s, "none", "none", "none", (False, False)), (_s, "cpu optimizer", "cpu", "none", (True, False))]
    if _s == 3:
        ROWS += [(3, "cpu optimizer+params", "cpu", "cpu", (True, True)),
                 (3, "nvme optimizer+params", "nvme", "nvme", None)]
    else:
        ROWS += [(_s, "nvme optimizer", "nvme", "none", None)]


def parse_count(text: str, what: str = "count", allow_zero: bool = False) -> int:
    """'7B' -> 7_000_000_000, '350M', '1.5e9', '125k'; decimal (not binary) multipliers, as
    parameter counts are quoted."""
    m = _COUNT.match(str(text))
    if not m:
        raise ConfigError(f"{what} {text!r} is not a number like 7B, 350M, 125k or 1.5e9")
    mantissa, exponent, suffix = m.groups()
    value = float(mantissa) * 10 ** int(exponent or 0) * _SUFFIX[suffix.lower()]
    if value != value or value == float("inf") or value >= 1e18:
        raise ConfigError(f"{what} {text!r} is too large")
    count = round(value)
    if count < 0 or (count == 0 and not allow_zero):
        raise ConfigError(f"{what} {text!r} must be {'>= 0' if allow_zero else '> 0'}")
    return count


def add_arguments(parser) -> None:
    parser.add_argument("--params", required=True, help="total parameters, e.g. 7B, 350M, 1.5e9")
    parser.add_argument("--world-size", required=True, help="data-parallel ranks (GPUs in all)")
    parser.add_argument("--largest-layer", default="0",
                        help="parameters of the largest layer (stage 3 gathers one at a time); default 0")
    parser.add_argument("--dtype", default="bf16", help="compute dtype: fp32, bf16 or fp16 (default bf16)")
    parser.add_argument("--optimizer", default="adamw", help="adamw, adam, momentum, sgd, ... (default adamw)")
    parser.add_argument("--gpus-per-node", default="8", help="for DeepSpeed's per-node CPU figure (default 8)")


def _nodes(world_size: int, gpus_per_node: int) -> tuple[int, int]:
    n = min(gpus_per_node, world_size)
    if world_size % n:
        raise ConfigError(f"--world-size {world_size} is not a whole number of nodes of "
                          f"--gpus-per-node {gpus_per_node}")
    return n, world_size // n


def run(args) -> int:
    P = parse_count(args.params, "--params")
    ws = parse_count(args.world_size, "--world-size")
    L = parse_count(args.largest_layer, "--largest-layer", allow_zero=True)
    n, k = _nodes(ws, parse_count(args.gpus_per_node, "--gpus-per-node"))
    if L > P:
        raise ConfigError(f"--largest-layer {args.largest_layer} is larger than --params {args.params}")
    rows = []
    for stage, label, opt, par, ds in ROWS:
        try:
            est = estimate_memory(P, ws, stage, dtype=args.dtype, optimizer=args.optimizer,
                                  offload_optimizer=opt, offload_param=par, largest_layer_params=L)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        ds_cells = ["n/a", "n/a"]
        if ds is not None and stage in (2, 3):
            cpu, gpu = deepspeed_estimate(P, L, n, k, stage, ds[0], ds[1], zero_init=True)
            ds_cells = [human_bytes(gpu), human_bytes(cpu)]
        rows.append([str(stage), label] + [human_bytes(total_bytes(est, p)) for p in ("device", "host", "nvme")]
                    + [human_bytes(total_bytes(est))] + ds_cells)
    header = ["stage", "offload", "device", "host", "nvme", "total", "DS gpu/GPU", "DS cpu/node"]
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    print(f"model states per rank: {P:,} params on {ws} ranks ({n} per node x {k} node{'s' if k > 1 else ''}), "
          f"{args.dtype}, {args.optimizer}, largest layer {L:,} params")
    for r in [header] + rows:
        print("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
    print("device/host/nvme: what zerotrain holds per rank after a step (no activations, no buffers"
          " in flight); DS: DeepSpeed's estimate_zero2/zero3_model_states_mem_needs (zero_init, buffer"
          " factor 1.5), which has no stage 0/1 or nvme estimator (n/a) and counts CPU per node.")
    return 0
