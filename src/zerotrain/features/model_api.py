"""What kind of model this is, and what its forward accepts: one answer for the features, the
pipeline and the trainer.

    is_hf_model(model)        a transformers model (PreTrainedModel in its classes)
    forward_accepts(model)    the keywords its forward names, whether it takes **kwargs

HF forwards take `**kwargs` and ignore keys they do not know, so "takes **kwargs" means "takes
anything" only for a model that is not an HF one; each caller decides what that means for it.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass


def is_hf_model(module) -> bool:
    """A transformers model (a subclass of PreTrainedModel, LoRA-adapted or not: the adapter is
    applied in place), recognised without importing transformers."""
    return any(cls.__name__ == "PreTrainedModel" for cls in type(module).__mro__)


@dataclass(frozen=True)
class ForwardAccepts:
    """The keywords a forward takes. `readable` is False when no signature could be read (a
    builtin or C function): then `names` is empty and `any_keyword` False, and the caller says
    what an unknown forward gets."""

    names: frozenset[str]
    any_keyword: bool
    readable: bool = True

    def named(self, keys) -> tuple[str, ...]:
        """Those of `keys` the forward names as parameters, in the order given."""
        return tuple(k for k in keys if k in self.names)


def forward_accepts(target) -> ForwardAccepts:
    """For a module its `forward`, for anything else the callable itself (an unbound method or
    a function; a leading `self` is a name like any other)."""
    fn = target.forward if hasattr(target, "forward") and not inspect.isfunction(target) else target
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return ForwardAccepts(frozenset(), False, readable=False)
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return ForwardAccepts(frozenset(p.name for p in params if p.kind not in variadic),
                          any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params))
