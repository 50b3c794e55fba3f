"""What a ZeRO stage must do: the contract the engine, its checkpoints and the tools rely on.

A stage decides what is sharded, how gradients travel and where the fp32 masters live. The
engine only sequences it, once per micro-batch and once per optimizer step:

    engine(batch)          begin_forward()
    engine.backward(loss)  begin_backward(boundary) -> autograd (buckets reduce) -> end_backward()
    engine.step()          grad_norm(scale) -> prepare_step(coef) -> optimizer.step() -> after_step()
                           (or zero_grad() when the step is skipped); at stage 3 with the
                           masters in NVMe, optimizer.step() only starts the step, which runs
                           behind the next forward (offload/step_behind.py: `behind`)

`ZeroStrategy` is both the contract (every member below, with what it promises) and the
home of what the stages share: the param groups in layout order, the fp32 masters, the
gradient averaging plan, the optimizer offload placement, the global norm. Each stage
(stage0.py .. stage3/stage.py) subclasses it directly and fills in the abstract members.
"""

from __future__ import annotations

import logging
import math
import weakref
from abc import ABC, abstractmethod
from typing import ClassVar

import torch

from ..comm import Comm
from ..config.zero import DEFAULT_BUCKET_NUMEL
from .averaging import Averaging, attach_and_scale, plan_averaging
from .offload.blockwise_optimizer import BlockwiseOptimizer, MasterGroup
from .offload.placement import OptimizerOffload
from .offload.states import EngineStates
from .offload.step_behind import StepBehind, settled

log = logging.getLogger("zerotrain")



