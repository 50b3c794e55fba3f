"""A model's parameters, multiply-accumulates, FLOPs and forward latency, per module: what
DeepSpeed's `get_model_profile` reports, counted by torch's FlopCounterMode.

    flops, macs, params = get_model_profile(model, input_shape=(8, 128), print_profile=False)

FlopCounterMode counts the FLOPs of the matrix products and convolutions (2 per
multiply-accumulate, so MACs = FLOPs / 2); element-wise work (activations, norms, softmax) is
not counted. The forward runs without autograd, after `warm_up` forwards that are not timed.
"""

from __future__ import annotations

import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from ..errors import ConfigError
from .accelerator import get_accelerator


def _human(n: float, unit: str = "") -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {prefix}{unit}"
    return f"{n:g} {unit}".rstrip()


def _params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def report(model, counts: dict, total: int, depth: int, top_modules: int, latency: float, detailed: bool) -> str:
    """The totals, then the `top_modules` heaviest modules at each depth up to `depth`, from a
    FlopCounterMode's per-module counts."""
    root = type(model).__name__
    lines = [f"params {_human(_params(model))} | {_human(total // 2, 'MACs')} | {_human(total, 'FLOPs')} "
             f"| forward latency {latency * 1e3:.2f} ms | {_human(total / max(latency, 1e-12), 'FLOPS')}"]
    if not detailed:
        return "\n".join(lines)
    modules = dict(model.named_modules())
    by_depth: dict[int, list[tuple[int, str]]] = {}
    for name, ops in counts.items():
        if name == "Global" or not (name == root or name.startswith(root + ".")):
            continue
        path = name[len(root) + 1:]
        level = 0 if not path else path.count(".") + 1
        if depth >= 0 and level > depth:
            continue
        by_depth.setdefault(level, []).append((sum(ops.values()), path))
    for level in sorted(by_depth):
        top = sorted(by_depth[level], reverse=True)[:max(top_modules, 1)] if level else by_depth[level]
        for flops, path in top:
            module = modules.get(path, model)
            lines.append(f"  depth {level} {path or root} ({type(module).__name__}): params "
                         f"{_human(_params(module))}, {_human(flops // 2, 'MACs')}, "
                         f"{100 * flops / max(total, 1):.1f}% of FLOPs")
    return "\n".join(lines)


def get_model_profile(model: torch.nn.Module, input_shape: tuple | None = None, args=None, kwargs=None,
                      print_profile: bool = True, detailed: bool = True, module_depth: int = -1,
                      top_modules: int = 1, warm_up: int = 1, as_string: bool = True, output_file: str | None = None,
                      ignore_modules=None, mode: str = "forward"):
    """Profile one forward of `model` on `args`/`kwargs`, or on a tensor of ones of
    `input_shape` (the parameters' dtype and device). Returns (flops, macs, params): strings
    such as "1.23 GFLOPs" when `as_string`, else numbers. `print_profile` prints the totals and
    the `top_modules` heaviest modules at each depth up to `module_depth` (-1: all), to
    `output_file` when given. `ignore_modules` has no effect (every module is counted)."""
    if mode != "forward":
        raise ConfigError(f"get_model_profile(mode={mode!r}): only the forward is profiled; call "
                          "model.generate yourself and profile its forward")
    args, kwargs = list(args or []), dict(kwargs or {})
    if input_shape is not None:
        if args:
            raise ConfigError("get_model_profile: give input_shape or args, not both")
        first = next(model.parameters(), None)
        args = [torch.ones(tuple(input_shape), dtype=first.dtype if first is not None else torch.float32,
                           device=first.device if first is not None else "cpu")]
    with torch.no_grad():
        for _ in range(warm_up):
            model(*args, **kwargs)
        acc = get_accelerator()
        with FlopCounterMode(display=False) as counter:
            acc.synchronize()
            start = time.perf_counter()
            model(*args, **kwargs)
            acc.synchronize()
            latency = time.perf_counter() - start
    flops = counter.get_total_flops()
    macs, params = flops // 2, _params(model)
    if print_profile:
        text = report(model, counter.get_flop_counts(), flops, module_depth, top_modules, latency, detailed)
        if output_file:
            with open(output_file, "w") as f:
                f.write(text + "\n")
        else:
            print(text, flush=True)
    if as_string:
        return _human(flops, "FLOPs"), _human(macs, "MACs"), _human(params)
    return flops, macs, params
