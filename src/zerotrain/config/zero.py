"""The `zero_optimization` block: every DeepSpeed 0.19.x key, each with its class (base.py),
and the values zerotrain chooses where the user gave none, resolved here once so that
`engine.config.zero_optimization` shows what runs.

Two values depend on the model and are settled when the stage-3 strategy is built:
`prefetch_bucket_size` and `max_reuse_distance` stay None ("zerotrain's default") until then.
"""

from __future__ import annotations

import sys
from typing import Any, Literal

from pydantic import AliasChoices, model_validator

from .base import Block, FieldProblem, Int, acts, no_effect, refused

# DDP's bucket size (25 MB of fp32): big enough to amortise a collective, small enough to
# overlap with backward. DeepSpeed's 5e8-element default would mean a single bucket.
DEFAULT_BUCKET_NUMEL = 25 * 2**20 // 4
# Stages 2-3 copy gradients into staging buffers (up to three buckets alive: two in flight, one
# filling), so their buckets cost memory that stage 0-1 buckets (views of a gradient buffer
# that exists anyway) do not: 8 MB of fp32 each, still few collectives per backward.
STAGED_BUCKET_NUMEL = 2**21
# Elements per NVMe optimizer swap block: 4 MB of fp32 per state tensor. Larger blocks cost
# host memory (buffer_count are in flight); smaller ones more hand-offs between the step's
# thread and the forward it runs behind (zero/offload/step_behind.py), which slows both.
NVME_BLOCK_NUMEL = 1 << 20

# settled by the stage-3 strategy once it has measured the model (None until then)
MODEL_DERIVED = ("prefetch_bucket_size", "max_reuse_distance")

Device = Literal["none", "cpu", "nvme"]
_GATHER = "stage 3 gathers each module's parameters with one all-gather of their chunks"


class _Offload(Block):
    device: Device = acts("none", "Where to offload: none, cpu or nvme.")
    nvme_path: str | None = acts(None, "Directory for nvme offload; required with device nvme.")
    pin_memory: bool = acts(True, "Use page-locked host memory (with a GPU) for faster copies.")

    @model_validator(mode="after")
    def _nvme_needs_path(self) -> _Offload:
        if self.device == "nvme" and not self.nvme_path:
            raise FieldProblem("nvme_path", "is missing: device 'nvme' needs a directory")
        if self.device == "nvme" and self.buffer_count < 1:
            raise FieldProblem("buffer_count", "is 0: device 'nvme' needs at least one I/O buffer; set it to 1 or more")
        return self


class OffloadOptimizerConfig(_Offload):
    buffer_count: Int = acts(4, "NVMe: optimizer blocks (master + state) in host memory at once: one stepped, one "
                                "read ahead, the rest being written.", ge=0)
    pipeline_read: bool = no_effect(False, "the read of the next NVMe block always overlaps the step")
    pipeline_write: bool = no_effect(False, "the write of a stepped NVMe block always overlaps the next one")
    fast_init: bool = no_effect(False, "NVMe swap files are written at initialize as they are")
    ratio: float = refused(1.0, "partial optimizer offload is not built: the whole optimizer state is offloaded",
                           ge=0.0, le=1.0)
    super_offload: bool = no_effect(False, "the host step is torch's fused/foreach optimizer on flat shards")
    cpuadam_cores_perc: float = no_effect(0.8, "the host step uses torch's threads (OMP_NUM_THREADS)")


class OffloadParamConfig(_Offload):
    buffer_count: Int = acts(5, "NVMe: parameter shard reads in flight at once (stage 3's read-ahead window).", ge=0)
    buffer_size: Int = acts(100_000_000, "NVMe: most elements per parameter read; each parameter's chunk must fit "
                                         "(buffers are sized to their read, so at most count x size resident).", ge=0)
    max_in_cpu: Int = no_effect(1_000_000_000, "parameter shards on NVMe are read into host memory as needed", ge=0)


def _stage3(name: str, default: Any, description: str, *old_names: str, kind=acts, **kw) -> Any:
    """A field that JSON may also spell `stage3_<name>` (DeepSpeed's longer names)."""
    bounds = {} if isinstance(default, bool) else {"ge": 0}
    aliases = AliasChoices(name, f"stage3_{name}", *old_names)
    if kind is acts:
        kw.setdefault("stages", (3,))
    return kind(default, description, validation_alias=aliases, **bounds, **kw)


