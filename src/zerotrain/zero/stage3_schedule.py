"""Stage 3's schedule: which modules' parameters are whole when, driven by module hooks.

    forward pre-hook    gather the module's parameters, then prefetch what the last pass ran
                        next (within stage3_prefetch_bucket_size and stage3_max_live_parameters)
    forward post-hook   release them, unless small enough to persist, needed again by backward
                        within stage3_max_reuse_distance, or we are in backward (activation-
                        checkpoint recomputation runs forwards again)
    output grad hook    gather them again just before the module's own backward

The gradient side (copy into a bucket, free, release the parameter) is stage3.py's. Every
rank runs the same modules in the same order, so the collectives line up across ranks.
"""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_leaves

from .stage3_gather import Gatherer

# what a module may return besides tensors and still be seen through for gradient hooks
_TRANSPARENT = (torch.Tensor, int, float, bool, str, type(None))


class GatherSchedule:
    """Module hooks that gather and release stage-3 parameters around each use."""

    def __init__(self, module: torch.nn.Module, where: dict[int, tuple[int, int]], gatherer: Gatherer, *,
                 prefetch_numel: int | None, reuse_numel: int | None, max_live_numel: int):
        self.where = where  # id(param) -> (group, index)
        self.gatherer = gatherer
        self.max_live_numel = max_live_numel
        self.in_backward = False
        self._kept_after_forward: list[bool] = []  # per position of the forward trace
        self.owners: list[dict[int, list[int]]] = []  # per module that owns params: {group: [index]}
        self.owner_params: list[list] = []
        self._traces = {False: [], True: []}  # last pass's module order (forward, backward)
        self._now = {False: [], True: []}
        self._hooks = self._register_module_hooks(module)
        self.owner_numel = [sum(gatherer.numel_of[id(p)] for p in ps) for ps in self.owner_params]
        if prefetch_numel is None:
            # about two typical modules ahead; sized by the largest (often the embedding) the
            # window held several layers gathered at once
            sizes = sorted(self.owner_numel)
            prefetch_numel = 2 * sizes[len(sizes) // 2] if sizes else 0
        self.prefetch_numel = prefetch_numel
        # what prefetch would bring straight back is not released
        self.reuse_numel = prefetch_numel if reuse_numel is None else reuse_numel

    def begin_forward(self) -> None:
        self._new_pass(backward=False)

    def begin_backward(self) -> None:
        self.in_backward = True
        self._new_pass(backward=True)

    def end_backward(self) -> None:
        self.in_backward = False

    def close(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks = []

    def _register_module_hooks(self, module: torch.nn.Module) -> list:
        handles = []
        for m in module.modules():
            own, params = {}, []
            for p in m.parameters(recurse=False):
                if id(p) in self.where:
                    gi, i = self.where[id(p)]
                    own.setdefault(gi, []).append(i)
                    params.append(p)
            if not own:
                continue
            k = len(self.owners)
            self.owners.append(own)
            self.owner_params.append(params)
            handles += [
                m.register_forward_pre_hook(lambda *_, k=k: self._before(k, backward=False)),
                m.register_forward_hook(lambda _m, _args, output, k=k: self._after_forward(k, output)),
            ]
            # No release after a module's backward: autograd accumulates a parameter's gradient
            # after that, and accumulating needs the parameter whole; _on_grad releases it.
        return handles

    def _new_pass(self, backward: bool) -> None:
        if self._now[backward]:
            self._traces[backward] = self._now[backward]
            self._plan_reuse()
        self._now[backward] = []

    def _plan_reuse(self) -> None:
        """stage3_max_reuse_distance: a module whose next use (in backward) comes within that
        many gathered elements stays whole after its forward. The last modules of forward are
        the first of backward; releasing them only to gather them again at once (the tied
        embedding of a GPT) freed and reallocated them at the activation peak."""
        forward, backward = self._traces[False], self._traces[True]
        first_use, gathered = {}, 0
        for k in backward:
            first_use.setdefault(k, gathered)
            gathered += self.owner_numel[k]
        keep, gathered = [], 0
        for k in reversed(forward):
            keep.append(k in first_use and gathered + first_use[k] <= self.reuse_numel)
            gathered += self.owner_numel[k]
        self._kept_after_forward = keep[::-1]

    def _before(self, k: int, backward: bool) -> None:
        """Gather module k, then prefetch the modules the last pass ran next, within the
        prefetch bucket and the live-parameter budget. Every rank runs the same modules in
        the same order, so the prefetch collectives line up across ranks."""
        position = len(self._now[backward])
        self._now[backward].append(k)
        self.gatherer.gather(self.owners[k])
        trace = self._traces[backward]
        if not self.prefetch_numel or position >= len(trace) or trace[position] != k:
            return
        window = 0  # elements of the modules ahead, whether already whole, arriving or not
        for following in trace[position + 1 :]:
            window += self.owner_numel[following]
            if window > self.prefetch_numel:
                break
            need = self.gatherer.missing_numel(self.owners[following])
            if need and self.gatherer.live_numel + need > self.max_live_numel:
                break
            if need:
                self.gatherer.start(self.owners[following])

    def _after_forward(self, k: int, output) -> None:
        """Release module k, and arrange for backward to gather it again: a hook on the
        gradient of each output that needs one, which arrives just before the module's own
        backward. (A full backward pre-hook would do the same, but its extra autograd node
        around every module kept about 50 MB more heap at the peak of a 20M-parameter GPT.)"""
        leaves = tree_leaves(output) if torch.is_grad_enabled() else []  # no backward to come
        if any(not isinstance(x, _TRANSPARENT) for x in leaves):
            return  # an output we cannot look into: stay whole until backward ends
        outputs = [x for x in leaves if isinstance(x, torch.Tensor) and x.requires_grad]
        if outputs:
            fired = []  # once per call, whatever the number of outputs

            def gather_for_backward(grad, k=k, fired=fired):
                if not fired:
                    fired.append(True)
                    self._before(k, backward=True)

            for x in outputs:
                x.register_hook(gather_for_backward)
        if self.in_backward:  # activation-checkpoint recomputation keeps them for backward
            return
        position = len(self._now[False]) - 1
        trace = self._traces[False]
        if (position < len(self._kept_after_forward) and trace[position] == k and self._kept_after_forward[position]
                and self.gatherer.live_numel <= self.max_live_numel):  # within stage3_max_live_parameters
            return
        self.gatherer.release(self.owner_params[k])
