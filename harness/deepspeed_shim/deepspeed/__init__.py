"""A `deepspeed` package that is zerotrain under DeepSpeed's names, for
harness/deepspeed_suite.py (DeepSpeed's own unit tests run against zerotrain).

It maps names and holds no behaviour of zerotrain's. Every `deepspeed.*` module exists
(so DeepSpeed's test files import); what a name resolves to comes from three tables:

    REFS       DeepSpeed name -> "zerotrain.module:attribute", looked up on first use
    CONSTANTS  DeepSpeed's spellings of config keys and type names (plain strings)
    _harness   what DeepSpeed's test harness needs from its environment and zerotrain does
               not claim: a CPU accelerator over torch's CPU calls, torch.distributed as
               deepspeed.comm (a 0-d all_gather_into_tensor, which gloo refuses, as 1-d),
               torch's version info, op builders (only the two Adams are "built": zerotrain builds torch's AdamW for DeepSpeed's
               "Adam" type, on the device or offloaded),
               MoE's parameter grouping (there are no experts, so groups pass through)

Any other name, or a REFS entry zerotrain does not have (yet), is a placeholder that raises
`NotInZerotrain(name)` as soon as a test calls it, instantiates it, subclasses-and-builds
it (nothing is an instance of one). The suite reads that name to tell
"a feature zerotrain does not claim" (not applicable) from "a name zerotrain lacks" (failed).
"""

from __future__ import annotations

import copyreg
import importlib
import importlib.abc
import importlib.machinery
import json
import os
import sys
import types

# this package's own metadata, as DeepSpeed's has it (the version it stands in for)
__version__ = "0.19.8+zerotrain"
__version_major__, __version_minor__, __version_patch__ = 0, 19, 8
__git_hash__ = __git_branch__ = None