class ZeroConfig(Block):
    stage: Int = acts(0, "ZeRO stage: 0 off, 1 optimizer states, 2 +grads, 3 +params.", ge=0, le=3)
    overlap_comm: bool | None = acts(
        None, "Overlap gradient reduction with backward.",
        ours="on at every stage (DeepSpeed: stage 3 only; off only costs time)")
    reduce_bucket_size: Int | None = acts(
        None, "Elements reduced per bucket.", gt=0,
        ours=f"{DEFAULT_BUCKET_NUMEL} (25 MB of fp32) at stages 0-1, {STAGED_BUCKET_NUMEL} (8 MB) at stages "
             "2-3 (DeepSpeed: 5e8, one bucket for most models)")
    sub_group_size: Int = acts(
        1_000_000_000, "Elements per NVMe optimizer swap block (offload_optimizer device nvme).", ge=0,
        ours=f"at most {NVME_BLOCK_NUMEL}; 0 means {NVME_BLOCK_NUMEL} (DeepSpeed: one sub-group per parameter)")
    prefetch_bucket_size: Int | None = _stage3(
        "prefetch_bucket_size", None, "Stage 3: elements gathered ahead of use.",
        ours="about two typical modules of the model (DeepSpeed: 5e7, a small model whole)")
    param_persistence_threshold: Int = _stage3("param_persistence_threshold", 100_000,
                                               "Stage 3: parameters smaller than this stay whole on every rank.")
    max_live_parameters: Int = _stage3("max_live_parameters", 1_000_000_000,
                                       "Stage 3: most gathered elements alive at once.")
    max_reuse_distance: Int | None = _stage3(
        "max_reuse_distance", None, "Stage 3: keep a gathered parameter whole if it is used again this soon.",
        ours="the prefetch window (DeepSpeed: 1e9, a small model whole)")
    offload_optimizer: OffloadOptimizerConfig | None = acts(None, "Optimizer-state offload (stages 1-3).")
    offload_param: OffloadParamConfig | None = acts(None, "Stage 3 parameter offload.", stages=(3,))
    cpu_offload: bool | None = acts(None, "Deprecated: true means offload_optimizer {device: cpu}.")
    cpu_offload_param: bool | None = acts(None, "Deprecated: true means offload_param {device: cpu}.", stages=(3,))
    # ---- accepted, no effect
    contiguous_gradients: bool = no_effect(True, "gradients always live in flat contiguous buffers")
    reduce_scatter: bool = no_effect(True, "each stage uses its own collective: all-reduce at 0, reduce to the "
                                           "owner at 1, reduce-scatter at 2 and 3")
    use_multi_rank_bucket_allreduce: bool = no_effect(True, "each stage uses its own collective")
    allgather_partitions: bool = no_effect(True, "updated shards are always all-gathered in place")
    allgather_bucket_size: Int = no_effect(500_000_000, "each flat group is all-gathered in one in-place collective",
                                           ge=0)
    compute_grad_norm: bool = no_effect(True, "the global norm is always computed: the overflow check needs it")
    elastic_checkpoint: bool = no_effect(False, "a checkpoint of N ranks always loads into M ranks")
    cpu_offload_use_pin_memory: bool | None = no_effect(None, "deprecated in DeepSpeed and ignored there too; "
                                                              "set pin_memory in the offload block")
    model_persistence_threshold: Int = _stage3("model_persistence_threshold", sys.maxsize,
                                               "no cap on persistent parameters: each one below "
                                               "param_persistence_threshold stays whole", kind=no_effect)
    gather_16bit_weights_on_model_save: bool = _stage3(
        "gather_16bit_weights_on_model_save", False, "the model is always saved with whole weights "
        "(engine.module_state_dict gathers them at stage 3)", "stage3_gather_fp16_weights_on_model_save",
        kind=no_effect)
    module_granularity_threshold: Int = _stage3("module_granularity_threshold", 0, _GATHER, kind=no_effect)
    use_all_reduce_for_fetch_params: bool = _stage3("use_all_reduce_for_fetch_params", False, _GATHER,
                                                    kind=no_effect)
    allgather_sequential: bool = _stage3("allgather_sequential", False, _GATHER, kind=no_effect)
    leaf_module: Any = no_effect(None, _GATHER)
    ignore_unused_parameters: bool = no_effect(True, "parameters without a gradient are always tolerated "
                                                     "(zerotrain train --ddp_find_unused_parameters false checks)")
    legacy_stage1: bool = no_effect(False, "there is one stage-1 implementation")
    round_robin_gradients: bool = no_effect(False, "gradient copies to the host are not spread over ranks")
    parameter_alignment: bool = no_effect(False, "flat buffers keep zerotrain's own padding")
    zero_hpz_partition_size: Int = no_effect(1, "no secondary (hpZ) partition: stage 3 gathers from all ranks",
                                             ge=0)
    memory_efficient_linear: bool = no_effect(True, "linear layers run as torch runs them")
    pipeline_loading_checkpoint: bool = no_effect(False, "checkpoints load the same way at every stage")
    override_module_apply: bool = no_effect(True, "module.apply is left as torch has it")
    log_trace_cache_warnings: bool = no_effect(False, "stage 3 re-traces the module order at every pass")
    enable_sanity_checks: bool = no_effect(False, "zerotrain's checks are always on")
    save_muon_momentum_buffer_in_memory: bool = no_effect(False, "the whole optimizer state is swapped alike")
    # ---- refused unless at the default
    load_from_fp32_weights: bool = refused(True, "rebuilding fp32 masters from 16-bit weights at load is not "
                                                 "built: checkpoints restore their fp32 masters", ok=lambda v: True)
    zenflow: Any = refused(None, "ZenFlow (delayed updates of unimportant gradients) changes the optimizer "
                                 "step and is not built")
    zero_quantized_weights: bool = refused(False, "ZeRO++ quantized weight gathers change the numbers and are "
                                                  "not built")
    zero_quantized_nontrainable_weights: bool = refused(False, "quantized frozen weights change the numbers and "
                                                               "are not built")
    zero_quantized_gradients: bool = refused(False, "ZeRO++ quantized gradients change the numbers and are not "
                                                    "built")
    mics_shard_size: Int = refused(-1, "MiCS sharding is not built (DeepSpeed 0.19.8 removed it too)")
    mics_hierarchical_params_gather: bool = refused(False, "MiCS sharding is not built (DeepSpeed 0.19.8 "
                                                           "removed it too)")
    zeropp_loco_param: Any = refused(None, "LoCo-Zero++ is not built (DeepSpeed 0.19.8 removed it too)")

    @model_validator(mode="after")
    def _resolve(self) -> ZeroConfig:
        for legacy, target, cls in (("cpu_offload", "offload_optimizer", OffloadOptimizerConfig),
                                    ("cpu_offload_param", "offload_param", OffloadParamConfig)):
            if getattr(self, legacy):
                if getattr(self, target) is not None:
                    raise FieldProblem(legacy, f"is deprecated and conflicts with {target}; keep only {target}")
                self.settle(target, cls(device="cpu"), f"user ({legacy}: true)")
        if self.overlap_comm is None:
            self.settle("overlap_comm", True, "zerotrain default: overlap at every stage (DeepSpeed: stage 3 only)")
        if self.reduce_bucket_size is None:
            staged = self.stage >= 2
            self.settle("reduce_bucket_size", STAGED_BUCKET_NUMEL if staged else DEFAULT_BUCKET_NUMEL,
                        f"zerotrain default: {'8' if staged else '25'} MB of fp32 at stage {self.stage} "
                        "(DeepSpeed: 5e8)")
        block = self.sub_group_size
        if block == 0 or block > NVME_BLOCK_NUMEL:
            why = (f"user {block}: " + ("0 means zerotrain's block" if block == 0 else "capped at zerotrain's "
                                        "largest block")) if "sub_group_size" in self.given \
                else "zerotrain default (DeepSpeed: 1e9)"
            self.settle("sub_group_size", NVME_BLOCK_NUMEL, why)
        return self

    def settle_from_model(self, prefetch_numel: int, reuse_numel: int) -> None:
        """Stage 3: the values derived from the model, once the strategy has measured it."""
        if self.prefetch_bucket_size is None:
            self.settle("prefetch_bucket_size", int(prefetch_numel),
                        "zerotrain default: about two typical modules of this model")
        if self.max_reuse_distance is None:
            self.settle("max_reuse_distance", int(reuse_numel), "zerotrain default: the prefetch window")
