"""Adam and AdamW with `bias_correction: false`, as DeepSpeed's fused and CPU Adam do it
(spec 9.1). torch's Adam always divides the moments by (1 - beta^t), so this is its own
small optimizer: one pass of foreach kernels over all tensors of a group per step (the
engine hands it few, large flat tensors), no Python loop per element or per tensor kind.

    m = b1 m + (1 - b1) g            v = b2 v + (1 - b2) g^2       (g += wd p first: Adam, L2)
    p = p - lr m / (sqrt(v) + eps)                                 (p *= 1 - lr wd first: AdamW)

amsgrad keeps v_max = max(v_max, v) and uses it in place of v. The state is named as torch's
Adam names it (step, exp_avg, exp_avg_sq, max_exp_avg_sq), so checkpoints and resharding
treat it alike.
"""

from __future__ import annotations

import torch


class UncorrectedAdam(torch.optim.Optimizer):
    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, amsgrad: bool = False, decoupled: bool = True):
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                        decoupled=decoupled)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            grads = [p.grad for p in params]
            states = [self._state(p, group["amsgrad"]) for p in params]
            for s in states:
                s["step"] += 1
            m = [s["exp_avg"] for s in states]
            v = [s["exp_avg_sq"] for s in states]
            lr, wd, eps = float(group["lr"]), float(group["weight_decay"]), float(group["eps"])
            b1, b2 = group["betas"]
            if wd and group["decoupled"]:
                torch._foreach_mul_(params, 1.0 - lr * wd)
            elif wd:
                grads = torch._foreach_add(grads, params, alpha=wd)
            torch._foreach_mul_(m, b1)
            torch._foreach_add_(m, grads, alpha=1.0 - b1)
            torch._foreach_mul_(v, b2)
            torch._foreach_addcmul_(v, grads, grads, value=1.0 - b2)
            if group["amsgrad"]:
                v_max = [s["max_exp_avg_sq"] for s in states]
                torch._foreach_maximum_(v_max, v)
                v = v_max
            denom = torch._foreach_sqrt(v)
            torch._foreach_add_(denom, eps)
            torch._foreach_addcdiv_(params, m, denom, value=-lr)
        return loss

    def _state(self, p: torch.Tensor, amsgrad: bool) -> dict:
        state = self.state[p]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        if amsgrad and "max_exp_avg_sq" not in state:
            state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return state
