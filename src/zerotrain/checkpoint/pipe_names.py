"""A pipeline checkpoint loaded into a plain (non-pipeline) model.

A pipeline names its parameters by layer ("2.attn.qkv.weight", "tied_modules.embed.weight"),
a plain model by its own attributes ("blocks.0.attn.qkv.weight", "wte.weight"). A model made
of the same layers in the same order (zerotrain's GPT and BERT, an HF decoder, a module list
of the layers) holds the same parameters in the same order, so the two are paired in order:

    checkpoint, in layer order     tied_modules.embed.weight  1.pos.weight  2.ln_1.weight ...
    this model, named_parameters   embed.weight               pos.pos.weight  blocks.0.ln_1.weight ...

(a tied layer counted once, where it is first used). Every pair must agree in shape and in
its last name part (weight, bias): otherwise the model is another one, and the first pair that
differs is named. A model whose names are the pipeline's own is read by name.
"""

from __future__ import annotations

from ..errors import CheckpointError


def plain_names(path, order: list[str], shapes: dict[str, tuple], model: list[tuple[str, tuple]]) -> dict[str, str]:
    """This model's parameter name -> the checkpoint's, for `model` ((name, shape) in
    named_parameters order) and the checkpoint's parameters in layer `order`."""
    if all(name in shapes for name, _ in model):
        return {name: name for name, _ in model}
    if len(order) != len(model):
        raise CheckpointError(f"{path} is a pipeline checkpoint of {len(order)} parameters, this model has "
                              f"{len(model)}; it is of another model: load it into the model that wrote it")
    for (name, shape), old in zip(model, order):
        if tuple(shape) != tuple(shapes[old]) or name.rsplit(".", 1)[-1] != old.rsplit(".", 1)[-1]:
            raise CheckpointError(f"{path} is a pipeline checkpoint of another model: in layer order its {old} "
                                  f"{list(shapes[old])} meets this model's {name} {list(shape)}; a plain model loads "
                                  "it when its parameters come in the pipeline's layer order with the same shapes")
    return {name: old for (name, _), old in zip(model, order)}


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
