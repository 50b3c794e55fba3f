"""DeepSpeed's pipeline checkpoints (its PipelineModule engine), read without DeepSpeed.

    <dir>/global_stepN/layer_LL-model_states.pt     layer LL's own state dict (local names:
                                                    "weight", "pos.weight"), written once by
                                                    the stage holding it
    <dir>/global_stepN/mp_rank_SS_model_states.pt   stage SS: counters, schedule, client state,
                                                    "param_shapes" (its parameters by pipeline
                                                    name: "2.qkv.weight", "tied_modules.embed.weight")
    <dir>/global_stepN/[bf16_]zero_pp_rank_R_mp_rank_SS_optim_states.pt   stage SS's ZeRO 1
                                                    masters and optimizer state of data rank R
                                                    (at ZeRO 0 in fp32: torch's optimizer state
                                                    in mp_rank_SS under "optimizer", no names)

Each stage is a data-parallel ZeRO checkpoint of its own parameters (checkpoint/deepspeed.py
reads one with mp = SS), and a parameter's name is the same on whatever stage holds it, as in
zerotrain's PipelineModule. So the folder is a `SavedSplit` (checkpoint/resplit.py) of several
stages and one tensor rank: any pipeline of the same layers, of any stage count, finds its
parameters by name. A layer file's keys are local; its pipeline names are "<LL>.<key>", or for
a tied layer (the only kind whose names carry no layer index) "tied_modules.<key>.<local>",
the tied key being the one whose parameters the file holds. DeepSpeed writes a tied layer's
file only where it is the module itself (not a `forward_fn` use), so each tie appears once.

At ZeRO stage 0 DeepSpeed writes no "param_shapes": a stage's optimizer state is torch's, by
index, in the order the stage module lists its parameters, its tied modules' first (the
ModuleDict is made before the layers), then its own layers':

    stage 1's optimizer      [32,16]                    [16] [48,16] ... [16,64]   [16]
    is                       a tied module's weights    layer_03's                 layer_04's

`zero0_names` rebuilds each stage's names from that list and the layer files' shapes. A tie's
key is written nowhere at ZeRO 0: the loading pipeline gives its own (layer -> key), and where
none is given (a plain model) a layer whose weights a later stage lists ahead of its own layers
is a tie, named by its layer index.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import CheckpointError
from .deepspeed import LAYER, DeepSpeedState, check_version, load_ds_file, model_file
from .resplit import SavedSplit, by_layer

TIED = "tied_modules."


def is_pipeline_folder(path: Path) -> bool:
    return any(LAYER.fullmatch(f.name) for f in path.iterdir())


def _split_tied(name: str) -> tuple[str, str]:
    key, _, local = name[len(TIED):].partition(".")
    return key, local


class DeepSpeedSplit(SavedSplit):
    """A DeepSpeed folder of several model-parallel ranks (pipeline stages, AutoTP tensor ranks)
    as the old split of a resume: its counters, schedule and client state are the first rank's."""

    def frozen(self) -> set[str]:
        return set()

    def counters(self) -> dict:
        return self.stages[0][0].counters()

    def lr_scheduler(self):
        return self.stages[0][0].lr_scheduler()

    def loss_scaler(self):
        return self.stages[0][0].loss_scaler()

    def client_state(self) -> dict:
        return self.stages[0][0].client_state()

    def feature_states(self) -> dict:
        return {}


