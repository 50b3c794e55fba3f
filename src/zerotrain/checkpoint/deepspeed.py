"""DeepSpeed's checkpoint folders, read without DeepSpeed and without running pickled code.

    <dir>/latest                                         the newest tag
    <dir>/global_stepN/mp_rank_00_model_states.pt        stages 0-2: whole weights (compute dtype),
                                                         counters, lr_scheduler, client_state;
                                                         stage 0: the optimizer too
    <dir>/global_stepN/zero_pp_rank_R_mp_rank_00_model_states.pt   stage 3: the same per rank,
                                                         with empty weights
    <dir>/global_stepN/[bf16_]zero_pp_rank_R_mp_rank_00_optim_states.pt   ZeRO 1-3: rank R's
                                                         fp32 masters and optimizer state

Where each parameter sits in rank R's pieces (DeepSpeed 0.19):

    ZeRO 1-2  per param group, the parameters end to end (with the padding each one's
              "param_alignment_paddings" says), cut into equal partitions; rank R holds partition R
              ("single_partition_of_fp32_groups"), and "param_slice_mappings" names each fragment
    ZeRO 3    every parameter cut into ceil(numel / ranks) chunks; rank R holds chunk R of each,
              end to end in "param_shapes" order, over its sub-groups ("fp32_flat_groups")
    ZeRO 0    whole tensors per parameter: torch's optimizer state by parameter index, fp32
              masters in "fp32_groups" (bf16/fp16) or the module weights (fp32)

These become a `reshard.SavedState`, so a DeepSpeed checkpoint loads into any stage and world
size as a zerotrain one does. DeepSpeed's files pickle a few of its own classes (its loss
scaler, the ZeRO stage enum, fragment addresses, argparse's Namespace); `_Unpickler` maps those
to plain stand-ins and refuses every other class by name.
"""

from __future__ import annotations

import argparse
import math
import pickle
import re
import types
from pathlib import Path

import torch

from ..errors import CheckpointError
from ..zero.layout import Span
from .reshard import SavedState

READ_VERSIONS = ("0.19.",)
MODEL_FILE = "mp_rank_00_model_states.pt"
_ZERO3_MODEL = re.compile(r"zero_pp_rank_(\d+)_mp_rank_00_model_states\.pt")
LAYER = re.compile(r"layer_(\d+)(-model_\d+)?-model_states\.pt")  # a pipeline's layer (model_NN: a tensor rank)


def model_file(mp: int) -> str:
    """Model-parallel rank mp's model states (stages 0-2); a pipeline's stage s is mp rank s."""
    return f"mp_rank_{mp:02d}_model_states.pt"


def _optim_pattern(mp: int) -> re.Pattern:
    return re.compile(rf"(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_{mp:02d}_optim_states\.pt")
# what DeepSpeed itself keeps in model_states; anything else there is the user's client_state
_OWN_KEYS = {"module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes", "shared_params",
             "frozen_param_fragments", "lr_scheduler", "data_sampler", "random_ltd", "sparse_tensor_module_names",
             "skipped_steps", "global_steps", "global_samples", "dp_world_size", "mp_world_size", "ds_config",
             "ds_version", "checkpoint_parallel_dimensions", "universal_checkpoint_info", "moe_expert_count"}


# ---- the restricted unpickler -----------------------------------------------------------------
class _Record:
    """A stand-in for a DeepSpeed object: its attributes, nothing else."""

    def __init__(self, *args, **kwargs):
        self.args = args
        self.__dict__.update(kwargs)

    def __setstate__(self, state):
        if isinstance(state, tuple) and len(state) == 2:  # (dict, slots)
            state = {**(state[0] or {}), **(state[1] or {})}
        if isinstance(state, dict):
            self.__dict__.update(state)


def _stand_in(name: str) -> type:
    return type(name, (_Record,), {"__module__": "zerotrain.checkpoint.deepspeed"})


def _int_enum(value, *_):
    return int(value)


_STAND_INS = {
    ("deepspeed.runtime.fp16.loss_scaler", "LossScaler"): _stand_in("LossScaler"),
    ("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler"): _stand_in("DynamicLossScaler"),
    ("deepspeed.runtime.zero.config", "ZeroStageEnum"): _int_enum,
    ("deepspeed.utils.tensor_fragment", "fragment_address"): _stand_in("fragment_address"),
    ("argparse", "Namespace"): argparse.Namespace,
}
_TORCH = {("torch._utils", "_rebuild_tensor_v2"), ("torch._utils", "_rebuild_parameter"),
          ("torch._utils", "_rebuild_parameter_with_state"), ("torch._tensor", "_rebuild_from_type_v2"),
          ("torch", "Tensor"), ("torch", "Size"), ("torch.nn.parameter", "Parameter"),
          ("collections", "OrderedDict"), ("torch", "device")}
