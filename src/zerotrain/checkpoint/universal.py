"""DeepSpeed's universal checkpoint folders (what its `ds_to_universal` writes), read without
DeepSpeed, into any stage and data-parallel size.

    <dir>/latest_universal                     the tag of the newest universal folder
    <dir>/<tag>/mp_rank_00_model_states.pt     counters, lr_scheduler, client_state (DeepSpeed
                                               at ZeRO 0-2 reads this one; ZeRO 3 reads
    <dir>/<tag>/zero_pp_rank_0_mp_rank_00_model_states.pt   this one)
    <dir>/<tag>/zero/optimizer_state.pt        hyperparameters (param_groups), loss scaler,
                                               ZeRO stage, DeepSpeed version
    <dir>/<tag>/zero/<param name>/fp32.pt      the parameter's whole fp32 master, and each
                                  exp_avg.pt   per-element optimizer state, whole: a dict
                                  exp_avg_sq.pt  {"param": tensor, "cat_dim": 0} (ZeRO 1-2
                                  step.pt        conversions) or the bare flat tensor (ZeRO 3)
                                               step.pt: the optimizer's step (ZeRO 1-2 only;
                                               ZeRO 3 keeps it in optimizer_state.pt)

Every parameter is whole in its own files, so no data-parallel size or stage is written into
the states: a rank reads the ranges of each parameter its new piece holds (memory-mapped, one
parameter file open at a time) and nothing else. `checkpoint.load_universal` decides which
pointer file names the folder to load when no tag is given: `latest_universal` with it, `latest`
without it (as DeepSpeed does); a folder named explicitly is read by what it holds.

zerotrain's own conversions (`zerotrain convert --to deepspeed-universal`, universal_out.py)
also keep, under a "zerotrain" key DeepSpeed passes through as client state, what DeepSpeed has
no place for (feature counters, the micro-step count, the loss scaler's state), so a round trip
zerotrain -> universal -> zerotrain loses nothing but the RNG states and the data position.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from ..errors import CheckpointError
from .deepspeed import MODEL_FILE, READ_VERSIONS, DeepSpeedState, load_ds_file

LATEST_UNIVERSAL = "latest_universal"
ZERO_DIR = "zero"
OPTIMIZER_FILE = "optimizer_state.pt"
MASTERS = "fp32"
STEP = "step"
OURS = "zerotrain"  # zerotrain's extras in the model states file (client state to DeepSpeed)
ZERO3_MODEL_FILE = "zero_pp_rank_0_mp_rank_00_model_states.pt"
_ZERO3_MODEL = re.compile(r"zero_pp_rank_(\d+)_mp_rank_00_model_states\.pt")


def is_universal(folder: Path) -> bool:
    return folder.is_dir() and (folder / ZERO_DIR).is_dir() and not (folder / "manifest.json").exists()


def _read_pointer(file: Path) -> str:
    tag = file.read_text(errors="replace").strip()
    if not tag or "/" in tag or tag in (".", ".."):
        raise CheckpointError(f"{file} does not name a folder ({tag!r}); the file is corrupted: pass the tag")
    return tag


def universal_folder(load_dir, tag, load_universal: bool) -> Path | None:
    """The universal folder to load, or None when `load_dir`/`tag` name another kind of
    checkpoint. With `load_universal` anything else is an error (DeepSpeed's meaning of the key)."""
    load_dir = Path(load_dir)
    if tag is None and is_universal(load_dir):
        return load_dir
    if tag is None:
        pointer = load_dir / (LATEST_UNIVERSAL if load_universal else "latest")
        if pointer.is_file() and not load_universal:  # zerotrain's and DeepSpeed's own: checked where they are read
            tag = pointer.read_text(errors="replace").strip()
            if not tag or "/" in tag or tag in (".", ".."):
                return None
        elif pointer.is_file():
            tag = _read_pointer(pointer)
        elif load_universal:
            raise CheckpointError(f"checkpoint.load_universal is set and {pointer} does not exist: pass the folder "
                                  "`ds_to_universal` or `zerotrain convert --to deepspeed-universal` wrote, or its tag")
        elif (load_dir / LATEST_UNIVERSAL).is_file():
            name = _read_pointer(load_dir / LATEST_UNIVERSAL)
            raise CheckpointError(f"{load_dir} holds a universal checkpoint ({LATEST_UNIVERSAL} names {name}) and no "
                                  f"'latest': set checkpoint.load_universal true, or pass tag={name!r}")
        else:
            return None
    folder = load_dir / str(tag)
    if is_universal(folder):
        return folder
    if load_universal:
        raise CheckpointError(f"checkpoint.load_universal is set and {folder} is not a universal checkpoint (no "
                              f"{ZERO_DIR}/ folder of per-parameter states); drop load_universal to load it (zerotrain "
                              "reads its own and DeepSpeed's checkpoints on any layout without it)")
    return None


def _model_file(path: Path) -> Path:
    if (path / MODEL_FILE).is_file():
        return path / MODEL_FILE
    zero3 = sorted((int(m.group(1)), f) for f in path.iterdir() if (m := _ZERO3_MODEL.fullmatch(f.name)))
    if not zero3:
        raise CheckpointError(f"{path}: a universal checkpoint without {MODEL_FILE} or {ZERO3_MODEL_FILE} (the step "
                              "counters and LR schedule); copy them from the checkpoint it was converted from")
    return zero3[0][1]


class UniversalState(DeepSpeedState):
    """A universal folder's states, read by (parameter name, element range)."""

    def __init__(self, path: Path, names: list[str]):
        self.path, self.names = path, names
        self.states = load_ds_file(_model_file(path))
        version = str(self.states.get("ds_version", "unknown"))
        if not version.startswith(READ_VERSIONS):
            raise CheckpointError(f"{path}: a universal checkpoint of DeepSpeed {version}; zerotrain reads the "
                                  f"format of DeepSpeed {', '.join(v + 'x' for v in READ_VERSIONS)}: convert it with "
                                  "that DeepSpeed's ds_to_universal.py")
        optimizer = path / ZERO_DIR / OPTIMIZER_FILE
        if not optimizer.is_file():
            raise CheckpointError(f"{path}: the universal checkpoint has no {ZERO_DIR}/{OPTIMIZER_FILE} (the "
                                  "optimizer's hyperparameters and step); the conversion did not finish: run it again")
        self.optim = load_ds_file(optimizer)
        self.stage = int(self.optim.get("zero_stage", 0) or 0)
        self.files = [self.optim]  # where DeepSpeedState.loss_scaler looks
        self.ranks = int(self.states.get("dp_world_size") or 1)
        self.module = {k: v for k, v in (self.states.get("module") or {}).items() if torch.is_tensor(v) and v.numel()}
        self.aliases = {}
        for alias, first in (self.states.get("shared_params") or {}).items():
            self.aliases.setdefault(first, []).append(alias)
        self.where = {}
        self.ours = self.states.get(OURS) or {}
        self._open: dict[str, tuple[str, torch.Tensor]] = {}  # key -> (name, flat tensor): one parameter at a time

    def describe(self) -> str:
        return f"DeepSpeed universal checkpoint ({self.states.get('ds_version')}, converted at ZeRO stage {self.stage})"

    # -- one parameter's files
    def _folder(self, name: str) -> Path:
        return self.path / ZERO_DIR / name

    def _flat(self, name: str, key: str) -> torch.Tensor:
        """The whole flat state `key` of parameter `name`, memory-mapped (the previous
        parameter's file of that key is let go)."""
        held = self._open.get(key)
        if held is not None and held[0] == name:
            return held[1]
        file = self._folder(name) / f"{key}.pt"
        if not file.is_file():
            raise CheckpointError(f"{self.path}: {ZERO_DIR}/{name}/{key}.pt is missing; the universal checkpoint is "
                                  "incomplete: convert it again or copy the whole folder")
        value = load_ds_file(file)
        value = value.get("param") if isinstance(value, dict) else value
        if not torch.is_tensor(value):
            raise CheckpointError(f"{file}: holds no tensor; the universal checkpoint is corrupted")
        self._open[key] = (name, value.reshape(-1))
        return self._open[key][1]

    def _range(self, name: str, key: str, lo: int, hi: int, numel: int | None = None) -> torch.Tensor:
        flat = self._flat(name, key)
        want = numel if numel is not None else self._numel(name)
        if flat.numel() != want:
            raise CheckpointError(f"{self.path}: {ZERO_DIR}/{name}/{key}.pt holds {flat.numel()} values and the "
                                  f"parameter has {want}; the universal checkpoint is of another model or corrupted")
        return flat[lo:hi]

    def _numel(self, name: str) -> int:
        for group in self.states.get("param_shapes") or []:
            if name in group:
                return int(torch.Size(group[name]).numel())
        return self._flat(name, MASTERS).numel()

    # -- what relayout asks (reshard.SavedState's questions)
    def knows(self, name: str) -> bool:
        return (self._folder(name) / f"{MASTERS}.pt").is_file() or name in self.module \
            or any(name in v for v in self.aliases.values())

    def has(self, kind: str, name: str) -> bool:
        return kind == "masters" and (self._folder(name) / f"{MASTERS}.pt").is_file()

    def model_values(self, name: str, lo: int, hi: int, dtype: torch.dtype) -> torch.Tensor:
        if self.has("masters", name):
            return self._range(name, MASTERS, lo, hi).to(dtype, copy=True)
        whole = self.module.get(name)
        if whole is None:
            first = next((k for k, v in self.aliases.items() if name in v), None)
            whole = self.module.get(first) if first is not None else None
        if whole is None:
            raise CheckpointError(f"{self.path}: {ZERO_DIR}/{name}/{MASTERS}.pt is missing; the universal checkpoint "
                                  "is incomplete: convert it again or copy the whole folder")
        return whole.reshape(-1)[lo:hi].to(dtype, copy=True)

    def optimizer_values(self, key: str, name: str, lo: int, hi: int) -> torch.Tensor:
        return self._range(name, key, lo, hi).to(torch.float32, copy=True)

    def optimizer_groups(self):
        groups = self.optim.get("param_groups")
        if groups is None:
            groups = (self.optim.get("optimizer_state_dict") or {}).get("param_groups")
        return groups

    def _step(self, name: str):
        if (self._folder(name) / f"{STEP}.pt").is_file():
            return load_ds_file(self._folder(name) / f"{STEP}.pt")
        state = ((self.optim.get("optimizer_state_dict") or {}).get("state") or {}).get(0) or {}
        return state.get(STEP)

    def optimizer_entry(self, gi: int, names: list[str]):
        """The group's step (every parameter of a group has the same) and the names of its
        per-element states, each read by range (optimizer_values)."""
        if not names or not (self._folder(names[0]) / f"{MASTERS}.pt").is_file():
            return None
        keys = sorted(f.name[:-3] for f in self._folder(names[0]).iterdir()
                      if f.name.endswith(".pt") and f.name[:-3] not in (MASTERS, STEP))
        if not keys:
            return None
        step = self._step(names[0])
        return {**({STEP: step} if step is not None else {}), **{k: None for k in keys}}

    def per_element(self, gi: int, key: str, value) -> bool:
        return key != STEP

    # -- the engine's state beside the parameters
    def loss_scaler(self) -> dict | None:
        return self.ours.get("loss_scaler") or super().loss_scaler()

    def feature_states(self) -> dict:
        return self.ours.get("features") or {}

    def client_state(self) -> dict:
        return {k: v for k, v in super().client_state().items() if k != OURS}

    def check_model(self, layout: dict) -> None:
        """Names and shapes as DeepSpeedState checks them, then every trained parameter's
        folder: a missing one is named (with how many are absent)."""
        super().check_model(layout)
        trained = {n for group in self.states.get("param_shapes") or [] for n in group}
        want = [n for g in layout["groups"] for n in g["names"] if n in trained]
        missing = [n for n in want if not (self._folder(n) / f"{MASTERS}.pt").is_file()]
        if missing:
            raise CheckpointError(f"{self.path}: {ZERO_DIR}/{missing[0]}/{MASTERS}.pt is missing ({len(missing)} of "
                                  f"{len(want)} parameters have no states there); the universal checkpoint is "
                                  "incomplete: convert it again or copy the whole folder")
