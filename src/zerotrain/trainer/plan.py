"""The run plan: what a training run is, decided once from the options before any model or
data is loaded, then read by everything that assembles and runs it.

    options, the names the user set ─┐
    world size (processes) ──────────┼─> parallel sizes   pipeline x data x sequence x tensor
                                     ├─> DeepSpeed config built once (ds_config.py): the dict
                                     │   for zerotrain.initialize, the option values it adopted,
                                     │   and the typed, validated tree (zerotrain.config)
                                     └─> run folder       output_dir checked, resume target found

    preflight.py makes it (the launcher for its check, each rank for its run)
        -> assembly.py reads the typed config (ZeRO stage, offload, precision) to build the model
        -> Trainer(model, plan, ...) reads the options, sizes, config and folder from it

Nothing downstream rebuilds any part of it. What only the model and the data can say (the
hidden size behind "auto" bucket sizes, the curriculum's "auto" maximum, the schedule's step
counts) is written into a copy of the config by `RunPlan.deepspeed_config`, just before the
engine is made. `config` is validated with stand-ins for those values: read it for what the
options decide (stage, offload, precision, parallel blocks), and `engine.config` for the rest.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..config import ZeroTrainConfig, load_config
from ..schedules import resolve_warmup_steps
from .args import DataArguments, ModelArguments, TrainingArguments, build
from .ds_config import (BuiltConfig, build_deepspeed_config, check_no_auto_left, data_parallel_size, fill_model_sizes,
                        fill_schedule, read_deepspeed)
from .loop import run_folder

# sizes that stand in for the model's and the data's while only the config's validity is checked
STAND_IN_HIDDEN, STAND_IN_BLOCK, STAND_IN_STEPS = 64, 64, 1000
_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": None}


@dataclass(frozen=True)
class Options:
    """The three option sets of a run, the names the user set, and the notices their HF /
    LLaMA-Factory spellings earned (hf_options.py)."""

    model: ModelArguments
    data: DataArguments
    training: TrainingArguments
    explicit: frozenset[str] = frozenset()
    notices: tuple[str, ...] = ()

    @classmethod
    def parse(cls, values: dict) -> Options:
        """Option name -> value (the options file and the command line, merged)."""
        explicit: set[str] = set()
        notices: list[str] = []
        model, data, training = build(values, explicit, notices)
        return cls(model, data, training, frozenset(explicit), tuple(notices))


@dataclass(frozen=True)
class ParallelSizes:
    """How the run's processes split: world = pipeline x data x sequence x tensor (the mesh's
    order, comm/mesh.py)."""

    world: int
    pipeline: int
    tensor: int
    data: int
    sequence: int = 1

    def data_rank(self, rank: int) -> int:
        """The data-parallel index of global `rank`: which share of every batch it reads (the
        sequence and tensor ranks of one index read the same)."""
        return rank // (self.tensor * self.sequence) % self.data


@dataclass(frozen=True)
class RunFolder:
    """output_dir, checked: not someone else's run (unless overwriting or resuming), and the
    checkpoint to resume from as engine.load_checkpoint takes it (save_dir, tag)."""

    output_dir: Path
    overwrite: bool
    resume: tuple[Path, str | None] | None = None

    @property
    def resuming(self) -> bool:
        return self.resume is not None


@dataclass(frozen=True)
class RunPlan:
    options: TrainingArguments  # the user's, with `built.adopted` applied (a copy: theirs is not written)
    explicit: frozenset[str]  # the option names the user set: the DeepSpeed config may only override the rest
    parallel: ParallelSizes
    folder: RunFolder
    built: BuiltConfig  # the dict zerotrain.initialize gets (model sizes and step counts still "auto")
    config: ZeroTrainConfig  # typed and validated (model and step values stood in for)
    model_options: ModelArguments = field(default_factory=ModelArguments)
    data_options: DataArguments = field(default_factory=DataArguments)
    comm: object = field(default=None, compare=False)  # this rank's Comm; None on the launcher

    @property
    def adopted(self) -> dict:
        return self.built.adopted

    @property
    def zero_stage(self) -> int:
        return self.config.zero_optimization.stage

    @property
    def offloads(self) -> bool:
        """Parameters or optimizer states offloaded (cpu or nvme)."""
        zero = self.config.zero_optimization
        return any(b is not None and b.device in ("cpu", "nvme") for b in (zero.offload_param, zero.offload_optimizer))

    @property
    def compute_dtype(self) -> torch.dtype | None:
        """fp16 or bf16 (whichever key spells it), or None for fp32."""
        return _DTYPES[self.config.compute_dtype_name]

    def deepspeed_config(self, hidden_size: int | None, block_size, warmup_steps: int, total_steps: int) -> dict:
        """A copy of the built config with what the model, the data and the step count say
        filled in: the dict zerotrain.initialize gets. Every "auto" must be gone by now."""
        ds = copy.deepcopy(self.built.config)
        fill_model_sizes(ds, hidden_size, block_size)
        check_no_auto_left(fill_schedule(ds, warmup_steps, total_steps))
        return ds


def explicit_of(options: TrainingArguments) -> set[str]:
    """Options that differ from their defaults count as set by the user (the Python API, where
    no command line says which were given)."""
    fresh = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
             for f in dataclasses.fields(options)}
    return {name for name, default in fresh.items() if getattr(options, name) != default}


def plan_run(options: TrainingArguments, explicit: set[str], world_size: int, *, comm=None,
             model_options: ModelArguments | None = None, data_options: DataArguments | None = None,
             block_size=None) -> RunPlan:
    """Check the run folder, build and validate the DeepSpeed config for `world_size`
    processes. `block_size` (an int, or a callable asked only if the curriculum needs it)
    stands in for the data's until the data is prepared."""
    output_dir = Path(options.output_dir).expanduser()
    resuming = bool(options.resume_from_checkpoint)
    run_folder.check_output_dir(output_dir, options.overwrite_output_dir, resuming)
    resume = run_folder.resolve_resume(options.resume_from_checkpoint, output_dir) if resuming else None
    folder = RunFolder(output_dir, options.overwrite_output_dir, resume)

    raw = read_deepspeed(options.deepspeed)  # the one read of --deepspeed
    data = data_parallel_size(options, explicit, world_size, raw)
    built = build_deepspeed_config(options, explicit, data, None, None, raw)
    adopted = copy.copy(options)
    for name, value in built.adopted.items():
        setattr(adopted, name, value)
    parallel = ParallelSizes(world_size, adopted.pipeline_parallel_size, adopted.tensor_parallel_size, data,
                             adopted.sequence_parallel_size)

    stand_in = copy.deepcopy(built.config)
    fill_model_sizes(stand_in, STAND_IN_HIDDEN, block_size or STAND_IN_BLOCK)
    total = adopted.max_steps if adopted.max_steps > 0 else STAND_IN_STEPS
    warmup = resolve_warmup_steps(total, adopted.warmup_steps, adopted.warmup_ratio)
    config = load_config(fill_schedule(stand_in, warmup, total), world_size=data)
    return RunPlan(adopted, frozenset(explicit), parallel, folder, built, config,
                   model_options or ModelArguments(), data_options or DataArguments(), comm)