_DTYPES = {str(t).split(".")[1] for t in (torch.float32, torch.float16, torch.bfloat16, torch.float64,
                                          torch.int64, torch.int32, torch.uint8, torch.bool, torch.int8)}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) in _STAND_INS:
            return _STAND_INS[module, name]
        if (module, name) in _TORCH or (module == "torch" and name in _DTYPES):
            return getattr(__import__(module, fromlist=[name]), name)
        raise pickle.UnpicklingError(f"refused to unpickle {module}.{name}: not one of the plain DeepSpeed "
                                     "and torch classes a DeepSpeed checkpoint holds")


_pickle_module = types.SimpleNamespace(Unpickler=_Unpickler, load=pickle.load, __name__="zerotrain_ds_pickle")


def load_ds_file(path: Path):
    """One DeepSpeed file, through `_Unpickler`; a refused class or damage is one line."""
    try:
        return torch.load(path, map_location="cpu", weights_only=False, pickle_module=_pickle_module, mmap=True)
    except pickle.UnpicklingError as err:
        raise CheckpointError(f"{path.parent.name}/{path.name}: {err}") from None
    except Exception as err:  # torch raises many types for damaged archives
        raise CheckpointError(f"{path.parent.name}/{path.name}: cannot be read ({type(err).__name__}: "
                              f"{str(err).splitlines()[0] if str(err) else ''}); the file is truncated or "
                              "corrupted") from None


# ---- finding the folder ------------------------------------------------------------------------
def _is_ds_folder(path: Path) -> bool:
    return path.is_dir() and not (path / "manifest.json").exists() and (
        (path / MODEL_FILE).is_file() or any(_ZERO3_MODEL.fullmatch(f.name) for f in path.iterdir()))


def deepspeed_folder(load_dir, tag=None) -> Path | None:
    """The DeepSpeed tag folder `load_dir` (with `latest` or `tag`) names, or None when it is
    not a DeepSpeed checkpoint."""
    load_dir = Path(load_dir)
    if tag is None and _is_ds_folder(load_dir):
        return load_dir
    if tag is None and (load_dir / "latest").is_file():
        tag = (load_dir / "latest").read_text(errors="replace").strip()
    if tag is None or "/" in str(tag) or str(tag) in ("", ".", ".."):
        return None
    folder = load_dir / str(tag)
    return folder if _is_ds_folder(folder) else None


# ---- reading -----------------------------------------------------------------------------------
def check_version(path: Path, states: dict, tensor_ranks_read: bool = False) -> None:
    """tensor_ranks_read: the caller reads each tensor rank's files (deepspeed_autotp.py)."""
    version = str(states.get("ds_version", "unknown"))
    if not version.startswith(READ_VERSIONS):
        raise CheckpointError(f"{path}: written by DeepSpeed {version}; zerotrain reads the checkpoint format of "
                              f"DeepSpeed {', '.join(v + 'x' for v in READ_VERSIONS)}. Convert it with that "
                              "DeepSpeed's zero_to_fp32.py and load the weights with --init_from")
    layers = [m for f in path.iterdir() if (m := LAYER.fullmatch(f.name))]
    tensor = not layers and int(states.get("mp_world_size", 1) or 1) != 1 and not tensor_ranks_read
    if any(m.group(2) for m in layers) or tensor:
        raise CheckpointError(f"{path}: a DeepSpeed checkpoint with tensor parallelism zerotrain does not read "
                              "(layer_NN-model_01 files, or mp_rank_01 files without DeepSpeed's record of the cuts, "
                              "universal_checkpoint_info); zerotrain reads data-parallel (ZeRO 0-3), pipeline and "
                              "AutoTP ones")


def _rank_files(path: Path, pattern: re.Pattern, ranks: int, what: str) -> list[Path]:
    found = {int(m.group(1)): f for f in path.iterdir() if (m := pattern.fullmatch(f.name))}
    missing = [r for r in range(ranks) if r not in found]
    if missing:
        raise CheckpointError(f"{path}: the {what} file of data-parallel rank {missing[0]} is missing ({ranks} ranks "
                              f"wrote this DeepSpeed checkpoint, {len(missing)} file(s) absent); copy the whole folder")
    return [found[r] for r in range(ranks)]