class ZeroStrategy(ABC):
    """One ZeRO stage over the model's trainable parameters."""

    #: the ZeRO stage number, as the config and checkpoints name it
    stage: ClassVar[int]
    #: True when each rank steps only its shard of the masters (so each rank saves its own
    #: optimizer file and the gradient norm is summed across ranks)
    shards_optimizer: ClassVar[bool] = True

    def __init__(self, param_groups: list[dict], registration: dict[int, int], comm: Comm,
                 compute_dtype: torch.dtype, device, *, bucket_numel: int = DEFAULT_BUCKET_NUMEL,
                 prescale_gradients: bool = False, gradient_predivide_factor: float = 1.0,
                 gradient_mean: bool = True, overlap_comm: bool = True, offload_optimizer=None, offload_block_numel: int = 1 << 22,
                 accumulation_dtype: torch.dtype | None = None, optimizer_state_bytes: int = 8):
        self.comm = comm
        self.compute_dtype = compute_dtype
        self.device = torch.device(device)
        self.mixed = compute_dtype != torch.float32
        self.bucket_numel = bucket_numel
        self.overlap_comm = overlap_comm
        #: where masters and optimizer state live (device, host, nvme)
        self.offload = OptimizerOffload(offload_optimizer, comm.rank, device, offload_block_numel,
                                        local_ranks=comm.state.local_world_size or comm.world_size)
        #: where the division by the world size happens (averaging.py)
        self.averaging: Averaging = plan_averaging(comm.world_size, prescale_gradients,
                                                   float(gradient_predivide_factor), compute_dtype, gradient_mean)
        # fp32 masters are separate tensors when the model computes in half precision or when
        # they live elsewhere (offloaded); otherwise the step writes the model's own buffer
        self.separate_masters = self.offload.separate_from(self.device, self.mixed)
        #: the dtype gradients accumulate in across micro-steps (data_types.grad_accum_dtype):
        #: the compute dtype unless accumulation (gradient_accumulation_steps > 1) asks for fp32
        self.accumulation_dtype = accumulation_dtype or compute_dtype
        self.optimizer_state_bytes = optimizer_state_bytes  # per element, for the NVMe space check
        self._space_checked = False  # stage 3 checks NVMe room before its parameter files exist
        #: each group's parameters in layout order: reverse registration, so the ones whose
        #: gradients arrive first in backward sit together and a bucket is a plain slice
        self.ordered = [sorted(g["params"], key=lambda p: -registration[id(p)]) for g in param_groups]
        self.hyper = [{k: v for k, v in g.items() if k != "params"} for g in param_groups]
        self.backward_pos = {id(p): -registration[id(p)] for ps in self.ordered for p in ps}
        #: groups [0, trained_groups) are stepped; stage 3 may add a frozen one after them
        self.trained_groups = len(self.ordered)
        self.claim([p for ps in self.ordered for p in ps])
        #: the layout of each group (flat.FlatGroup or stage3/gather.ShardedGroup), set by the stage
        self.groups: list = []
        #: fp32 masters the torch optimizer steps directly (empty when they are separate: then
        #: the BlockwiseOptimizer keeps them, `stepper`)
        self.masters: list[torch.nn.Parameter] = []
        #: the reduced gradients this rank steps, one per trained group (still loss-scaled)
        self.master_grads: list[torch.Tensor] = []
        self._models: list[tuple] = []  # per trained group: (numel, read, write) of the model's values
        self.stepper: BlockwiseOptimizer | None = None
        #: the optimizer step still running behind the forward (stage 3 with NVMe; idle elsewhere)
        self.behind = StepBehind()

    # ---- shared construction --------------------------------------------------------------
    def _make_masters(self, models: list, grads: list[torch.Tensor] | None = None) -> None:
        """Masters over this rank's part of each trained group's model values: `models[i]` is
        a tensor (a whole buffer or a shard) or a stage-3 ParamStore. When the masters are the
        model's own (fp32, nothing offloaded) each becomes a Parameter over the tensor, with
        gradient `grads[i]` (a view of a gradient buffer) or fresh zeros; when separate they
        are made with the optimizer (build_optimizer), and the gradients the step reads are
        `grads[i]` or fresh shards in the accumulation dtype where the optimizer steps."""
        numels = [model.numel() if torch.is_tensor(model) else model.numel for model in models]
        if self.separate_masters and not self._space_checked:
            self.offload.check_space(sum(numels), self.optimizer_state_bytes)
        for i, model in enumerate(models):
            numel = numels[i]
            grad = grads[i] if grads is not None else None
            if self.separate_masters:
                if grad is None:
                    grad = self.offload.new_grad(numel, self.accumulation_dtype)
                self._models.append((numel, *_accessors(model)))
            else:
                master = torch.nn.Parameter(model)
                master.grad = grad if grad is not None else torch.zeros_like(model)
                self.masters.append(master)
                grad = master.grad
            self.master_grads.append(grad)

    # ---- optimizer -------------------------------------------------------------------------
    def optimizer_groups(self) -> list[dict]:
        """The param groups the optimizer steps: each group's hyperparameters over its master."""
        return [dict(h, params=[m]) for h, m in zip(self.hyper, self.masters)]

    def build_optimizer(self, build):
        """`build(param_groups) -> torch optimizer` over the masters; separate masters are
        made here and stepped block by block (offload/blockwise_optimizer.py)."""
        if not self.separate_masters:
            return build(self.optimizer_groups())
        groups = [MasterGroup(numel, grad, read, write)
                  for (numel, read, write), grad in zip(self._models, self.master_grads)]
        self.stepper = self.offload.build_stepper(build, self.hyper[: self.trained_groups], groups)
        return self.stepper

    # ---- forward / backward ----------------------------------------------------------------
    def begin_forward(self) -> None:
        """Before each forward (stage 3 starts its gather trace); nothing at stages 0-2."""

    def begin_backward(self, boundary: bool) -> None:
        """Before each backward; `boundary` says it ends an accumulation window. Stages that
        keep whole gradients reduce only then (and not at all alone); 2-3 override."""
        self.at_boundary = boundary
        if boundary and not self.comm.alone:
            self.reducer.arm()
        self.offload.before_backward(boundary)

    def end_backward(self) -> None:
        """After each backward: every gradient bucket launched and landed."""
        self.reducer.finish()

    # ---- step ------------------------------------------------------------------------------
    @abstractmethod
    def reduced_grads(self) -> list[torch.Tensor]:
        """The averaged gradients this rank's optimizer step reads, still loss-scaled."""

    def take_assigned_grads(self) -> None:
        """Gradients that user code assigned to p.grad after backward (gradient surgery, custom
        clipping): stages that keep whole gradients use them; stages 2-3, which reduced and
        freed the gradients during backward, refuse them in one line rather than drop them."""
        refuse_assigned_grads(self, self.groups[: self.trained_groups])

    @settled
    def grad_squares(self) -> torch.Tensor:
        """The sum of squares of the averaged gradients (still loss-scaled) over the data-parallel
        group: float64, shape (1,). Each rank sums the squares of what it steps in float64
        (`sum_of_squares`) and the ranks' sums are added in float64, so the number is the same,
        to float64 rounding, however the stage and the world size cut the gradients."""
        self.take_assigned_grads()
        squares = sum_of_squares(self.reduced_grads())
        if self.shards_optimizer:
            self.comm.all_reduce(squares)
        return squares

    def grad_norm(self, loss_scale: float = 1.0) -> float:
        """Global L2 norm of the averaged, unscaled gradients; inf/nan on any rank's overflow
        reaches every rank (the same decision everywhere). The first call of a step."""
        return math.sqrt(self.grad_squares().item()) / loss_scale

    def prepare_step(self, coef: float) -> None:
        """The step reads the reduced gradients multiplied by coef (unscale x clip): in one
        foreach kernel for masters of the model's own, block by block for separate ones."""
        if self.stepper is not None:
            self.stepper.coef = coef
        else:
            attach_and_scale(self.masters, self.master_grads, coef)

    @abstractmethod
    def after_step(self) -> None:
        """After optimizer.step(): the model sees the updated weights; gradients are cleared."""

    @abstractmethod
    def zero_grad(self) -> None:
        """Clear the gradients (a skipped step, or after a step)."""

    # ---- accounting --------------------------------------------------------------------------
    @abstractmethod
    def memory_tensors(self) -> list[tuple[str, str, torch.Tensor | int]]:
        """(category, place, tensor) for everything this strategy holds; aliases are removed
        by whoever sums them (engine.memory_breakdown counts each storage once). A byte count
        may stand in for a tensor whose storage is not its own (stage 3's whole params)."""

    def master_tensors(self) -> list[tuple[str, str, torch.Tensor]]:
        """The masters and the gradients the step reads, where the offload placement keeps them."""
        place = self.offload.place
        masters = list(self.masters)
        if self.stepper is not None:
            masters += [m for m in self.stepper.masters if m is not None]
        return [("grads", place, g) for g in self.master_grads] + [("master_params", place, m) for m in masters]

    @property
    def optimizer_state_place(self) -> str:
        """Where the optimizer's resident state tensors live: "device" or "host"."""
        return self.offload.place

    def nvme_bytes(self) -> dict[str, int]:
        """Bytes per category that live in NVMe swap files."""
        return self.offload.nvme_bytes()

    # ---- whole access and checkpoints --------------------------------------------------------
    def full_state_dict(self, module: torch.nn.Module) -> dict:
        """The module state dict with every parameter whole (a collective where sharded)."""
        return module.state_dict()

    def state_entries(self, module: torch.nn.Module) -> list:
        """(name, shape, dtype, fetch) per tensor of the full state dict, in order; here every
        tensor is whole already (stage 3 gathers each in its fetch)."""
        return [(k, tuple(v.shape), v.dtype, lambda v=v: v) for k, v in module.state_dict().items()]

    def release_gathered(self) -> None:
        """Release every parameter gathered whole, the persistent ones too (stage 3; the next
        forward gathers what it needs). Stages 0-2 keep parameters whole: nothing to do."""

    def state_mover(self, optimizer, module: torch.nn.Module, zero) -> EngineStates:
        """What engine.offload_states / reload_states act through (offload/states.py): this
        stage's buffers, the optimizer's state and the module's views of them."""
        return EngineStates(self, optimizer, module, zero)

    def sharded_param_ids(self) -> set[int]:
        """Parameters that exist only as per-rank shards (saved with the strategy state)."""
        return set()

    def layout(self, names: dict[int, str]) -> dict:
        """Where each parameter sits in the saved pieces (zero/layout.py), so `zerotrain
        consolidate` and resharding can put whole weights back together from any stage."""
        return {"scheme": self.groups[0].scheme, "stage": self.stage, "world_size": self.comm.world_size,
                "groups": [g.describe([names[id(p)] for p in g.params], g.shapes) for g in self.groups]}

    def state_dict(self) -> dict:
        """This rank's share of what the module state dict does not hold (separate fp32 masters)."""
        if self.stepper is None:
            return {}
        return {"masters": [self.stepper.master_state(gi) for gi in range(self.trained_groups)]}

    def load_masters(self, state: dict) -> bool:
        """Separate masters from a checkpoint's strategy state (or, when it has none, from the
        module weights just loaded), written through to the model; False when there are none."""
        if self.stepper is None:
            return False
        self.stepper.load_masters(state.get("masters"), to_model=True)
        return True

    @abstractmethod
    def load_state_dict(self, state: dict) -> None:
        """Call after the module's weights were loaded; masters come from `state` if saved."""

    def close(self) -> None:
        """Remove hooks and swap files (engine.destroy)."""
        self.reducer.remove()
        self.offload.close()

    def detach_model(self) -> None:
        """Give the module back for another engine: hooks removed, every parameter whole in
        storage the new engine may take over (stage 3 gathers: every rank calls it). This
        engine cannot train afterwards."""
        self.close()
        self.detached = True
        for ps in self.ordered:
            for p in ps:
                if _OWNED.get(id(p)) is self:
                    del _OWNED[id(p)]

    def claim(self, params) -> None:
        """Record that this strategy now owns `params` (an earlier engine over them is detached first)."""
        detach_previous_owners(params, self)
        for p in params:
            _OWNED[id(p)] = self

    def check_attached(self) -> None:
        """Raise if a later initialize on the same model took the parameters over."""
        if getattr(self, "detached", False):
            raise RuntimeError("this engine was replaced by a later zerotrain.initialize on the same model; "
                               "train with the engine that call returned")