_Z = "zerotrain"
REFS = {
    "deepspeed.initialize": f"{_Z}:initialize",
    "deepspeed.DeepSpeedConfigError": f"{_Z}.errors:ConfigError",
    "deepspeed.init_distributed": "deepspeed._harness:init_distributed",
    # ZeRO-3 construction and access
    "deepspeed.zero.Init": f"{_Z}.zero:Init",
    "deepspeed.zero.GatheredParameters": f"{_Z}.zero:GatheredParameters",
    "deepspeed.zero.register_external_parameter": f"{_Z}.zero:register_external_parameter",
    "deepspeed.zero.unregister_external_parameter": f"{_Z}.zero:unregister_external_parameter",
    "deepspeed.runtime.zero.partition_parameters.Init": f"{_Z}.zero:Init",
    "deepspeed.runtime.zero.partition_parameters.GatheredParameters": f"{_Z}.zero:GatheredParameters",
    "deepspeed.runtime.zero.register_external_parameter": f"{_Z}.zero:register_external_parameter",
    "deepspeed.runtime.zero.unwrap_model_for_generation": f"{_Z}.zero:unwrap_model_for_generation",
    "deepspeed.runtime.zero.GatheredParameters": f"{_Z}.zero:GatheredParameters",
    # engine, schedules, features, precision
    "deepspeed.runtime.engine.DeepSpeedEngine": f"{_Z}.engine.engine:Engine",
    "deepspeed.DeepSpeedEngine": f"{_Z}.engine.engine:Engine",
    "deepspeed.runtime.lr_schedules.WarmupLR": f"{_Z}.schedules:WarmupLR",
    "deepspeed.runtime.lr_schedules.WarmupDecayLR": f"{_Z}.schedules:WarmupDecayLR",
    "deepspeed.runtime.lr_schedules.WarmupCosineLR": f"{_Z}.schedules:WarmupCosineLR",
    "deepspeed.runtime.lr_schedules.OneCycle": f"{_Z}.schedules:OneCycle",
    "deepspeed.runtime.lr_schedules.LRRangeTest": f"{_Z}.schedules:LRRangeTest",
    "deepspeed.runtime.lr_schedules.VALID_LR_SCHEDULES": f"{_Z}.schedules.deepspeed:DEEPSPEED_SCHEDULERS",
    "deepspeed.runtime.progressive_layer_drop.ProgressiveLayerDrop": f"{_Z}:ProgressiveLayerDrop",
    "deepspeed.runtime.data_pipeline.curriculum_scheduler.CurriculumScheduler": f"{_Z}:CurriculumScheduler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler": f"{_Z}.precision:DynamicLossScaler",
    "deepspeed.runtime.fp16.loss_scaler.LossScaler": f"{_Z}.precision:StaticLossScaler",
    # config
    "deepspeed.runtime.config.DeepSpeedConfig": f"{_Z}.config:load_config",
    "deepspeed.runtime.zero.config.DeepSpeedZeroConfig": f"{_Z}.config:ZeroConfig",
    "deepspeed.runtime.zero.offload_config.OffloadDeviceEnum": f"{_Z}.zero.offload_config:OffloadDeviceEnum",
    "deepspeed.runtime.zero.offload_config.OffloadStateTypeEnum": f"{_Z}.zero.offload_config:OffloadStateTypeEnum",
    "deepspeed.runtime.zero.offload_config.DeepSpeedZeroOffloadParamConfig": f"{_Z}.config:OffloadParamConfig",
    "deepspeed.runtime.zero.offload_config.DeepSpeedZeroOffloadOptimizerConfig": f"{_Z}.config:OffloadOptimizerConfig",
    "deepspeed.runtime.zero.config.DeepSpeedZeroOffloadParamConfig": f"{_Z}.config:OffloadParamConfig",
    "deepspeed.runtime.zero.config.DeepSpeedZeroOffloadOptimizerConfig": f"{_Z}.config:OffloadOptimizerConfig",
    "deepspeed.runtime.precision_config.DeepSpeedFP16Config": f"{_Z}.config:FP16Config",
    "deepspeed.runtime.precision_config.DeepSpeedBF16Config": f"{_Z}.config:BF16Config",
    "deepspeed.runtime.config_utils.DeepSpeedConfigModel": f"{_Z}.config.base:Block",
    # pipeline parallelism (zerotrain.pipe) and its process topologies
    **{f"{mod}.{name}": f"{_Z}.pipe:{name}" for name in ("PipelineModule", "LayerSpec", "TiedLayerSpec")
       for mod in ("deepspeed.pipe", "deepspeed.runtime.pipe", "deepspeed.runtime.pipe.module")},
    **{f"{mod}.{name}": f"{_Z}.pipe:{name}"
       for name in ("ProcessTopology", "PipeDataParallelTopology", "PipeModelDataParallelTopology")
       for mod in ("deepspeed.pipe", "deepspeed.runtime.pipe", "deepspeed.runtime.pipe.topology")},
    "deepspeed.runtime.pipe.engine.PipelineEngine": f"{_Z}.pipe:PipelineEngine",
    "deepspeed.PipelineEngine": f"{_Z}.pipe:PipelineEngine",
    "deepspeed.PipelineModule": f"{_Z}.pipe:PipelineModule",
    "deepspeed.utils.RepeatingLoader": f"{_Z}.pipe:RepeatingLoader",
    "deepspeed.runtime.dataloader.RepeatingLoader": f"{_Z}.pipe:RepeatingLoader",
    # checkpoints
    "deepspeed.utils.zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint":
        f"{_Z}.checkpoint.consolidate:consolidate_checkpoint",
    "deepspeed.utils.zero_to_fp32.convert_zero_checkpoint_to_fp32_state_dict":
        f"{_Z}.checkpoint.consolidate:convert_zero_checkpoint_to_fp32_state_dict",
    "deepspeed.utils.zero_to_fp32.load_state_dict_from_zero_checkpoint":
        f"{_Z}.checkpoint.consolidate:load_state_dict_from_zero_checkpoint",
    # the test harness's environment (see _harness.py)
    "deepspeed.accelerator.get_accelerator": "deepspeed._harness:get_accelerator",
    "deepspeed.accelerator.is_current_accelerator_supported": "deepspeed._harness:accelerator_supported",
    "deepspeed.git_version_info.torch_info": "deepspeed._harness:torch_info",
    "deepspeed.utils.torch.required_torch_version": "deepspeed._harness:required_torch_version",
    "deepspeed.runtime.utils.see_memory_usage": "deepspeed._harness:see_memory_usage",
    "deepspeed.utils.logger": "deepspeed._harness:logger",
    "deepspeed.utils.logging.logger": "deepspeed._harness:logger",
    "deepspeed.ops.__compatible_ops__": "deepspeed._harness:compatible_ops",
    "deepspeed.ops.adam.FusedAdam": "torch.optim:AdamW",  # what "type": "Adam" builds in both
    "deepspeed.ops.adam.DeepSpeedCPUAdam": "torch.optim:AdamW",
    "deepspeed.moe.utils.split_params_into_different_moe_groups_for_optimizer":
        f"{_Z}.moe.utils:split_params_into_different_moe_groups_for_optimizer",
    "deepspeed.moe.utils.is_moe_param": f"{_Z}.moe.utils:is_moe_param",
}

