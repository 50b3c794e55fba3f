"""Moving a ZeRO engine's states off the device between steps, and back (DeepSpeed's
`engine.offload_states()` / `engine.reload_states()`): an RL loop parks the trained model's
optimizer state and masters in host memory while a generation engine uses the GPU.

    engine.offload_states(include=[OffloadStateTypeEnum.optim_states], device=OffloadDeviceEnum.cpu)
    ...                                  the device holds none of those states now
    engine.reload_states()               every moved state back where it was; train on

The five state types (DeepSpeed's names) and what they are here:

    optim_states            the optimizer's state tensors (Adam's moments)
    hp_params               the fp32 masters the optimizer steps
    lp_params               the model's values in the compute dtype: the flat buffers the
                            parameters view (stages 1-2), the parameter shards (stage 3)
    lp_grads                the gradients: the flat gradient buffers, the reduced shards
    contiguous_grad_buffer  gradient buckets kept between steps: zerotrain frees each bucket
                            once it is reduced, so none is held and there is nothing to move

Tensors move by storage: each storage that holds a chosen state is copied to the target once
and every tensor of the engine over it (a parameter's view into a flat buffer, a master that
is the model's own fp32 shard, a gradient view) is pointed at the same place in the copy. So
states that share memory move together (fp32 masters at stages 1-2 are views of the model's
buffer: offloading hp_params takes lp_params along) and every alias stays an alias.

As in DeepSpeed 0.19.8: ZeRO stages 1-3 (stage 0 has no ZeRO optimizer), an engine with an
optimizer, no parameter offload (offload_param), device "cpu" ("none" does nothing and says
so, "nvme" is refused); with the optimizer offloaded (offload_optimizer) hp_params and
optim_states, and at stage 3 lp_grads, live in host memory already and are left out. With a
GPU the host copies are pinned when pin_memory is true. On a machine without one the states
are in host memory from the start: nothing moves, and the call says so once.
"""

from __future__ import annotations

import enum
import logging
import types
from collections.abc import Iterable

import torch

from ...errors import ConfigError
from ...parallel.tensor.dtensor import local
from .host_memory import release_freed_memory

log = logging.getLogger("zerotrain")


class OffloadDeviceEnum(str, enum.Enum):
    """Where offload goes (DeepSpeed's spellings, which the config's offload blocks read)."""

    none = "none"
    cpu = "cpu"
    nvme = "nvme"


class OffloadStateTypeEnum(str, enum.Enum):
    """The engine states offload_states can move (the module docstring says what each is)."""

    optim_states = "optim_states"
    hp_params = "hp_params"
    lp_params = "lp_params"
    lp_grads = "lp_grads"
    contiguous_grad_buffer = "contiguous_grad_buffer"


KINDS = tuple(OffloadStateTypeEnum)


def _tensors(roots: Iterable) -> list[torch.Tensor]:
    """Every tensor reachable from `roots` through containers, zerotrain's and torch
    optimizers' attributes and closures; a module contributes its parameters, their gradients
    and its buffers. Each once, zero-byte storages (released stage-3 parameters) left out."""
    found, seen, todo = [], set(), list(roots)
    while todo:
        obj = todo.pop()
        if obj is None or id(obj) in seen or isinstance(obj, (str, bytes, int, float, bool)):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            if local(obj) is not obj:  # a DTensor
                raise ConfigError(f"offload_states: the engine holds a {type(obj).__name__} (tensor parallelism); "
                                  "moving its states is not built: train without tensor_parallel to use it")
            if obj.untyped_storage().nbytes():
                found.append(obj)
            todo.append(obj.grad)
        elif isinstance(obj, torch.nn.Module):
            todo.extend(obj.parameters())
            todo.extend(obj.buffers())
        elif isinstance(obj, dict):
            todo.extend(obj.keys())
            todo.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            todo.extend(obj)
        elif isinstance(obj, types.FunctionType):
            todo.extend(c.cell_contents for c in obj.__closure__ or () if _filled(c))
        elif isinstance(obj, types.MethodType):
            todo.append(obj.__self__)
        elif isinstance(obj, torch.optim.Optimizer) or type(obj).__module__.startswith("zerotrain."):
            todo.extend(vars(obj).values() if hasattr(obj, "__dict__") else ())
    return found


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # a closure variable not yet assigned
        return False
    return True


