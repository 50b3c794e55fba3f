"""Typed tree for DeepSpeed-style JSON configs: the top level, precision, optimizer,
scheduler, the legacy curriculum, layer drop and the token budget. ZeRO lives in zero.py,
data efficiency in data_efficiency.py, the keys for what is not built in extras.py, the
pipeline and tensor_parallel blocks beside their parallelism (parallel/pipeline/config.py,
parallel/tensor/config.py).

Every block forbids unknown keys so a typo is an error, never a silent default; every field
carries its class (acts / no effect / refused, base.py) and a description that doubles as
help text. Checks that need the world size (the batch triad) live in the loader; everything
that can be decided from the JSON alone lives here.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import AliasChoices, PrivateAttr, field_validator, model_validator

# the loader imports these from here too
from .base import Block, FieldProblem, Float, Int, Number, _no_bool, acts, no_effect, refused, spellings, valid_keys  # noqa: F401
from .curriculum import check_schedule
from .data_efficiency import DataEfficiencyConfig, ScheduleConfig
from .extras import DeepSpeedExtras, is_off
from ..parallel.pipeline.config import PipelineConfig
from ..parallel.tensor.config import TensorParallelConfig
from .zero import ZeroConfig

_MASTERS = "zerotrain keeps fp32 master weights and gradients"
_DTYPE_NAMES = {"fp32": ("fp32", "float32", "float", "torch.float32"), "fp16": ("fp16", "float16", "half", "torch.float16"),
                "bf16": ("bf16", "bfloat16", "torch.bfloat16")}


# --------------------------------------------------------------------------- precision


class FP16Config(Block):
    enabled: bool = acts(False, "Train in fp16 with loss scaling.")
    auto_cast: bool = acts(False, "With fp16 enabled: cast the floating-point inputs of training forwards to fp16.")
    loss_scale: float = acts(0.0, "0 means dynamic loss scaling; > 0 is a fixed scale.")
    initial_scale_power: Int = acts(16, "Dynamic scaling starts at 2**power.", ge=0)
    loss_scale_window: Int = acts(1000, "Overflow-free steps before the scale doubles.")
    hysteresis: Int = acts(2, "Overflows tolerated before the scale shrinks.", ge=1)
    consecutive_hysteresis: bool = acts(False, "Refill hysteresis after every good step.")
    min_loss_scale: Float = acts(1.0, "Dynamic scale never goes below this.")
    fp16_master_weights_and_grads: bool = refused(False, f"fp16 master weights are not built: {_MASTERS}")

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
    enabled: bool = acts(False, "Train in bfloat16 (no loss scaling).")
    check_grad_overflow: bool = acts(True, "Skip steps whose gradients are not finite.")
    immediate_grad_update: bool = no_effect(False, "gradients reach the fp32 masters as each stage reduces them "
                                                   "(every micro-batch at stages 2-3, at the boundary at 0-1)")
    bf16_master_weights_and_grads: bool = refused(False, f"bf16 master weights are not built: {_MASTERS}")
    bf16_optimizer_states: bool = refused(False, "bf16 optimizer states are not built: they stay fp32")


# --------------------------------------------------------------------------- optimizer


class OptimizerConfig(Block):
    type: str = acts(..., "Optimizer name, e.g. AdamW.")
    params: dict[str, Any] = acts(None, "Keyword arguments, checked by the optimizer factory.", default_factory=dict)
    legacy_fusion: bool = no_effect(False, "torch's fused or foreach kernels are chosen by the optimizer factory")


class SchedulerConfig(Block):
    type: str = acts(..., "LR scheduler name, e.g. WarmupLR.")
    params: dict[str, Any] = acts(None, "Keyword arguments, checked by the scheduler factory.", default_factory=dict)


# --------------------------------------------------------------------------- curriculum, layer drop


class CurriculumConfig(Block):
    enabled: bool = acts(..., "Turn legacy curriculum learning on.")
    curriculum_type: str | None = acts(None, "seqlen: the length is passed or the batch cut; any other value only "
                                             "moves the schedule (DeepSpeed injects nothing then either).")
    min_difficulty: Int | None = acts(None, "Starting difficulty.")
    max_difficulty: Int | None = acts(None, "Final difficulty.")
    schedule_type: str | None = acts(None, "fixed_linear, fixed_root, fixed_discrete or custom.")
    schedule_config: ScheduleConfig | None = acts(None, "Parameters of the schedule.")

    @model_validator(mode="after")
    def _when_enabled(self) -> CurriculumConfig:
        if not self.enabled:
            return self
        if self.curriculum_type is None:
            raise FieldProblem("curriculum_type", 'is missing: add "curriculum_type": "seqlen"')
        check_schedule(self.model_dump(exclude_none=True))  # the rules CurriculumScheduler runs too
        return self


class PLDConfig(Block):
    enabled: bool = acts(..., "Turn progressive layer drop on.")
    theta: Float = acts(0.5, "Final keep probability.", ge=0.0, le=1.0)
    gamma: Float = acts(0.001, "How fast the keep probability decays towards theta.", ge=0.0)


class DataTypesConfig(Block):
    grad_accum_dtype: Literal["fp32", "fp16", "bf16"] | None = acts(
        None, "With gradient_accumulation_steps > 1 and fp16/bf16 training, the dtype gradients accumulate "
              "in across micro-steps: fp32 (the default) or the training dtype (less memory). A PipelineModule "
              "accumulates in the training dtype (torch's schedule adds into .grad); fp32 there has no effect.")
    keep_in_fp32_modules: Any = refused(None, "every parameter trains in the fp16/bf16 dtype of the run",
                                        ok=lambda v: v in (None, "auto", []))


# --------------------------------------------------------------------------- token budget


class TokenBudgetConfig(Block):
    """zerotrain's own block (not DeepSpeed's): Megatron-DeepSpeed's --train-tokens,
    --lr-decay-tokens, --lr-decay-style, --lr-warmup-iters, --lr-warmup-tokens and --min-lr
    (schedules/token_decay.py has the formula)."""

    enabled: bool = acts(True, "Count trained tokens (after any curriculum cut) over all ranks.")
    train_tokens: Int | None = acts(None, "Stop (engine.should_stop()) once this many tokens are trained.", gt=0)
    lr_decay_tokens: Int | None = acts(None, "Decay the LR over this many tokens; replaces the scheduler block.", gt=0)
    lr_decay_style: Literal["linear", "cosine", "constant", "inverse-square-root"] = acts(
        "linear", "Shape of the token-based LR decay.")
    warmup_steps: Int = acts(0, "Linear LR warmup from 0, in optimizer steps.", ge=0)
    lr_warmup_tokens: Int | None = acts(None, "Linear LR warmup from 0 over this many tokens (instead of "
                                              "warmup_steps).", ge=0)
    min_lr: Float = acts(0.0, "LR at the end of the token-based decay.", ge=0.0)

    @model_validator(mode="after")
    def _lr_settings_need_decay(self) -> TokenBudgetConfig:
        if self.lr_decay_tokens is None:
            for key in ("lr_decay_style", "warmup_steps", "lr_warmup_tokens", "min_lr"):
                if key in self.given:
                    raise FieldProblem(key, "is set but does nothing without lr_decay_tokens; add lr_decay_tokens or remove it")
            return self
        if self.lr_warmup_tokens is not None and self.warmup_steps:
            raise FieldProblem("lr_warmup_tokens", "and warmup_steps both set the warmup; keep one")
        if self.lr_warmup_tokens is not None and self.lr_warmup_tokens >= self.lr_decay_tokens:
            raise FieldProblem("lr_warmup_tokens", f"{self.lr_warmup_tokens} should be below lr_decay_tokens "
                                                   f"{self.lr_decay_tokens}")
        return self


# --------------------------------------------------------------------------- top level


class CheckpointConfig(Block):
    """DeepSpeed's `checkpoint` block: zerotrain acts on node-local storage and on which pointer
    file names the folder to load; the rest is about DeepSpeed's own checkpoint writers and formats."""

    use_node_local_storage: bool = acts(
        False, "Each node writes and reads its own ranks' checkpoint files under its own save_dir (clusters "
               "without shared storage); local rank 0 of each node writes the shared files.")
    tag_validation: Literal["WARN", "IGNORE", "FAIL"] | None = no_effect(
        None, "tags are always checked (DeepSpeed's FAIL): a plain folder name, the same on every rank")

    @field_validator("tag_validation", mode="before")
    @classmethod
    def _any_case(cls, value):  # DeepSpeed reads the mode in any case
        return value.upper() if isinstance(value, str) and value.upper() in ("WARN", "IGNORE", "FAIL") else value
    load_universal: bool = acts(
        False, "load_checkpoint without a tag loads the folder `latest_universal` names (a DeepSpeed universal "
               "checkpoint: ds_to_universal or `zerotrain convert --to deepspeed-universal`), and refuses any other "
               "kind; without it `latest` is read. A universal folder named by tag loads either way.")
    checkpoint_serialization: Any = no_effect(None, "checkpoint files are zerotrain's own (manifest, checksums)")
    writer: Any = no_effect(None, "checkpoint files are written by zerotrain's own crash-safe writer")
    parallel_write: Any = no_effect(None, "every rank writes its own files at once already")


