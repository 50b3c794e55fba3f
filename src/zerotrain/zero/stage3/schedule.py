"""Stage 3's schedule: which modules' parameters are whole when, driven by module hooks.

    forward pre-hook    gather the module's parameters, then prefetch what the last pass ran
                        next (within stage3_prefetch_bucket_size and stage3_max_live_parameters)
    forward post-hook   release them, unless small enough to persist, needed again by backward
                        within stage3_max_reuse_distance, or we are in backward (activation-
                        checkpoint recomputation runs forwards again)
    output grad hook    gather them again just before the module's own backward

A module may also use a parameter it does not own (a parent reading a child's weight, as
nn.MultiheadAttention does with out_proj; a functional call; a tied head in the root's
forward). PartitionedParameter (partitioned_param.py) reports that first use to
`make_whole`, which gathers the parameter and, from then on, counts it as that module's
own ("external", DeepSpeed's word; `register_external_parameter` declares one ahead). A use
outside every hooked module but inside a pass keeps it whole until its gradient arrives.

The gradient side (copy into a bucket, free, release the parameter) is stage.py's. Every
rank runs the same modules in the same order, so the collectives line up across ranks.
"""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_leaves

from ...errors import ModelInterfaceError
from .partitioned_param import is_grad_assignment
from .gather import Gatherer

EXTERNAL_ATTR = "_zt_external_params"  # declared before initialize: module -> [param]

