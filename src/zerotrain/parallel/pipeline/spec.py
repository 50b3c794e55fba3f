"""LayerSpec and TiedLayerSpec: a layer described, built only on the stage that owns it.

    LayerSpec(nn.Linear, 512, 512, bias=False)          nn.Linear(512, 512, bias=False), later
    TiedLayerSpec("embed", Embed, vocab, dim)           one module per stage that uses key "embed";
    TiedLayerSpec("embed", Embed, vocab, dim,           the stages' copies start equal and their
                  forward_fn=lambda m, x: x @ m.weight.t())   gradients are summed before each step

So no rank ever holds the whole model: only the layers of its own stages are constructed.
"""

from __future__ import annotations


import torch
from torch import nn

from ...errors import ConfigError
from ...features.model_api import forward_accepts


class LayerSpec:
    def __init__(self, typename, *module_args, **module_kwargs):
        if not (isinstance(typename, type) and issubclass(typename, nn.Module)):
            raise ConfigError(f"LayerSpec({typename!r}, ...): the first argument must be an nn.Module class")
        self.typename = typename
        self.module_args = module_args
        self.module_kwargs = module_kwargs

    def build(self, log: bool = False) -> nn.Module:
        return self.typename(*self.module_args, **self.module_kwargs)

    def __repr__(self) -> str:
        args = [repr(a) for a in self.module_args] + [f"{k}={v!r}" for k, v in self.module_kwargs.items()]
        return f"{self.typename.__name__}({', '.join(args)})"


class TiedLayerSpec(LayerSpec):
    def __init__(self, key: str, typename, *module_args, forward_fn=None, tied_weight_attr=("weight",),
                 **module_kwargs):
        super().__init__(typename, *module_args, **module_kwargs)
        self.key = key
        self.forward_fn = forward_fn
        self.tied_weight_attr = [tied_weight_attr] if isinstance(tied_weight_attr, str) else list(tied_weight_attr)


def trainable_count(layer) -> int:
    """Trainable parameters of a layer, a spec counted by building it on the meta device (no
    memory, so counting for the partition never materialises the model)."""
    if isinstance(layer, LayerSpec):
        try:
            with torch.device("meta"):
                layer = layer.build()
        except Exception:  # a constructor that cannot run on meta: build it for real, briefly
            layer = layer.build()
    if isinstance(layer, nn.Module):
        return sum(p.numel() for p in layer.parameters() if p.requires_grad)
    return 0


def forward_of(layer):
    """The callable whose signature says which keyword arguments a layer takes."""
    if isinstance(layer, TiedLayerSpec) and layer.forward_fn is not None:
        return layer.forward_fn
    if isinstance(layer, LayerSpec):
        return layer.typename.forward
    if isinstance(layer, nn.Module):
        return type(layer).forward
    return layer


def declared_kwargs(layer, names: tuple[str, ...]) -> tuple[str, ...]:
    """Those of `names` that the layer's forward names explicitly."""
    return forward_accepts(forward_of(layer)).named(names)
