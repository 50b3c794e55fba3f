"""A pipeline checkpoint loaded into a plain (non-pipeline) model.

A pipeline names its parameters by layer ("2.attn.qkv.weight", "tied_modules.embed.weight"),
a plain model by its own attributes ("blocks.0.attn.qkv.weight", "wte.weight"). A model made
of the same layers in the same order (zerotrain's GPT and BERT, an HF decoder, a module list
of the layers) holds each layer's parameters one after another in that order, so the layers
are paired in order and, within a layer, each parameter by the longest tail of its name that
picks one of the layer's:

    checkpoint, by layer    [tied_modules.embed.weight] [1.pos.weight]   [2.ln_1.weight, 2.attn.qkv.weight ...]
    this model, in order    [embed.weight]              [pos.pos.weight] [blocks.0.ln_1.weight, blocks.0.attn.qkv.weight ...]

(a tied layer counted once, where it is first used). Shapes must agree: a pair that does not,
or a parameter that finds none, is named in one line. A model whose names are the pipeline's
own is read by name.
"""

from __future__ import annotations

from ..errors import CheckpointError


def _local(name: str) -> list[str]:
    """A pipeline name's parts within its layer ("2.attn.qkv.weight" -> attn, qkv, weight)."""
    parts = name.split(".")
    return parts[2:] if parts[0] == "tied_modules" else parts[1:]


def plain_names(path, layers: list[list[str]], shapes: dict[str, tuple],
                model: list[tuple[str, tuple]]) -> dict[str, str]:
    """This model's parameter name -> the checkpoint's, for `model` ((name, shape) in
    named_parameters order) and the checkpoint's parameters grouped by layer, in layer order."""
    if all(name in shapes for name, _ in model):
        return {name: name for name, _ in model}
    count = sum(len(names) for names in layers)
    if count != len(model):
        raise CheckpointError(f"{path} is a pipeline checkpoint of {count} parameters, this model has {len(model)}; "
                              "it is of another model: load it into the model that wrote it")
    out, start = {}, 0
    for names in layers:
        window = dict(model[start : start + len(names)])
        start += len(names)
        for old in names:
            local, match = _local(old), None
            for k in range(len(local)):
                tail = ".".join(local[k:])
                found = [n for n in window if n not in out and (n == tail or n.endswith("." + tail))]
                if len(found) == 1:
                    match = found[0]
                    break
            if match is None or tuple(window[match]) != tuple(shapes[old]):
                there = f"{match} {list(window[match])}" if match else f"none of {', '.join(list(window)[:4])}"
                raise CheckpointError(f"{path} is a pipeline checkpoint of another model: its {old} "
                                      f"{list(shapes[old])} meets this model's {there} in layer order; a plain model "
                                      "loads it when it holds the same layers in the same order")
            out[match] = old
    return out


class Renamed:
    """A pipeline checkpoint (resplit.SavedSplit or a DeepSpeed pipeline folder) read under this
    model's names: the interface reshard.relayout reads, and the rest passed through."""

    def __init__(self, saved, names: dict[str, str]):
        self.saved, self.names, self.path = saved, names, saved.path
        self.back = {old: name for name, old in names.items()}

    def _old(self, name: str) -> str:
        return self.names.get(name, name)

    def knows(self, name: str) -> bool:
        return name in self.names and self.saved.knows(self.names[name])

    def model_values(self, name: str, lo: int, hi: int, dtype):
        return self.saved.model_values(self._old(name), lo, hi, dtype)

    def optimizer_values(self, key: str, name: str, lo: int, hi: int):
        return self.saved.optimizer_values(key, self._old(name), lo, hi)

    def module_value(self, key: str, like):
        return self.saved.module_value(self._old(key), like)

    def optimizer_entry(self, gi: int, names: list[str]):
        return self.saved.optimizer_entry(gi, [self._old(n) for n in names])

    def shapes(self) -> dict[str, tuple]:
        return {self.back.get(n, n): s for n, s in self.saved.shapes().items()}

    def frozen(self) -> set[str]:
        return {self.back.get(n, n) for n in self.saved.frozen()}

    def __getattr__(self, name):  # optimizer_groups, per_element, counters, describe, ...
        return getattr(self.saved, name)
