"""DeepSpeed's optimizer classes as torch's optimizers, for scripts that build their own and
pass it to initialize(optimizer=...).

`FusedAdam` and `DeepSpeedCPUAdam` return the torch optimizer the config's Adam block builds
(factory.py): AdamW with `adam_w_mode` (decoupled weight decay), Adam with L2 decay
without, the fused or foreach kernel where torch has one, and zerotrain's UncorrectedAdam for
`bias_correction=False`. The object is torch's, so `isinstance(opt, FusedAdam)` is False.
"""

from __future__ import annotations

from .factory import _build_builtin


def _groups(params) -> list[dict]:
    items = list(params)
    if items and isinstance(items[0], dict):
        return [dict(g) for g in items]
    return [{"params": items}]


def FusedAdam(params, lr: float = 1e-3, bias_correction: bool = True, betas=(0.9, 0.999), eps: float = 1e-8,
              adam_w_mode: bool = True, weight_decay: float = 0.0, amsgrad: bool = False, set_grad_none: bool = True):
    """DeepSpeed's FusedAdam: torch's AdamW (or Adam when `adam_w_mode=False`); `set_grad_none`
    has no effect (torch's zero_grad sets gradients to None by default)."""
    settings = {"lr": lr, "bias_correction": bias_correction, "betas": tuple(betas), "eps": eps,
                "adam_w_mode": adam_w_mode, "weight_decay": weight_decay, "amsgrad": amsgrad}
    return _build_builtin("adam", settings, _groups(params))


def DeepSpeedCPUAdam(model_params, lr: float = 1e-3, bias_correction: bool = True, betas=(0.9, 0.999),
                     eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: bool = False, adamw_mode: bool = True,
                     fp32_optimizer_states: bool = True):
    """DeepSpeed's CPU Adam: the same torch optimizer as FusedAdam; it steps where the parameters
    are (on the host when the config's offload_optimizer puts them there). Its state is kept in
    the parameters' dtype, fp32 under the engine (`fp32_optimizer_states` has no effect)."""
    return FusedAdam(model_params, lr=lr, bias_correction=bias_correction, betas=betas, eps=eps,
                     adam_w_mode=adamw_mode, weight_decay=weight_decay, amsgrad=amsgrad)