def state_seeds(strategy, optimizer, kind: OffloadStateTypeEnum) -> list:
    """What holds state `kind` for this strategy and optimizer (walked by _tensors)."""
    if kind is OffloadStateTypeEnum.optim_states:
        return [optimizer.state]
    if kind is OffloadStateTypeEnum.hp_params:
        return [strategy.masters, strategy.stepper.masters if strategy.stepper is not None else None]
    if kind is OffloadStateTypeEnum.lp_params:
        return [[p.data for ps in strategy.ordered for p in ps], [s.tensor for s in getattr(strategy, "stores", ())]]
    if kind is OffloadStateTypeEnum.lp_grads:
        return [strategy.master_grads, [p.grad for ps in strategy.ordered for p in ps],
                getattr(getattr(strategy, "flat", None), "accumulators", None)]
    return [[b.data for b in strategy.reducer.buckets]]  # contiguous_grad_buffer: None between steps


# the states each engine call reads or writes (a pipeline's train_batch runs all three)
NEEDS = {"forward": {OffloadStateTypeEnum.lp_params},
         "backward": {OffloadStateTypeEnum.lp_params, OffloadStateTypeEnum.lp_grads},
         "step": {OffloadStateTypeEnum.lp_params, OffloadStateTypeEnum.lp_grads, OffloadStateTypeEnum.hp_params,
                  OffloadStateTypeEnum.optim_states}}
NEEDS |= {"train_batch": NEEDS["step"], "eval_batch": NEEDS["forward"]}


def _key(t: torch.Tensor) -> tuple:
    s = t.untyped_storage()
    return s.device, s.data_ptr()


def relocate(holders: list[torch.Tensor], storages: dict[tuple, torch.UntypedStorage], device: torch.device,
             pin: bool, non_blocking: bool = False) -> dict[tuple, torch.UntypedStorage]:
    """Copy each storage in `storages` (key -> storage) to `device` (pinned host memory with
    `pin`) and point every tensor in `holders` over it at the same offset, size and stride in
    the copy. Returns key -> the new storage, under the new keys."""
    moved, by_old = {}, {}
    for key, old in storages.items():
        new = torch.empty(old.nbytes(), dtype=torch.uint8, device=device, pin_memory=pin).untyped_storage()
        new.copy_(old, non_blocking=non_blocking)
        by_old[key] = new
        moved[(new.device, new.data_ptr())] = new
    for t in holders:
        new = by_old.get(_key(t))
        if new is not None:
            t.data = torch.empty(0, dtype=t.dtype, device=device).set_(new, t.storage_offset(), t.size(), t.stride())
    return moved