class DeepSpeedPipeline(DeepSpeedSplit):
    """A DeepSpeed pipeline folder as the old split of a resume: `stages` one DeepSpeedState
    per pipeline stage, the weights from the layer files."""

    def __init__(self, path: Path, new_split: dict | None = None, tied: dict[int, str] | None = None):
        """tied: the loading pipeline's tied layers (layer index -> key), which name a ZeRO 0
        folder's ties."""
        self.path = path
        first = load_ds_file(path / model_file(0))
        check_version(path, first)
        count = int(first.get("mp_world_size") or 1)
        missing = [s for s in range(count) if not (path / model_file(s)).is_file()]
        if missing:
            raise CheckpointError(f"{path}: {model_file(missing[0])} is missing ({count} pipeline stages wrote this "
                                  f"DeepSpeed checkpoint, {len(missing)} stage file(s) absent); copy the whole folder")
        states = [first] + [load_ds_file(path / model_file(s)) for s in range(1, count)]
        if all(s.get("param_shapes") for s in states):
            self.stage_shapes = [{n: tuple(v) for group in s["param_shapes"] for n, v in group.items()}
                                 for s in states]
        else:
            self.stage_shapes = zero0_names(path, self._layer_files(states), [_stage0_shapes(path, s) for s in states],
                                            tied or {})
        module = self._layer_weights()
        self.stages = [[DeepSpeedState(path, list(names), mp=s, module=module)]
                       for s, names in enumerate(self.stage_shapes)]
        self.splits = [{} for _ in self.stages]
        self.holder = {}
        for s, names in enumerate(self.stage_shapes):
            for name in names:
                self.holder.setdefault(name, s)
        for name in module:
            self.holder.setdefault(name, 0)  # buffers and frozen weights: read from the layer files
        self.states, self.aliases = first, {}
        self.for_split(new_split)

    def _layer_files(self, states: list[dict]) -> list[tuple[int, list[tuple[str, tuple]]]]:
        """Each layer file's parameters (its buffers, which every stage names, left out) in
        layer order: (index, [(local name, shape)])."""
        buffers = {n for s in states for n in s.get("buffer_names") or []}
        tied_buffers = {n.split(".", 2)[2] for n in buffers if n.startswith(TIED)}
        out = []
        for f in self.path.iterdir():
            if m := LAYER.fullmatch(f.name):
                idx = int(m.group(1))
                out.append((idx, [(k, tuple(v.shape)) for k, v in load_ds_file(f).items()
                                  if hasattr(v, "shape") and f"{idx}.{k}" not in buffers and k not in tied_buffers]))
        return sorted(out)

    def _layer_weights(self) -> dict:
        """Every layer file's tensors under their pipeline names; `self.layer_of` records each
        name's layer index (a tied key's: the layer whose file holds it)."""
        every = {n: shape for names in self.stage_shapes for n, shape in names.items()}
        tied: dict[str, dict[str, tuple]] = {}
        for name, shape in every.items():
            if name.startswith(TIED):
                key, local = _split_tied(name)
                tied.setdefault(key, {})[local] = shape
        files = sorted((int(m.group(1)), f) for f in self.path.iterdir() if (m := LAYER.fullmatch(f.name)))
        out, self.layer_of = {}, {}
        for idx, f in files:
            weights = {k: v for k, v in load_ds_file(f).items() if hasattr(v, "shape")}
            prefix = f"{idx}."
            if not any(n.startswith(prefix) for n in every):
                key = next((k for k, locals_ in tied.items()
                            if all(n in weights and tuple(weights[n].shape) == s for n, s in locals_.items())), None)
                prefix = f"{TIED}{key}." if key is not None else prefix
            for local, value in weights.items():
                if prefix + local not in out:
                    out[prefix + local] = value
                    self.layer_of[prefix + local] = idx
        unread = sorted(n for n in every if n not in out)
        if unread:
            raise CheckpointError(f"{self.path}: no layer_*-model_states.pt file holds {unread[0]} ({len(unread)} "
                                  "parameter(s) without weights); the folder is incomplete: copy every layer file")
        return out

    # ---- what the checkpoint holds (SavedSplit's, from param_shapes) ----------------------------
    def shapes(self) -> dict[str, tuple]:
        return {n: s for names in self.stage_shapes for n, s in names.items()}

    def layers(self) -> list[list[str]]:
        """The parameters by pipeline layer, in layer order (a tied layer where its file is)."""
        return by_layer(self.shapes(), self.layer_of.__getitem__)

    def describe(self) -> str:
        return (f"DeepSpeed {self.states.get('ds_version')} pipeline checkpoint ({len(self.stages)} stages, ZeRO stage "
                f"{self.stages[0][0].stage}, {self.stages[0][0].ranks} data-parallel rank(s))")


