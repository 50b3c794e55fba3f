"""DeepSpeed's pipeline checkpoints (its PipelineModule engine), read without DeepSpeed.

    <dir>/global_stepN/layer_LL-model_states.pt     layer LL's own state dict (local names:
                                                    "weight", "pos.weight"), written once by
                                                    the stage holding it
    <dir>/global_stepN/mp_rank_SS_model_states.pt   stage SS: counters, schedule, client state,
                                                    "param_shapes" (its parameters by pipeline
                                                    name: "2.qkv.weight", "tied_modules.embed.weight")
    <dir>/global_stepN/[bf16_]zero_pp_rank_R_mp_rank_SS_optim_states.pt   stage SS's ZeRO 0-1
                                                    masters and optimizer state of data rank R

Each stage is a data-parallel ZeRO checkpoint of its own parameters (checkpoint/deepspeed.py
reads one with mp = SS), and a parameter's name is the same on whatever stage holds it, as in
zerotrain's PipelineModule. So the folder is a `SavedSplit` (checkpoint/resplit.py) of several
stages and one tensor rank: any pipeline of the same layers, of any stage count, finds its
parameters by name. A layer file's keys are local; its pipeline names are "<LL>.<key>", or for
a tied layer (the only kind whose names carry no layer index) "tied_modules.<key>.<local>",
the tied key being the one whose parameters the file holds. DeepSpeed writes a tied layer's
file only where it is the module itself (not a `forward_fn` use), so each tie appears once.
"""

from __future__ import annotations

from pathlib import Path

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

    def __init__(self, path: Path, new_split: dict | None = None):
        self.path = path
        first = load_ds_file(path / model_file(0))
        check_version(path, first)
        count = int(first.get("mp_world_size") or 1)
        missing = [s for s in range(count) if not (path / model_file(s)).is_file()]
        if missing:
            raise CheckpointError(f"{path}: {model_file(missing[0])} is missing ({count} pipeline stages wrote this "
                                  f"DeepSpeed checkpoint, {len(missing)} stage file(s) absent); copy the whole folder")
        shapes = [first.get("param_shapes")] + [load_ds_file(path / model_file(s)).get("param_shapes")
                                                 for s in range(1, count)]
        if any(not s for s in shapes):
            raise CheckpointError(f"{path}: a DeepSpeed pipeline checkpoint without the names of its stages' "
                                  "parameters (param_shapes: DeepSpeed writes them at ZeRO stage 1, not 0); "
                                  "zerotrain reads ZeRO stage 1 ones: resume the run in DeepSpeed at ZeRO stage 1 "
                                  "and save again")
        self.stage_shapes = [{n: tuple(v) for group in s for n, v in group.items()} for s in shapes]
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