_LR = "deepspeed.runtime.lr_schedules."
CONSTANTS = {
    **{_LR + k: v for k, v in {
        "LR_SCHEDULE": "lr_schedule", "LR_RANGE_TEST": "LRRangeTest", "ONE_CYCLE": "OneCycle",
        "WARMUP_LR": "WarmupLR", "WARMUP_DECAY_LR": "WarmupDecayLR", "WARMUP_COSINE_LR": "WarmupCosineLR",
        "LR_RANGE_TEST_MIN_LR": "lr_range_test_min_lr", "LR_RANGE_TEST_STEP_RATE": "lr_range_test_step_rate",
        "LR_RANGE_TEST_STEP_SIZE": "lr_range_test_step_size", "LR_RANGE_TEST_STAIRCASE": "lr_range_test_staircase",
        "EDGE_VALUE": "edge_value", "MID_VALUE": "mid_value",
        "CYCLE_FIRST_STEP_SIZE": "cycle_first_step_size", "CYCLE_FIRST_STAIR_COUNT": "cycle_first_stair_count",
        "CYCLE_SECOND_STEP_SIZE": "cycle_second_step_size", "CYCLE_SECOND_STAIR_COUNT": "cycle_second_stair_count",
        "DECAY_STEP_SIZE": "decay_step_size", "CYCLE_MIN_LR": "cycle_min_lr", "CYCLE_MAX_LR": "cycle_max_lr",
        "DECAY_LR_RATE": "decay_lr_rate", "CYCLE_MIN_MOM": "cycle_min_mom", "CYCLE_MAX_MOM": "cycle_max_mom",
        "DECAY_MOM_RATE": "decay_mom_rate", "WARMUP_MIN_LR": "warmup_min_lr", "WARMUP_MAX_LR": "warmup_max_lr",
        "WARMUP_NUM_STEPS": "warmup_num_steps", "WARMUP_TYPE": "warmup_type", "WARMUP_LOG_RATE": "log",
        "WARMUP_LINEAR_RATE": "linear", "WARMUP_MIN_RATIO": "warmup_min_ratio", "COS_MIN_RATIO": "cos_min_ratio",
        "TOTAL_NUM_STEPS": "total_num_steps",
    }.items()},
    **{"deepspeed.runtime.config." + k: v for k, v in {
        "ADAM_OPTIMIZER": "adam", "ADAMW_OPTIMIZER": "adamw", "SGD_OPTIMIZER": "sgd",
        "LAMB_OPTIMIZER": "lamb", "ONEBIT_ADAM_OPTIMIZER": "onebitadam", "ADAGRAD_OPTIMIZER": "adagrad",
    }.items()},
}