def _stage0_shapes(path: Path, states: dict) -> list[tuple]:
    """A ZeRO 0 stage's parameter shapes in its optimizer's order (torch's state by index)."""
    optimizer = states.get("optimizer")
    inner = optimizer.get("optimizer_state_dict", optimizer) if isinstance(optimizer, dict) else None
    if not inner or "state" not in inner or "param_groups" not in inner:
        raise CheckpointError(f"{path}: a DeepSpeed pipeline checkpoint without the names of its stages' parameters "
                              "(param_shapes) or torch's optimizer state beside them (at ZeRO stage 0 in bf16 DeepSpeed "
                              "keeps its own bf16 optimizer's); zerotrain reads ZeRO stage 1 ones and fp32 ZeRO 0 ones: "
                              "resume the run in DeepSpeed at ZeRO stage 1 and save again")
    order = [i for group in inner["param_groups"] for i in group["params"]]
    shapes = []
    for i in order:
        moment = next((v for v in (inner["state"].get(i) or {}).values() if torch.is_tensor(v) and v.dim()), None)
        if moment is None:
            raise CheckpointError(f"{path}: parameter {i} of a stage of this DeepSpeed ZeRO 0 pipeline "
                                  "checkpoint has no optimizer state, so its place is not known; save after a step")
        shapes.append(tuple(moment.shape))
    return shapes


def _assign(files, lists, tied):
    """Each stage's names for ties `tied`, or (stage, position) where its list stops fitting."""
    out, p = [], 0
    for s, want in enumerate(lists):
        names, pos, used = {}, 0, set()

        def fits(params):
            return [shape for _, shape in params] == want[pos : pos + len(params)]

        while True:  # its tied modules first
            hit = next(((idx, params) for idx, params in files if idx in tied and tied[idx] not in used and params
                        and fits(params)), None)
            if hit is None:
                break
            used.add(tied[hit[0]])
            names.update({f"{TIED}{tied[hit[0]]}.{k}": shape for k, shape in hit[1]})
            pos += len(hit[1])
        while pos < len(want) and p < len(files):  # then its own layers, in order
            idx, params = files[p]
            if idx not in tied:
                if not fits(params):
                    break
                names.update({f"{idx}.{k}": shape for k, shape in params})
                pos += len(params)
            p += 1
        if pos != len(want):
            return None, (s, pos)
        out.append(names)
    if any(idx not in tied and params for idx, params in files[p:]):  # layers no stage lists
        return None, (len(lists) - 1, len(lists[-1]))
    return out, None


def zero0_names(path: Path, files: list, lists: list[list[tuple]], tied: dict[int, str]) -> list[dict]:
    """Each stage's {pipeline name: shape} in its optimizer's order, for a ZeRO 0 folder: `files`
    the layer files' parameters, `lists` each stage's optimizer shapes, `tied` the known ties."""
    tied = dict(tied)
    for _ in range(len(files) + 1):
        names, stop = _assign(files, lists, tied)
        if stop is None:
            return names
        s, pos = stop
        want = lists[s]
        tie = next((idx for idx, params in files if idx not in tied and params and
                    [shape for _, shape in params] == want[pos : pos + len(params)]), None)
        if tie is None:
            break
        tied[tie] = str(tie)
    raise CheckpointError(f"{path}: stage {s}'s optimizer state of a DeepSpeed ZeRO 0 pipeline checkpoint does not fit "
                          f"its layer files (parameter {pos} of shape {list(want[pos]) if pos < len(want) else '-'}); "
                          "the folder is incomplete or of another model: copy every layer and stage file")