class EngineStates:
    """One engine's offload record: which state types are away and the storages that moved,
    each with the device it came from. `zero` is the config's zero_optimization block."""

    def __init__(self, strategy, optimizer, module: torch.nn.Module, zero):
        self.strategy, self.optimizer, self.module, self.zero = strategy, optimizer, module, zero
        self.offloaded: set[OffloadStateTypeEnum] = set()
        self.away: dict[tuple, tuple[torch.UntypedStorage, torch.device]] = {}
        self._said_nothing_moves = self._said_kept = False

    def _check(self, what: str) -> None:
        if self.strategy.stage == 0:
            raise ConfigError(f"{what}: needs ZeRO stage 1, 2 or 3 (zero_optimization.stage is 0), whose optimizer "
                              "states, masters and gradient shards it moves")
        if self.optimizer is None:
            raise ConfigError(f"{what}: the engine has no optimizer (config or initialize(optimizer=...)); "
                              "there are no optimizer states to move")
        param = self.zero.offload_param
        if param is not None and param.device != "none" and self.strategy.stage == 3:
            raise ConfigError(f"{what}: not built with parameter offload (zero_optimization.offload_param.device "
                              f"{param.device!r}): the parameters already live off the device")

    def _holders(self) -> list[torch.Tensor]:
        """Every tensor that may be a view of a moved storage."""
        return _tensors([self.strategy, self.optimizer, self.module])

    def kinds(self, include) -> list[OffloadStateTypeEnum]:
        """`include` as state types (all when None), less those the optimizer offload keeps
        in host memory already (`kept_in_host`)."""
        if include is None:
            chosen = list(KINDS)
        else:
            names = [getattr(k, "value", k) for k in include]
            unknown = [n for n in names if n not in OffloadStateTypeEnum.__members__]
            if unknown:
                raise ConfigError(f"offload_states: include has {unknown[0]!r}, not a state type; use "
                                  f"OffloadStateTypeEnum members: {', '.join(k.value for k in KINDS)}")
            chosen = [OffloadStateTypeEnum(n) for n in dict.fromkeys(names)]
        return [k for k in chosen if k not in self.kept_in_host()]

    def kept_in_host(self) -> set[OffloadStateTypeEnum]:
        """What offload_optimizer keeps in host memory: masters and optimizer state, at stage 3
        the gradient shards the host step reads too."""
        if not self.strategy.offload.enabled:
            return set()
        kept = {OffloadStateTypeEnum.hp_params, OffloadStateTypeEnum.optim_states}
        return kept | ({OffloadStateTypeEnum.lp_grads} if self.strategy.stage == 3 else set())

    def offload(self, include=None, device=OffloadDeviceEnum.cpu, pin_memory: bool = True,
                non_blocking: bool = False, *, copy_host: bool = False) -> None:
        """`copy_host` copies storages that are in host memory already too (what a GPU
        machine does; tests exercise the move with it on a machine without one)."""
        self._check("offload_states")
        device = OffloadDeviceEnum(getattr(device, "value", device))
        if device is OffloadDeviceEnum.none:
            log.warning("offload_states: device 'none' moves nothing; pass device=OffloadDeviceEnum.cpu")
            return
        if device is OffloadDeviceEnum.nvme:
            raise ConfigError("offload_states: device 'nvme' is not built (as in DeepSpeed); use "
                              "OffloadDeviceEnum.cpu")
        self.strategy.behind.join()  # an NVMe step running behind the forward owns the masters
        self.strategy.release_gathered()  # whole stage-3 parameters are a cache, not a state
        kinds = [k for k in self.kinds(include) if k not in self.offloaded]
        asked = set(KINDS) if include is None else {OffloadStateTypeEnum(getattr(k, "value", k)) for k in include}
        if asked & self.kept_in_host() and not self._said_kept:
            self._said_kept = True
            log.warning("offload_states: %s stay where zero_optimization.offload_optimizer keeps them, in host memory",
                        ", ".join(k.value for k in KINDS if k in asked & self.kept_in_host()))
        pin = bool(pin_memory and torch.cuda.is_available())
        host = torch.device("cpu")
        holders = self._holders()
        seeds = _tensors(s for k in kinds for s in state_seeds(self.strategy, self.optimizer, k))
        storages = {_key(t): t.untyped_storage() for t in seeds
                    if copy_host or t.device != host or (pin and not t.untyped_storage().is_pinned())}
        storages = {k: s for k, s in storages.items() if k not in self.away}
        homes = {k: s.device for k, s in storages.items()}
        moved = relocate(holders, storages, host, pin, non_blocking)
        for (key, home), (new_key, new) in zip(homes.items(), moved.items()):
            self.away[new_key] = (new, home)
        self.offloaded.update(kinds)
        if not storages and not self._said_nothing_moves:
            self._said_nothing_moves = True
            log.warning("offload_states: the %s are in host memory already (the engine computes on %s%s); nothing "
                        "moves", ", ".join(k.value for k in kinds) or "states", self.strategy.device,
                        "" if torch.cuda.is_available() else ", no GPU to pin for")
        if not non_blocking and torch.cuda.is_available():
            torch.cuda.synchronize()
        # no gc.collect(): an old storage is freed when its last tensor is re-pointed (reference
        # counting), and a full collection costs seconds in a process that imported torch's compiler
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        release_freed_memory()  # the host's side of empty_cache: freed heap pages back to the system

    def blocked_calls(self) -> dict[str, str]:
        """{engine call: the line it raises} for the calls that need an offloaded state; the
        same with or without a GPU (on the CPU nothing moved, but the same script on a GPU
        would compute with tensors on two devices, or fail in torch's words)."""
        shared = {OffloadStateTypeEnum.hp_params, OffloadStateTypeEnum.lp_params}
        out = {}
        for call, needs in NEEDS.items():
            if needs & shared and not self.strategy.separate_masters:
                needs = needs | shared  # the masters are the model's own storage: one moves with the other
            away = [k.value for k in KINDS if k in needs & self.offloaded]
            if away:
                out[call] = (f"engine.{call}(): the {', '.join(away)} are offloaded (engine.offload_states()); "
                             "call engine.reload_states() first")
        return out

    def reload(self, non_blocking: bool = False) -> None:
        self._check("reload_states")
        if self.away:
            holders = self._holders()
            for home in {h for _, h in self.away.values()}:
                group = {k: s for k, (s, h) in self.away.items() if h == home}
                relocate(holders, group, home, pin=False, non_blocking=non_blocking)
            if non_blocking and torch.cuda.is_available():
                torch.cuda.synchronize()
        self.away.clear()
        self.offloaded.clear()
