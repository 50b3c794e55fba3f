"""Which layers each pipeline stage gets: DeepSpeed's partition methods, as pure functions.

    parts = [p_0 = 0, p_1, ..., p_S = n]     stage s holds layers p_s .. p_{s+1}-1

    "uniform"       the layer count split evenly; the first n mod S stages get one extra
    "parameters"    weights = trainable parameters per layer, split by `balanced`
    "type:<regex>"  weight 1 for each layer whose class name matches (case-insensitive), else 0

`balanced` is DeepSpeed's linear partition: of all splits into S non-empty runs, the one with
the smallest (largest run weight - smallest run weight), found by dynamic programming over
prefixes; among equal costs the split whose last cut comes latest wins, as in DeepSpeed, so
the same model gets the same stages under both.
"""

from __future__ import annotations

import math
import re

from ...errors import ConfigError


def partition_uniform(num_items: int, num_parts: int) -> list[int]:
    if num_items <= num_parts:
        return [min(p, num_items) for p in range(num_parts + 1)]
    size, extra = divmod(num_items, num_parts)
    return [p * size + min(p, extra) for p in range(num_parts + 1)]


def partition_balanced(weights: list[int | float], num_parts: int) -> list[int]:
    n, m = len(weights), num_parts
    if n <= m:
        return partition_uniform(n, m)
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    inf = math.inf
    # best[i][j]: (cost, largest run, smallest run) of the first i items in j runs
    hi = [[inf] * (m + 1) for _ in range(n + 1)]
    lo = [[inf] * (m + 1) for _ in range(n + 1)]
    cost = [[inf] * (m + 1) for _ in range(n + 1)]
    cut = [[0] * (m + 1) for _ in range(n + 1)]
    hi[0][0] = cost[0][0] = 0.0
    for i in range(1, n + 1):
        for j in range(1, min(i, m) + 1):
            for k in range(i):
                run = prefix[i] - prefix[k]
                top, bottom = max(hi[k][j - 1], run), min(lo[k][j - 1], run)
                c = top - bottom
                if c <= cost[i][j]:  # ties: the later cut wins
                    cost[i][j], hi[i][j], lo[i][j], cut[i][j] = c, top, bottom, k
    parts = [n]
    for j in range(m, 0, -1):
        parts.append(cut[parts[-1]][j])
    return parts[::-1]


def layer_type_name(layer) -> str | None:
    """The name "type:<regex>" matches against: the class of a LayerSpec or module, a
    function's own name."""
    typename = getattr(layer, "typename", None)
    if isinstance(typename, type):
        return typename.__name__
    import torch

    if isinstance(layer, torch.nn.Module):
        return type(layer).__name__
    return getattr(layer, "__name__", None)


def matching_layers(layers: list, pattern: str, what: str) -> list[int]:
    try:
        regex = re.compile(pattern, re.IGNORECASE)
    except re.error as e:
        raise ConfigError(f"{what}: 'type:{pattern}' is not a valid regular expression ({e})") from None
    found = [i for i, layer in enumerate(layers) if (name := layer_type_name(layer)) is not None and regex.search(name)]
    if not found:
        names = sorted({n for n in map(layer_type_name, layers) if n})
        raise ConfigError(f"{what}: 'type:{pattern}' matches no layer (layer types: {', '.join(names)})")
    return found


def partition(layers: list, num_parts: int, method: str, count_params) -> list[int]:
    """Stage boundaries for `layers`; count_params(layer) gives a layer's trainable parameters."""
    low = method.lower() if isinstance(method, str) else method
    if low == "uniform":
        return partition_uniform(len(layers), num_parts)
    if low == "parameters":
        return partition_balanced([count_params(layer) for layer in layers], num_parts)
    if isinstance(low, str) and low.startswith("type:"):
        weights = [0] * len(layers)
        for i in matching_layers(layers, method.split(":", 1)[1], "partition_method"):
            weights[i] = 1
        return partition_balanced(weights, num_parts)
    raise ConfigError(f"partition_method {method!r}: not a partition method; use 'parameters', 'uniform' or "
                      "'type:<regex of layer class names>'")