class ZeroTrainConfig(DeepSpeedExtras):
    """The whole config. The loader fills the three batch sizes, so they are ints after load_config."""

    train_batch_size: Int | None = acts(None, "Samples per optimizer step over all ranks.")
    train_micro_batch_size_per_gpu: Int | None = acts(None, "Samples per forward on one rank.")
    gradient_accumulation_steps: Int | None = acts(None, "Micro-batches per optimizer step.")
    steps_per_print: Int | None = acts(None, "Log progress every this many steps; none is silent.", ge=1)
    wall_clock_breakdown: bool = acts(False, "Time forward, backward and step.")
    max_consecutive_skipped_steps: Int = acts(
        100, "Stop (NonFiniteStepsError) after this many optimizer steps in a row are skipped for non-finite "
             "gradients; 0 never stops.", ge=0, ours="100 (zerotrain's own key)")
    gradient_clipping: Float = acts(1.0, "Max global grad L2 norm; 0 disables clipping.", ge=0.0)
    prescale_gradients: bool = acts(False, "fp16: divide grads by world size before the all-reduce, not after. "
                                           "fp32/bf16 always divide before (inside the backward).")
    gradient_predivide_factor: Float = acts(1.0, "fp16: divide grads by this before the all-reduce and by "
                                                 "world_size/this after.", gt=0.0)
    gradient_allreduce_op: Literal["mean", "sum"] = acts(
        "mean", "How data-parallel gradients combine: \"mean\" averages them over the ranks, \"sum\" adds "
                "them (any case).")
    dataloader_drop_last: bool = acts(False, "The dataloader initialize returns drops the last incomplete batch.")
    optimizer: OptimizerConfig | None = acts(None, "Optimizer to build; none means bring your own.")
    scheduler: SchedulerConfig | None = acts(None, "LR scheduler to build.")
    fp16: FP16Config = acts(None, "fp16 mixed precision and loss scaling.", default_factory=FP16Config)
    bf16: BF16Config = acts(None, "bfloat16 mixed precision; JSON key bf16 or bfloat16.", default_factory=BF16Config,
                            validation_alias=AliasChoices("bf16", "bfloat16"))
    zero_optimization: ZeroConfig = acts(None, "ZeRO sharding and offload.", default_factory=ZeroConfig)
    curriculum_learning: CurriculumConfig | None = acts(None, "Legacy sequence-length curriculum.")
    progressive_layer_drop: PLDConfig | None = acts(None, "Progressive layer drop.")
    data_efficiency: DataEfficiencyConfig | None = acts(None, "Data sampling and routing.")
    data_types: DataTypesConfig = acts(None, "Gradient accumulation dtype.", default_factory=DataTypesConfig)
    checkpoint: CheckpointConfig = acts(None, "Where checkpoint files go.", default_factory=CheckpointConfig)
    pipeline: PipelineConfig | None = acts(None, "Pipeline parallelism: schedule and DeepSpeed's pipeline keys.")
    tensor_parallel: TensorParallelConfig = acts(None, "Tensor parallelism (DeepSpeed's AutoTP keys).",
                                                 default_factory=TensorParallelConfig)
    sequence_parallel_size: Int = acts(1, "Ulysses sequence parallelism: each rank of a group of this many holds "
                                          "1/S of every sequence and 1/S of the attention heads.", ge=1)
    token_budget: TokenBudgetConfig | None = acts(None, "Token counting, token budget and token-based LR decay.",
                                                  ours="off (zerotrain's own block)")
    zero_allow_untested_optimizer: bool = no_effect(False, "every torch optimizer runs at every stage")
    zero_force_ds_cpu_optimizer: bool = no_effect(False, "offloaded steps run torch's own optimizer on the host")

    _raw: dict[str, Any] = PrivateAttr(default_factory=dict)
    _comments: list = PrivateAttr(default_factory=list)
    _autos: dict = PrivateAttr(default_factory=dict)

    @property
    def raw(self) -> dict[str, Any]:
        """The config dict as the user gave it (before "auto" and defaults), for cross-rank hashing."""
        return self._raw

    @property
    def comment_keys(self) -> list[str]:
        """Dotted keys starting with "_" that the loader set aside as comments."""
        return self._comments

    @property
    def auto_sources(self) -> dict[str, str]:
        """{dotted key: how its "auto" was resolved}."""
        return self._autos

    @property
    def compute_dtype_name(self) -> str:
        return "fp16" if self.fp16.enabled else "bf16" if self.bf16.enabled else "fp32"

    @field_validator("gradient_allreduce_op", mode="before")
    @classmethod
    def _allreduce_op_any_case(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value  # DeepSpeed reads "SUM" as "sum"

    @field_validator("pipeline", mode="before")
    @classmethod
    def _pipeline_off(cls, value: Any) -> Any:
        return None if isinstance(value, dict) and is_off(value) else value  # {"enabled": false}: no pipeline

    @field_validator("zero_optimization", mode="before")
    @classmethod
    def _zero_bool_form(cls, value: Any) -> Any:
        # Old configs wrote "zero_optimization": true for stage 1.
        return {"stage": int(value)} if isinstance(value, bool) else value

    @model_validator(mode="after")
    def _cross_block(self) -> ZeroTrainConfig:
        if self.fp16.enabled and self.bf16.enabled:
            raise FieldProblem("", "fp16.enabled and bf16.enabled are both true; enable at most one")
        params = self.optimizer.params if self.optimizer is not None else {}
        if "max_grad_norm" in params and "gradient_clipping" not in self.given:
            raise FieldProblem("optimizer.params.max_grad_norm", "zerotrain clips with the top-level key; set "
                                                                 f"\"gradient_clipping\": {params['max_grad_norm']} "
                                                                 "(with it this key is accepted and has no effect)")
        budget = self.token_budget
        if budget is not None and budget.enabled and budget.lr_decay_tokens is not None and self.scheduler is not None:
            raise FieldProblem("token_budget.lr_decay_tokens", "drives the LR, and so does the scheduler block; keep "
                                                               "one (token_budget.lr_decay_style picks the shape)")
        dtype = self.compute_dtype_name
        comm = self.communication_data_type
        if comm is not None and str(comm).lower() not in _DTYPE_NAMES[dtype]:
            raise FieldProblem("communication_data_type", f"{comm!r}: gradients are reduced in the training dtype "
                                                          f"({dtype}); set it to {dtype!r} or remove it")
        if not self.zero_optimization.load_from_fp32_weights and dtype != "fp32":
            raise FieldProblem("zero_optimization.load_from_fp32_weights",
                               ZeroConfig.model_fields["load_from_fp32_weights"].description + "; remove it")
        return self
