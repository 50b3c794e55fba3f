"""Typed tree for DeepSpeed-style JSON configs.

Every block forbids unknown keys so a typo is an error, never a silent default. Field
descriptions double as help text. Checks that need the world size (the batch triad) live
in the loader; everything that can be decided from the JSON alone lives here.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Literal

from pydantic import AliasChoices, Field, PrivateAttr, field_validator, model_validator

# the loader imports these from here too
from .base import Block, FieldProblem, Float, Int, Number, _no_bool, spellings, valid_keys  # noqa: F401
from .pipeline import PipelineConfig

SCHEDULE_TYPES = ("fixed_linear", "fixed_root", "fixed_discrete", "custom")


# --------------------------------------------------------------------------- precision


class FP16Config(Block):
    enabled: bool = Field(False, description="Train in fp16 with loss scaling.")
    auto_cast: bool = Field(False, description="Cast floating-point inputs to half.")
    loss_scale: float = Field(0.0, description="0 means dynamic loss scaling; > 0 is a fixed scale.")
    initial_scale_power: Int = Field(16, ge=0, description="Dynamic scaling starts at 2**power.")
    loss_scale_window: Int = Field(1000, description="Overflow-free steps before the scale doubles.")
    hysteresis: Int = Field(2, ge=1, description="Overflows tolerated before the scale shrinks (ZeRO path).")
    consecutive_hysteresis: bool = Field(False, description="Refill hysteresis after every good step.")
    min_loss_scale: Float = Field(1.0, description="Dynamic scale never goes below this.")
    fp16_master_weights_and_grads: bool = Field(False, description="Keep master weights and grads in fp16 (ZeRO 1-3).")

    @field_validator("loss_scale", mode="before")
    @classmethod
    def _loss_scale(cls, value: Any) -> float:
        try:
            number = float(_no_bool(value))
        except (TypeError, ValueError):
            raise ValueError(f"should be a number >= 0 (0 means dynamic), got {value!r}") from None
        if not math.isfinite(number) or number < 0:
            raise ValueError(f"should be a finite number >= 0 (0 means dynamic), got {value!r}")
        return number

    @model_validator(mode="after")
    def _dynamic_limits(self) -> FP16Config:
        # Only matter when the dynamic scaler will actually run.
        if self.enabled and self.loss_scale == 0:
            if self.loss_scale_window <= 0:
                raise FieldProblem("loss_scale_window", f"must be > 0 for dynamic loss scaling, got {self.loss_scale_window}")
            if self.min_loss_scale <= 0:
                raise FieldProblem("min_loss_scale", f"must be > 0 for dynamic loss scaling, got {self.min_loss_scale}")
        return self


class BF16Config(Block):
    enabled: bool = Field(False, description="Train in bfloat16 (no loss scaling).")
    immediate_grad_update: bool = Field(False, description="Apply grads to fp32 master weights as they arrive.")
    check_grad_overflow: bool = Field(True, description="Skip steps whose gradients are not finite.")
    bf16_master_weights_and_grads: bool = Field(False, description="Keep master weights and grads in bf16 (ZeRO 1-3).")
    bf16_optimizer_states: bool = Field(False, description="Keep optimizer states in bf16; needs bf16 master weights.")

    @model_validator(mode="after")
    def _states_need_master(self) -> BF16Config:
        if self.bf16_optimizer_states and not self.bf16_master_weights_and_grads:
            raise FieldProblem("bf16_optimizer_states", "needs bf16_master_weights_and_grads: true")
        return self


# --------------------------------------------------------------------------- optimizer


class OptimizerConfig(Block):
    type: str = Field(description="Optimizer name, e.g. AdamW.")
    params: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments, checked by the optimizer factory.")


class SchedulerConfig(Block):
    type: str = Field(description="LR scheduler name, e.g. WarmupLR.")
    params: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments, checked by the scheduler factory.")


# --------------------------------------------------------------------------- ZeRO

Device = Literal["none", "cpu", "nvme"]


class _Offload(Block):
    device: Device = Field("none", description="Where to offload: none, cpu or nvme.")
    nvme_path: str | None = Field(None, description="Directory for nvme offload; required with device nvme.")
    pin_memory: bool = Field(True, description="Use page-locked CPU memory for faster copies.")

    @model_validator(mode="after")
    def _nvme_needs_path(self) -> _Offload:
        if self.device == "nvme" and not self.nvme_path:
            raise FieldProblem("nvme_path", "is missing: device 'nvme' needs a directory")
        return self


class OffloadOptimizerConfig(_Offload):
    buffer_count: Int = Field(4, ge=0, description="Buffers for optimizer-state swapping.")
    pipeline_read: bool = Field(False, description="Overlap nvme reads with the step.")
    pipeline_write: bool = Field(False, description="Overlap nvme writes with the step.")
    fast_init: bool = Field(False, description="Faster optimizer init when offloading to nvme.")
    ratio: Float = Field(1.0, ge=0.0, le=1.0, description="Fraction of optimizer work offloaded; < 1 needs stage 3.")


class OffloadParamConfig(_Offload):
    buffer_count: Int = Field(5, ge=0, description="Buffers for parameter swapping.")
    buffer_size: Int = Field(100_000_000, ge=0, description="Elements per swap buffer.")
    max_in_cpu: Int = Field(1_000_000_000, ge=0, description="Most parameter elements kept in CPU memory with nvme.")


def _stage3(name: str, default: Any, description: str, *old_names: str) -> Any:
    """A field that JSON may also spell `stage3_<name>` (DeepSpeed's longer names)."""
    bounds = {} if isinstance(default, bool) else {"ge": 0}
    aliases = AliasChoices(name, f"stage3_{name}", *old_names)
    return Field(default, validation_alias=aliases, description=description, **bounds)


_COMPAT = "Accepted for DeepSpeed compatibility; no effect in zerotrain."


class ZeroConfig(Block):
    stage: Int = Field(0, ge=0, le=3, description="ZeRO stage: 0 off, 1 optimizer states, 2 +grads, 3 +params.")
    contiguous_gradients: bool = Field(True, description="Copy grads into one contiguous buffer.")
    overlap_comm: bool | None = Field(None, description="Overlap gradient reduction with backward; default true for stage 3.")
    reduce_bucket_size: Int = Field(500_000_000, gt=0, description="Elements reduced per bucket.")
    allgather_bucket_size: Int = Field(500_000_000, ge=0, description="Elements all-gathered per bucket.")
    reduce_scatter: bool = Field(True, description="Reduce-scatter gradients instead of all-reduce.")
    allgather_partitions: bool = Field(True, description="All-gather updated partitions instead of broadcasting.")
    prefetch_bucket_size: Int = _stage3("prefetch_bucket_size", 50_000_000,
                                        "Stage 3: elements prefetched ahead of use.")
    param_persistence_threshold: Int = _stage3("param_persistence_threshold", 100_000,
                                               "Stage 3: params smaller than this stay whole on every rank.")
    model_persistence_threshold: Int = _stage3("model_persistence_threshold", sys.maxsize,
                                               "Stage 3: cap on the total elements kept persistent.")
    max_live_parameters: Int = _stage3("max_live_parameters", 1_000_000_000,
                                       "Stage 3: most gathered elements alive at once.")
    max_reuse_distance: Int = _stage3("max_reuse_distance", 1_000_000_000,
                                      "Stage 3: keep a gathered param if it is reused this soon.")
    gather_16bit_weights_on_model_save: bool = _stage3("gather_16bit_weights_on_model_save", False,
                                                       "Stage 3: gather full 16-bit weights when saving the model.",
                                                       "stage3_gather_fp16_weights_on_model_save")
    sub_group_size: Int = Field(1_000_000_000, gt=0, description="Elements per optimizer step sub-group.")
    round_robin_gradients: bool = Field(False, description="Stage 1/2: spread gradient copies across ranks.")
    offload_optimizer: OffloadOptimizerConfig | None = Field(None, description="Optimizer-state offload.")
    offload_param: OffloadParamConfig | None = Field(None, description="Stage 3 parameter offload.")
    cpu_offload: bool | None = Field(None, description="Deprecated: true means offload_optimizer {device: cpu}.")
    cpu_offload_param: bool | None = Field(None, description="Deprecated: true means offload_param {device: cpu}.")
    elastic_checkpoint: bool = Field(False, description=_COMPAT)
    ignore_unused_parameters: bool = Field(True, description="Tolerate params that get no gradient.")
    legacy_stage1: bool = Field(False, description=_COMPAT)
    load_from_fp32_weights: bool = Field(True, description="Restore master weights from fp32 copies in checkpoints.")
    zero_hpz_partition_size: Int = Field(1, ge=1, description=_COMPAT)
    zero_quantized_weights: bool = Field(False, description=_COMPAT)
    zero_quantized_nontrainable_weights: bool = Field(False, description=_COMPAT)
    zero_quantized_gradients: bool = Field(False, description=_COMPAT)
    mics_shard_size: Int = Field(-1, description=_COMPAT)
    mics_hierarchical_params_gather: bool = Field(False, description=_COMPAT)
    use_multi_rank_bucket_allreduce: bool = Field(True, description=_COMPAT)
    memory_efficient_linear: bool = Field(True, description=_COMPAT)
    pipeline_loading_checkpoint: bool = Field(False, description=_COMPAT)
    override_module_apply: bool = Field(True, description=_COMPAT)
    log_trace_cache_warnings: bool = Field(False, description=_COMPAT)

    @model_validator(mode="after")
    def _resolve(self) -> ZeroConfig:
        for legacy, target, cls in (("cpu_offload", "offload_optimizer", OffloadOptimizerConfig),
                                    ("cpu_offload_param", "offload_param", OffloadParamConfig)):
            if getattr(self, legacy):
                if getattr(self, target) is not None:
                    raise FieldProblem(legacy, f"is deprecated and conflicts with {target}; keep only {target}")
                setattr(self, target, cls(device="cpu"))
        if self.overlap_comm is None:
            self.overlap_comm = self.stage == 3
        opt = self.offload_optimizer
        if opt is not None and opt.ratio < 1 and self.stage != 3:
            raise FieldProblem("offload_optimizer.ratio", f"{opt.ratio} < 1 needs stage 3, stage is {self.stage}")
        return self


# --------------------------------------------------------------------------- curriculum, layer drop


class ScheduleConfig(Block):
    total_curriculum_step: Int | None = Field(None, description="Steps until max difficulty (fixed_linear, fixed_root).")
    difficulty_step: Int | None = Field(None, description="Difficulty is rounded down to a multiple of this.")
    root_degree: Int | None = Field(None, description="Root of the schedule curve (fixed_root).")
    difficulty: list[Int] | None = Field(None, description="Difficulty levels (fixed_discrete).")
    max_step: list[Int] | None = Field(None, description="Last step of each level but the final one (fixed_discrete).")


class CurriculumConfig(Block):
    enabled: bool = Field(description="Turn legacy curriculum learning on.")
    curriculum_type: str | None = Field(None, description="What the difficulty controls; only seqlen.")
    min_difficulty: Int | None = Field(None, description="Starting difficulty.")
    max_difficulty: Int | None = Field(None, description="Final difficulty.")
    schedule_type: str | None = Field(None, description="fixed_linear, fixed_root, fixed_discrete or custom.")
    schedule_config: ScheduleConfig | None = Field(None, description="Parameters of the schedule.")

    @model_validator(mode="after")
    def _when_enabled(self) -> CurriculumConfig:
        if not self.enabled:
            return self
        if self.curriculum_type is None:
            raise FieldProblem("curriculum_type", 'is missing: add "curriculum_type": "seqlen"')
        if self.curriculum_type != "seqlen":
            raise FieldProblem("curriculum_type", f"only 'seqlen' is supported, got {self.curriculum_type!r}")
        for key in ("min_difficulty", "max_difficulty", "schedule_type"):
            if getattr(self, key) is None:
                raise FieldProblem(key, "is missing: needed when curriculum learning is enabled")
        if self.schedule_type not in SCHEDULE_TYPES:
            raise FieldProblem("schedule_type", f"should be one of {', '.join(SCHEDULE_TYPES)}, got {self.schedule_type!r}")
        return self


class PLDConfig(Block):
    enabled: bool = Field(description="Turn progressive layer drop on.")
    theta: Float = Field(0.5, ge=0.0, le=1.0, description="Final keep probability.")
    gamma: Float = Field(0.001, ge=0.0, description="How fast the keep probability decays towards theta.")


# --------------------------------------------------------------------------- token budget


class TokenBudgetConfig(Block):
    """zerotrain's own block (not DeepSpeed's): Megatron-DeepSpeed's --train-tokens,
    --lr-decay-tokens, --lr-decay-style, --lr-warmup-iters and --min-lr."""

    enabled: bool = Field(True, description="Count trained tokens (after any curriculum cut) over all ranks.")
    train_tokens: Int | None = Field(None, gt=0, description="Stop (engine.should_stop()) once this many tokens are trained.")
    lr_decay_tokens: Int | None = Field(None, gt=0, description="Decay the LR over this many tokens; replaces the scheduler block.")
    lr_decay_style: Literal["linear", "cosine"] = Field("linear", description="Shape of the token-based LR decay.")
    warmup_steps: Int = Field(0, ge=0, description="Linear LR warmup from 0, in optimizer steps.")
    min_lr: Float = Field(0.0, ge=0.0, description="LR at the end of the token-based decay.")

    @model_validator(mode="after")
    def _lr_settings_need_decay(self) -> TokenBudgetConfig:
        if self.lr_decay_tokens is None:
            for key in ("lr_decay_style", "warmup_steps", "min_lr"):
                if key in self.model_fields_set:
                    raise FieldProblem(key, "is set but does nothing without lr_decay_tokens; add lr_decay_tokens or remove it")
        return self


# --------------------------------------------------------------------------- data efficiency


class CurriculumMetricConfig(Block):
    index_to_sample_path: str | None = Field(None, description="Index file mapping difficulty to samples.")
    index_to_metric_path: str | None = Field(None, description="Index file mapping difficulty to metric values.")
    difficulty_type: Literal["value", "percentile"] | None = Field(None, description="Compare metric values or percentiles.")
    clustering_type: Literal["single_cluster", "schedule_based"] | None = Field(None, description="How samples are clustered.")
    min_difficulty: Number | None = Field(None, description="Starting difficulty.")
    max_difficulty: Number | None = Field(None, description="Final difficulty.")
    schedule_type: Literal["fixed_linear", "fixed_root", "fixed_discrete", "custom"] | None = Field(
        None, description="Difficulty schedule.")
    schedule_config: ScheduleConfig | None = Field(None, description="Parameters of the schedule.")


class DataCurriculumConfig(Block):
    enabled: bool = Field(False, description="Pick samples by difficulty metrics.")
    data_cluster_path: str | None = Field(None, description="Directory for sample clusters.")
    curriculum_metrics: dict[str, CurriculumMetricConfig] | None = Field(None, description="One entry per metric.")

    @model_validator(mode="after")
    def _metrics_when_enabled(self) -> DataCurriculumConfig:
        if self.enabled and not self.curriculum_metrics:
            raise FieldProblem("curriculum_metrics", "is missing: needed when curriculum learning is enabled")
        return self


class DynamicBatchingConfig(Block):
    enabled: bool = Field(False, description="Pack variable-length sequences up to a token budget.")
    lr_scaling_method: str = Field("linear", description="How the LR follows the batch size.")
    min_batch_size: Int = Field(1, ge=1, description="Smallest batch.")
    max_batch_size: Int | None = Field(None, ge=1, description="Largest batch; none means no cap.")
    sequence_picking_order: str = Field("dataloader", description="Order in which sequences are packed.")
    max_tokens: Int | None = Field(None, ge=1, description="Token budget per batch; required when enabled.")
    verbose: bool = Field(False, description="Log batching decisions.")

    @model_validator(mode="after")
    def _tokens_when_enabled(self) -> DynamicBatchingConfig:
        if self.enabled and self.max_tokens is None:
            raise FieldProblem("max_tokens", "is missing: needed when dynamic batching is enabled")
        return self


class DataSamplingConfig(Block):
    enabled: bool = Field(False, description="Turn the data sampler features on.")
    num_epochs: Int = Field(1000, ge=1, description="Epochs the sampler may draw from.")
    num_workers: Int = Field(0, ge=0, description="Dataloader workers.")
    pin_memory: bool = Field(False, description="Pin dataloader memory.")
    curriculum_learning: DataCurriculumConfig = Field(default_factory=DataCurriculumConfig,
                                                      description="Metric-based sample curriculum.")
    dynamic_batching: DynamicBatchingConfig = Field(default_factory=DynamicBatchingConfig,
                                                    description="Token-budget batches.")


class RandomLTDStepConfig(Block):
    require_steps: Int | None = Field(None, gt=0, description="Steps to reach max_value.")
    seq_per_step: Int | None = Field(None, gt=0, description="Kept tokens are a multiple of this.")


class RandomLTDScheduleConfig(Block):
    min_value: Int | None = Field(None, description="Tokens kept at the start.")
    max_value: Int | None = Field(None, description="Tokens kept at the end.")
    schedule_type: Literal["fixed_linear"] = Field("fixed_linear", description="Only fixed_linear exists.")
    schedule_config: RandomLTDStepConfig = Field(default_factory=RandomLTDStepConfig, description="Step sizes.")


class LayerTokenLRConfig(Block):
    enabled: bool = Field(False, description="Not implemented (DeepSpeed raises too); must stay false.")
    total_layer_tokens: Int | None = Field(None, description="Unused while disabled.")
    warmup_type: str | None = Field(None, description="Unused while disabled.")
    warmup_layer_tokens: Int | None = Field(None, description="Unused while disabled.")

    @field_validator("enabled")
    @classmethod
    def _off(cls, value: bool) -> bool:
        if value:
            raise ValueError("layer-token LR schedule is not implemented; set it to false")
        return value


class RandomLTDConfig(Block):
    enabled: bool = Field(False, description="Drop tokens in middle layers.")
    total_layer_num: Int | None = Field(None, description="Layers in the model.")
    random_ltd_layer_num: Int | None = Field(None, description="Layers that drop tokens.")
    random_ltd_layer_id: list[Int] | None = Field(None, description="Indices of those layers.")
    model_mask_name: str | None = Field(None, description="Name of the attention-mask argument.")
    model_type: str | None = Field(None, description="Model family, e.g. decoder.")
    hidden_state_order: str | None = Field(None, description="Layout of hidden states, e.g. batch_seq_dim.")
    random_ltd_schedule: RandomLTDScheduleConfig | None = Field(None, description="How many tokens are kept over time.")
    layer_token_lr_schedule: LayerTokenLRConfig = Field(default_factory=LayerTokenLRConfig,
                                                        description="LR by layer tokens; not implemented.")


class DataRoutingConfig(Block):
    enabled: bool = Field(False, description="Turn data routing on.")
    random_ltd: RandomLTDConfig = Field(default_factory=RandomLTDConfig, description="Random layerwise token dropping.")


class DataEfficiencyConfig(Block):
    enabled: bool = Field(False, description="Turn the data-efficiency library on.")
    seed: Int = Field(1234, description="Seed for the data sampler.")
    data_sampling: DataSamplingConfig = Field(default_factory=DataSamplingConfig, description="What data is drawn.")
    data_routing: DataRoutingConfig = Field(default_factory=DataRoutingConfig, description="Which layers see which tokens.")


# --------------------------------------------------------------------------- top level


class ZeroTrainConfig(Block):
    """The whole config. The loader fills the three batch sizes, so they are ints after load_config."""

    train_batch_size: Int | None = Field(None, description="Samples per optimizer step over all ranks.")
    train_micro_batch_size_per_gpu: Int | None = Field(None, description="Samples per forward on one rank.")
    gradient_accumulation_steps: Int | None = Field(None, description="Micro-batches per optimizer step.")
    steps_per_print: Int | None = Field(None, ge=1, description="Log progress every this many steps; none is silent.")
    wall_clock_breakdown: bool = Field(False, description="Time forward, backward and step.")
    max_consecutive_skipped_steps: Int = Field(
        100, ge=0, description="Stop (NonFiniteStepsError) after this many optimizer steps in a row are skipped "
                               "for non-finite gradients; 0 never stops. zerotrain only.")
    gradient_clipping: Float = Field(1.0, ge=0.0, description="Max global grad L2 norm; 0 disables clipping.")
    prescale_gradients: bool = Field(False, description="fp16: divide grads by world size before the all-reduce, "
                                                       "not after. fp32/bf16 always divide before (inside the backward).")
    gradient_predivide_factor: Float = Field(1.0, gt=0.0, description="fp16: divide grads by this before the all-reduce "
                                                                     "and by world_size/this after.")
    optimizer: OptimizerConfig | None = Field(None, description="Optimizer to build; none means bring your own.")
    scheduler: SchedulerConfig | None = Field(None, description="LR scheduler to build.")
    fp16: FP16Config = Field(default_factory=FP16Config, description="fp16 mixed precision and loss scaling.")
    bf16: BF16Config = Field(default_factory=BF16Config, validation_alias=AliasChoices("bf16", "bfloat16"),
                             description="bfloat16 mixed precision; JSON key bf16 or bfloat16.")
    zero_optimization: ZeroConfig = Field(default_factory=ZeroConfig, description="ZeRO sharding and offload.")
    curriculum_learning: CurriculumConfig | None = Field(None, description="Legacy sequence-length curriculum.")
    progressive_layer_drop: PLDConfig | None = Field(None, description="Progressive layer drop.")
    data_efficiency: DataEfficiencyConfig | None = Field(None, description="Data sampling and routing.")
    token_budget: TokenBudgetConfig | None = Field(None, description="Token counting, token budget and token-based LR decay.")
    pipeline: PipelineConfig | None = Field(None, description="Pipeline parallelism: schedule and DeepSpeed's pipeline keys.")
    zero_allow_untested_optimizer: bool = Field(False, description="Accepted for DeepSpeed compatibility; no effect.")
    zero_force_ds_cpu_optimizer: bool = Field(False, description="Accepted for DeepSpeed compatibility; no effect.")

    _raw: dict[str, Any] = PrivateAttr(default_factory=dict)

    @property
    def raw(self) -> dict[str, Any]:
        """The config dict as the user gave it (before "auto" and defaults), for cross-rank hashing."""
        return self._raw

    @field_validator("zero_optimization", mode="before")
    @classmethod
    def _zero_bool_form(cls, value: Any) -> Any:
        # Old configs wrote "zero_optimization": true for stage 1.
        return {"stage": int(value)} if isinstance(value, bool) else value

    @model_validator(mode="after")
    def _cross_block(self) -> ZeroTrainConfig:
        if self.fp16.enabled and self.bf16.enabled:
            raise FieldProblem("", "fp16.enabled and bf16.enabled are both true; enable at most one")
        budget = self.token_budget
        if budget is not None and budget.enabled and budget.lr_decay_tokens is not None and self.scheduler is not None:
            raise FieldProblem("token_budget.lr_decay_tokens", "drives the LR, and so does the scheduler block; keep one")
        stage = self.zero_optimization.stage
        if self.fp16.enabled and self.fp16.fp16_master_weights_and_grads and stage == 0:
            raise FieldProblem("fp16.fp16_master_weights_and_grads", "needs zero_optimization.stage 1, 2 or 3")
        if self.bf16.enabled and self.bf16.bf16_master_weights_and_grads and stage == 0:
            raise FieldProblem("bf16.bf16_master_weights_and_grads", "needs zero_optimization.stage 1, 2 or 3")
        return self