def _accessors(model):
    """(read(lo, hi), write(lo, values)) over a tensor, or a stage-3 ParamStore (which has both)."""
    if not torch.is_tensor(model):
        return model.read, model.write

    def write(lo: int, values: torch.Tensor) -> None:
        model[lo : lo + values.numel()].copy_(values)

    return (lambda lo, hi: model[lo:hi]), write


# id(parameter) -> the live strategy that owns it
_OWNED: "weakref.WeakValueDictionary[int, ZeroStrategy]" = weakref.WeakValueDictionary()


def detach_previous_owners(params, keep=None) -> None:
    """zerotrain.initialize called again on the same model (a new engine for evaluation, say):
    the earlier engine gives the parameters back whole (its hooks and partitioning undone)."""
    previous = {id(s): s for p in params if (s := _OWNED.get(id(p))) is not None and s is not keep}
    for strategy in previous.values():
        log.warning("zerotrain.initialize: this model already belongs to an engine (ZeRO stage %d); that engine "
                    "hands its parameters over to the new one and cannot train any more", strategy.stage)
        strategy.detach_model()


def refuse_assigned_grads(strategy: ZeroStrategy, groups) -> None:
    """Stages 2-3 move each gradient into its bucket during backward and free it, so a
    gradient that user code assigns to p.grad afterwards would be silently dropped: refuse."""
    for fg in groups:
        for p in fg.params:
            if p.grad is not None:
                raise RuntimeError(
                    f"ZeRO stage {strategy.stage}: a gradient was assigned to a parameter's .grad after backward "
                    f"(shape {tuple(p.grad.shape)}); this stage has already reduced and sharded the gradients, so "
                    "the step would ignore it. Change gradients before they are reduced (a hook: "
                    "p.register_hook(fn)), or use ZeRO stage 0 or 1, whose step reads p.grad")