class DeepSpeedState(SavedState):
    """A DeepSpeed checkpoint's per-element state, read by (parameter name, element range)."""

    def __init__(self, path: Path, names: list[str], mp: int = 0, module: dict | None = None,
                 tensor_rank: bool = False):
        """mp: the model-parallel rank (a pipeline stage, or with `tensor_rank` an AutoTP tensor
        rank) whose files to read; module: its weights by name where model_states holds none
        (a pipeline's layer files)."""
        self.path = path
        self.names = names  # this model's trainable parameters, in order (DeepSpeed's stage-0 indices)
        zero3 = sorted(f.name for f in path.iterdir() if _ZERO3_MODEL.fullmatch(f.name))
        self.states = load_ds_file(path / (model_file(mp) if (path / model_file(mp)).is_file() or not zero3
                                           else zero3[0]))
        check_version(path, self.states, tensor_rank)
        self.ranks = int(self.states.get("dp_world_size") or 1)
        self.module = module if module is not None else {
            k: v for k, v in (self.states.get("module") or {}).items() if torch.is_tensor(v) and v.numel()}
        shared = self.states.get("shared_params") or {}
        self.aliases = {}
        for alias, first in shared.items():
            self.aliases.setdefault(first, []).append(alias)
        pattern = _optim_pattern(mp)
        optim = [f for f in path.iterdir() if pattern.fullmatch(f.name)]
        self.where: dict[str, tuple[int, int, list]] = {}
        if not optim:
            self.stage, self.files = 0, []
            self._stage0()
            return
        self.files = [load_ds_file(f)["optimizer_state_dict"] for f in _rank_files(path, pattern, self.ranks, "optimizer")]
        self.stage = int(self.files[0].get("zero_stage", 0))
        if self.stage == 3:
            _rank_files(path, _ZERO3_MODEL, self.ranks, "model states")
            self._stage3()
        else:
            self._stage12()

    # -- layouts
    def _stage12(self) -> None:
        shapes = self.states.get("param_shapes") or []
        for gi, group in enumerate(shapes):
            paddings = (self.files[0].get("param_alignment_paddings") or [None] * len(shapes))[gi]
            partition = self.files[0]["single_partition_of_fp32_groups"][gi].numel()
            offset = 0
            for i, (name, shape) in enumerate(group.items()):
                numel = math.prod(shape)
                spans = []
                for pos in range(self.ranks):
                    lo, hi = max(offset, pos * partition), min(offset + numel, (pos + 1) * partition)
                    if lo < hi:
                        spans.append((pos, Span(i, lo - offset, lo - pos * partition, hi - lo)))
                self.where[name] = (gi, i, spans)
                offset += numel + (paddings[i] if paddings else 0)
        self._masters = lambda pos, gi: self.files[pos]["single_partition_of_fp32_groups"][gi]
        self._optimizer = lambda pos: self.files[pos]["base_optimizer_state"]

    def _stage3(self) -> None:
        shapes = [(n, s) for group in self.states.get("param_shapes") or [] for n, s in group.items()]
        sizes = [t.numel() for t in self.files[0]["fp32_flat_groups"]]
        starts = [sum(sizes[:k]) for k in range(len(sizes))]
        offset = 0
        for i, (name, shape) in enumerate(shapes):
            numel = math.prod(shape)
            chunk = -(-numel // self.ranks)
            k = max(j for j, s in enumerate(starts) if s <= offset)  # the sub-group holding it
            spans = [(pos, Span(i, pos * chunk, offset - starts[k], min(chunk, numel - pos * chunk)))
                     for pos in range(self.ranks) if numel - pos * chunk > 0]
            self.where[name] = (k, i, spans)
            offset += chunk
        self._masters = lambda pos, k: self.files[pos]["fp32_flat_groups"][k]
        self._optimizer = lambda pos: self.files[pos]["optimizer_state_dict"]

    def _stage0(self) -> None:
        optimizer = self.states.get("optimizer")
        self.files = [optimizer]
        inner = optimizer.get("optimizer_state_dict", optimizer) if isinstance(optimizer, dict) else None
        for i, name in enumerate(self.names):
            self.where[name] = (i, 0, [(0, Span(0, 0, 0, self._numel(name)))])
        masters = optimizer.get("fp32_groups") if isinstance(optimizer, dict) else None
        flat = optimizer.get("fp32_groups_flat") if isinstance(optimizer, dict) else None
        if masters is not None:
            per_param = [t for group in masters for t in group]
            self._masters = lambda pos, i: per_param[i].reshape(-1)
        elif flat is not None:
            offsets = [0]
            for name in self.names:
                offsets.append(offsets[-1] + self._numel(name))
            whole = torch.cat([t.reshape(-1) for t in flat]) if len(flat) > 1 else flat[0].reshape(-1)
            self._masters = lambda pos, i: whole[offsets[i] : offsets[i + 1]]
        else:
            self._masters = None
        self._optimizer = lambda pos: inner

    def _numel(self, name: str) -> int:
        t = self.module.get(name)
        if t is None:
            raise CheckpointError(f"{self.path}: the DeepSpeed checkpoint has no weights of {name}; it is of another "
                                  "model")
        return t.numel()

    # -- SavedState's questions
    def _strategy(self, pos: int, kind: str, gi: int):
        return self._masters(pos, gi) if kind == "masters" and self._masters is not None else None

    def _optimizer_piece(self, pos: int, gi: int, key: str):
        entry = (self._optimizer(pos) or {}).get("state", {}).get(gi)
        value = entry.get(key) if entry is not None else None
        return value.reshape(-1) if torch.is_tensor(value) else value

    def optimizer_groups(self):
        optimizer = self._optimizer(0)
        return optimizer["param_groups"] if optimizer else None

    def optimizer_entry(self, gi: int, names: list[str]):
        """The scalars of DeepSpeed's state of the group (ZeRO 1-3) or first parameter (ZeRO 0)
        holding this run's group gi; the per-element keys are read by range."""
        optimizer = self._optimizer(0)
        if not optimizer or not names or names[0] not in self.where:
            return None
        return optimizer["state"].get(self.where[names[0]][0])

    def per_element(self, gi: int, key: str, value) -> bool:
        return torch.is_tensor(value) and value.dim() > 0

    # -- the engine's counters
    def counters(self) -> dict:
        s = self.states
        return {k: int(s.get(k) or 0) for k in ("global_steps", "global_samples", "skipped_steps")}

    def lr_scheduler(self):
        return self.states.get("lr_scheduler")

    def loss_scaler(self) -> dict | None:
        """DeepSpeed's loss scaler as zerotrain's state dict (dynamic fp16 only; static scales are config)."""
        source = self.files[0] if self.files and isinstance(self.files[0], dict) else {}
        scaler = source.get("loss_scaler")
        if scaler is not None and getattr(scaler, "dynamic", False):
            return {"kind": "dynamic", "cur_scale": float(scaler.cur_scale), "cur_iter": int(scaler.cur_iter),
                    "last_overflow_iter": int(scaler.last_overflow_iter),
                    "cur_hysteresis": int(getattr(scaler, "cur_hysteresis", 1)), "overflows_at_floor": 0}
        if self.stage == 0 and source.get("dynamic_loss_scale"):
            return {"kind": "dynamic", "cur_scale": float(source["cur_scale"]), "cur_iter": int(source["cur_iter"]),
                    "last_overflow_iter": int(source.get("last_overflow_iter", -1)), "cur_hysteresis": 1,
                    "overflows_at_floor": 0}
        return None

    def client_state(self) -> dict:
        return {k: v for k, v in self.states.items() if k not in _OWN_KEYS}

    def feature_states(self) -> dict:
        """zerotrain's feature counters: DeepSpeed's own checkpoints hold none."""
        return {}

    def describe(self) -> str:
        return (f"DeepSpeed {self.states.get('ds_version')} checkpoint (ZeRO stage {self.stage}, {self.ranks} "
                "data-parallel rank(s))")

    def check_model(self, layout: dict) -> None:
        """Every trainable parameter of this run is in the checkpoint, with its shape."""
        shapes = {n: tuple(s) for group in self.states.get("param_shapes") or [] for n, s in group.items()}
        if not shapes:
            shapes = {n: tuple(t.shape) for n, t in self.module.items()}
        want = {n: tuple(s) for g in layout["groups"] for n, s in zip(g["names"], g["shapes"])}
        missing = sorted(n for n in want if n not in shapes)
        differ = sorted(n for n in want if n in shapes and shapes[n] != want[n])
        extra = sorted(n for n in shapes if n not in want)
        if missing or differ or (extra and self.stage > 0):
            parts = [f"{n} {list(shapes[n])} there, {list(want[n])} here" for n in differ[:4]]
            parts += [f"{n} only in this model" for n in missing[:4]]
            parts += [f"{n} only in the checkpoint" for n in extra[:4]]
            raise CheckpointError(f"{self.path} is a DeepSpeed checkpoint of another model: {'; '.join(parts)}; "
                                  "load it into the model that wrote it")
