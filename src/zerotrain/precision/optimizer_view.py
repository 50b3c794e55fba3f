"""The loss-scaling state where DeepSpeed scripts read it: on the optimizer.

DeepSpeed's initialize returns its own fp16 wrapper, and scripts (and HF's and Lightning's
DeepSpeed glue) read `optimizer.cur_scale`, `.loss_scale`, `.dynamic_loss_scale`,
`.scale_window`, or, in newer releases, `optimizer.loss_scale_config.cur_scale` and
`.cur_iter`. zerotrain returns the torch optimizer itself, so `optimizer is client_optimizer`,
`isinstance(optimizer, torch.optim.AdamW)` and every torch API keep holding. With fp16 (as in
DeepSpeed, where only the fp16 wrappers have them) the readings are added by moving the
instance to a subclass of its own class, same name and module, that only adds read-only
properties: stepping, state_dict, pickling, hooks and LR schedulers are untouched.
"""

from __future__ import annotations

import torch

_VIEWS: dict[type, type] = {}


class LossScaleReadout:
    """Read-only loss-scale properties under DeepSpeed's names."""

    _zt_loss_scaler = None

    @property
    def loss_scale_config(self):
        """The scaler itself: cur_scale, cur_iter, scale_window, dynamic_loss_scale."""
        return self._zt_loss_scaler

    @property
    def cur_scale(self) -> float:
        return self._zt_loss_scaler.cur_scale

    @property
    def loss_scale(self) -> float:
        return self._zt_loss_scaler.loss_scale

    @property
    def dynamic_loss_scale(self) -> bool:
        return self._zt_loss_scaler.dynamic_loss_scale

    @property
    def scale_window(self) -> int | None:
        return self._zt_loss_scaler.scale_window

    def __reduce_ex__(self, protocol):
        """Pickled and deep-copied as the torch class: the readings belong to the engine."""
        return _rebuild, (type(self).__bases__[1], self.__getstate__())


def _rebuild(cls: type, state: dict) -> torch.optim.Optimizer:
    optimizer = cls.__new__(cls)
    optimizer.__setstate__(state)
    return optimizer


def expose_loss_scale(optimizer: torch.optim.Optimizer, scaler) -> torch.optim.Optimizer:
    """Give `optimizer` the properties above, reading `scaler` (the engine's fp16 loss scaler)."""
    if not isinstance(optimizer, LossScaleReadout):
        cls = type(optimizer)
        view = _VIEWS.get(cls)
        if view is None:
            view = _VIEWS[cls] = type(cls.__name__, (LossScaleReadout, cls),
                                      {"__module__": cls.__module__, "__qualname__": cls.__qualname__,
                                       "__doc__": cls.__doc__})
        optimizer.__class__ = view
    optimizer._zt_loss_scaler = scaler
    return optimizer