READ_AHEAD = 8  # prefetch windows of NVMe parameter shards handed to the kernel's read-ahead

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
        self.paused = False  # unwrap_model_for_generation: everything is whole, hooks stand aside
        self.names = {}  # id(param) -> its first name in the model, for error lines
        self.module_names = {}  # id(module) -> its name
        for name, m in module.named_modules(remove_duplicate=False):
            self.module_names.setdefault(id(m), name or type(module).__name__)
        for name, q in module.named_parameters(remove_duplicate=False):
            self.names.setdefault(id(q), name)
        self._stack: list[int] = []  # hooked modules whose forward is running
        self._forward_depth = 0  # >0 while the root module's forward runs
        self._module_index: dict[int, int] = {}  # id(module) -> k
        self._kept_after_forward: list[bool] = []  # per position of the forward trace
        self.owners: list[dict[int, list[int]]] = []  # per module that owns params: {group: [index]}
        self.owner_params: list[list] = []
        self._traces = {False: [], True: []}  # last pass's module order (forward, backward)
        self._now = {False: [], True: []}
        self._advised = {False: 0, True: 0}  # trace positions handed to read-ahead this pass
        self._hooks = self._register_module_hooks(module)
        self._hooks += [module.register_forward_pre_hook(self._enter_root),
                        module.register_forward_hook(self._leave_root, always_call=True)]
        self.owner_numel = [sum(gatherer.numel_of[id(p)] for p in ps) for ps in self.owner_params]
        for m in module.modules():
            for q in getattr(m, EXTERNAL_ATTR, ()):
                self.add_external(m, q)
        if prefetch_numel is None:
            # about two typical modules ahead; sized by the largest (often the embedding) the
            # window held several layers gathered at once
            sizes = sorted(self.owner_numel)
            prefetch_numel = 2 * sizes[len(sizes) // 2] if sizes else 0
        self.prefetch_numel = prefetch_numel
        # what prefetch would bring straight back is not released
        self.reuse_numel = prefetch_numel if reuse_numel is None else reuse_numel

    def begin_forward(self) -> None:
        self._stack = []  # a forward that raised left its modules on it
        self._new_pass(backward=False)

    def begin_backward(self) -> None:
        self.in_backward = True
        self._new_pass(backward=True)

    def end_backward(self) -> None:
        self.in_backward = False
        self._stack = []

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False

    def close(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks = []

    def _register_module_hooks(self, module: torch.nn.Module) -> list:
        handles = []
        for m in module.modules():
            params = [p for p in m.parameters(recurse=False) if id(p) in self.where]
            if params:
                handles += self._hook(m, params)
        return handles

    def _hook(self, m: torch.nn.Module, params: list) -> list:
        k = len(self.owners)
        own = {}
        for p in params:
            gi, i = self.where[id(p)]
            own.setdefault(gi, []).append(i)
        self.owners.append(own)
        self.owner_params.append(list(params))
        self._module_index[id(m)] = k
        # No release after a module's backward: autograd accumulates a parameter's gradient
        # after that, and accumulating needs the parameter whole; the gradient hook releases it.
        return [m.register_forward_pre_hook(lambda *_, k=k: self._before(k, backward=False)),
                m.register_forward_hook(lambda _m, _args, output, k=k: self._after_forward(k, output))]

    # ---- parameters used outside their own module (partitioned_param.TouchHandler) ------------
    def _enter_root(self, *_):
        self._forward_depth += 1

    def _leave_root(self, *_):
        self._forward_depth -= 1

    @property
    def in_pass(self) -> bool:
        return self._forward_depth > 0 or bool(self._stack) or self.in_backward

    def is_empty(self, p: torch.nn.Parameter) -> bool:
        return id(p) not in self.gatherer.whole

    def make_whole(self, params: list, func) -> None:
        """First use of a parameter outside its own module's hooks, inside a pass: gather it
        now and, when a hooked module is running, gather it with that module from now on."""
        if not self.in_pass:
            return
        if self._stack:
            for p in params:
                self._attach(self._stack[-1], p)
        self.gatherer.gather(self._own_of(params))

    def add_external(self, module: torch.nn.Module, p: torch.nn.Parameter) -> None:
        """register_external_parameter: `module`'s forward uses `p`, which another module owns."""
        if id(p) not in self.where:
            raise ModelInterfaceError(f"register_external_parameter: the parameter given for "
                                      f"{self.module_names.get(id(module), type(module).__name__)} is not "
                                      "one the ZeRO-3 engine manages (not a parameter of the model)")
        k = self._module_index.get(id(module))
        if k is None:
            self._hooks += self._hook(module, [p])
            self.owner_numel.append(self.gatherer.numel_of[id(p)])
        else:
            self._attach(k, p)

    def _attach(self, k: int, p) -> None:
        if any(q is p for q in self.owner_params[k]):
            return
        gi, i = self.where[id(p)]
        self.owners[k].setdefault(gi, []).append(i)
        self.owner_params[k].append(p)
        self.owner_numel[k] += self.gatherer.numel_of[id(p)]

    def _own_of(self, params) -> dict[int, list[int]]:
        own: dict[int, list[int]] = {}
        for p in params:
            gi, i = self.where[id(p)]
            own.setdefault(gi, []).append(i)
        return own

    def explain_failure(self, p, func, error: Exception) -> Exception:
        name = self.names.get(id(p), f"a parameter of shape {tuple(p.zt_shape)}")
        if is_grad_assignment(func):
            return RuntimeError(
                f"ZeRO stage 3: a gradient was assigned to {name}.grad after backward; this stage has already "
                "reduced and sharded the gradients, so the step would ignore it. Change gradients before they "
                "are reduced (a hook: p.register_hook(fn)), or use ZeRO stage 0 or 1, whose step reads p.grad")
        what = getattr(func, "__name__", str(func))
        return ModelInterfaceError(
            f"ZeRO-3: {name} is partitioned across ranks and empty outside a forward or backward pass, so {what} "
            f"cannot use it here ({type(error).__name__}: {' '.join(str(error).split())[:100]}); use it inside a "
            "module's forward, or wrap the code in `with zerotrain.zero.GatheredParameters(params):`")

    def _new_pass(self, backward: bool) -> None:
        self._advised[backward] = 0
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
        if self.paused:
            return
        position = len(self._now[backward])
        self._now[backward].append(k)
        if not backward and not self.in_backward:  # recomputation may stop early, hooks unrun
            self._stack.append(k)
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
        if self.gatherer.reads_files:
            self._read_ahead(trace, position, backward)

    def _read_ahead(self, trace: list[int], position: int, backward: bool) -> None:
        """Parameters in NVMe: the modules within READ_AHEAD prefetch windows ahead are handed
        to the kernel's read-ahead, each once per pass, so their shards are read from the disk
        while this module computes (the gathers then find them in the page cache)."""
        start = max(position + 1, self._advised[backward])
        window = sum(self.owner_numel[k] for k in trace[position + 1 : start])
        end = start
        for following in trace[start:]:
            window += self.owner_numel[following]
            if window > READ_AHEAD * self.prefetch_numel:
                break
            self.gatherer.advise(self.owners[following])
            end += 1
        self._advised[backward] = end

    def _after_forward(self, k: int, output) -> None:
        """Release module k, and arrange for backward to gather it again: a hook on the
        gradient of each output that needs one, which arrives just before the module's own
        backward. (A full backward pre-hook would do the same, but its extra autograd node
        around every module kept about 50 MB more heap at the peak of a 20M-parameter GPT.)"""
        if self.paused:
            return
        if self._stack and self._stack[-1] == k:
            self._stack.pop()
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