class NotInZerotrain(Exception):
    """A DeepSpeed name with no zerotrain counterpart was used; args[0] is the name. Each one
    raised is also noted in the suite's results file, so a test whose other rank failed first
    (waiting at a barrier for this one) still tells which name stopped it."""

    def __init__(self, name: str):
        super().__init__(name)
        path = os.environ.get("ZT_SUITE_RESULTS")
        if path:
            with open(path, "a", encoding="utf-8") as f:
                f.write(json.dumps({"event": "absent", "name": name}) + "\n")

    @property
    def name(self) -> str:
        return self.args[0]

    def __str__(self) -> str:
        return f"{self.args[0]}: no zerotrain counterpart (deepspeed shim)"


class _AbsentMeta(type):
    """The type of placeholders. Building or calling one raises; nothing is an instance or a
    subclass of one (true: zerotrain has no such class); reading an attribute gives a
    placeholder for the longer name, so `Status.AVAILABLE` in a type hint or a set still
    evaluates at import time."""

    def __call__(cls, *args, **kwargs):
        raise NotInZerotrain(cls._absent)

    def __instancecheck__(cls, obj):
        return False

    def __subclasscheck__(cls, sub):
        return isinstance(sub, _AbsentMeta) and sub._absent.startswith(cls._absent)

    def __iter__(cls):
        raise NotInZerotrain(cls._absent)

    def __index__(cls):  # a DeepSpeed constant used as a size
        raise NotInZerotrain(cls._absent)

    __int__ = __float__ = __index__

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return absent(f"{cls._absent}.{name}")


def _reduce(cls):
    return absent, (cls._absent,)


def absent(full_name: str) -> type:
    """A placeholder class for a DeepSpeed name; subclasses keep the name they stand for. Its
    type is named after it too, so "must be int, not <type>" errors (a constant used as a
    size) still name what was missing."""
    meta = type(full_name, (_AbsentMeta,), {})
    copyreg.pickle(meta, _reduce)  # placeholders travel to the ranks DeepSpeed's harness spawns
    return meta(full_name.rsplit(".", 1)[-1], (), {"_absent": full_name, "__module__": __name__})


def _resolve(full_name: str):
    if full_name in CONSTANTS:
        return CONSTANTS[full_name]
    target = REFS.get(full_name)
    if target is None:
        return None
    module, _, attr = target.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError):
        return absent(full_name)  # a name zerotrain should have and does not (yet)


def _is_package(full_name: str) -> bool:
    prefix = full_name + "."
    return any(k.startswith(prefix) for k in (*REFS, *CONSTANTS))


class _ShimModule(types.ModuleType):
    def __call__(self, *args, **kwargs):
        # `from deepspeed.x import _private` falls back to importing a submodule of that name,
        # which this package makes: calling it is using a name zerotrain does not have
        raise NotInZerotrain(self.__name__)

    def __getattr__(self, name):
        full = f"{self.__name__}.{name}"
        value = _resolve(full)
        if value is None:
            if name.startswith("_"):  # (the text names it for the suite when a test reads it)
                raise AttributeError(f"{full}: no zerotrain counterpart (deepspeed shim)")
            factory = importlib.import_module("deepspeed._harness").FACTORIES.get(self.__name__)
            if factory is not None and (made := factory(name)) is not None:
                value = made
            elif _is_package(full):
                value = importlib.import_module(full)
            else:
                value = absent(full)
        setattr(self, name, value)
        return value


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        module = _ShimModule(spec.name)
        module.__path__ = []  # every name may have submodules
        return module

    def exec_module(self, module):
        pass


class _Finder(importlib.abc.MetaPathFinder):
    """Last on sys.meta_path: files of this package win, every other deepspeed.* is made."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("deepspeed.") and not fullname.startswith("deepspeed._"):
            return importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=True)
        return None


if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.append(_Finder())


def __getattr__(name):
    return _ShimModule.__getattr__(sys.modules[__name__], name)