def sum_of_squares(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The sum of the squares of every element of `tensors`, in float64 (shape (1,), on their
    device): what the gradient norm and the clip factor are made of.

    In float64 the square of an fp32, bf16 or fp16 value is exact and a sum of millions of
    them is within about 1e-13 of the exact sum, whichever way the elements are split or
    ordered, far below fp32's 6e-8. So the norm does not depend on the stage or the world size
    (which cut a flat buffer into different shards) nor on the order of the additions. An fp32
    sum is not so: torch's fp32 norm on the CPU is 1.2e-4 off on the 810k gradients of
    benchmarks/parity.py's MLP whole and 5.5e-5 off in two shards, a difference clipping
    carries into every update. The cast goes a block at a time into one scratch block, so no
    float64 copy of a shard is ever whole."""
    device = tensors[0].device if tensors else torch.device("cpu")
    total = torch.zeros(1, dtype=torch.float64, device=device)
    for t in tensors:
        flat = t.reshape(-1)
        block = _SQUARES_BLOCK_CPU if t.device.type == "cpu" else _SQUARES_BLOCK
        scratch = torch.empty(min(block, flat.numel()), dtype=torch.float64, device=t.device)
        for piece in flat.split(block):
            wide = scratch[: piece.numel()]
            wide.copy_(piece)
            total.add_(torch.dot(wide, wide).to(device))
    return total


# elements cast to float64 at a time, into one scratch block: 512 KiB stays in a CPU core's
# cache; on an accelerator a larger one (128 MiB) keeps the launches few
_SQUARES_BLOCK_CPU = 1 << 16
_SQUARES_BLOCK = 1 << 24
