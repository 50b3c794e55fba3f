"""The `data_efficiency` block (DeepSpeed's data sampling and routing library) and the
schedule settings the legacy curriculum shares with it. zerotrain acts on its seqlen
curriculum; dynamic batching and random-LTD change what is trained, are not built, and are
refused when switched on; the sampler's own settings have no effect (the curriculum needs
no index files: it cuts the batch)."""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from .base import Block, FieldProblem, Int, Number, acts, no_effect, refused

_SAMPLER = "the seqlen curriculum needs no data sampler or index files: it cuts each batch"
_LTD = "random-LTD is refused when enabled"
_DYNAMIC = "dynamic batching is refused when enabled"


class ScheduleConfig(Block):
    total_curriculum_step: Int | None = acts(None, "Steps until max difficulty (fixed_linear, fixed_root).")
    difficulty_step: Int | None = acts(None, "Difficulty is rounded down to a multiple of this.")
    root_degree: Int | None = acts(None, "Root of the schedule curve (fixed_root).")
    difficulty: list[Int] | None = acts(None, "Difficulty levels (fixed_discrete).")
    max_step: list[Int] | None = acts(None, "Last step of each level but the final one (fixed_discrete).")


class CurriculumMetricConfig(Block):
    index_to_sample_path: str | None = no_effect(None, _SAMPLER)
    index_to_metric_path: str | None = no_effect(None, _SAMPLER)
    difficulty_type: Literal["value", "percentile"] | None = acts(None, "Compare metric values (percentile is "
                                                                        "refused for seqlen).")
    clustering_type: Literal["single_cluster", "schedule_based"] | None = no_effect(None, _SAMPLER)
    min_difficulty: Number | None = acts(None, "Starting difficulty.")
    max_difficulty: Number | None = acts(None, "Final difficulty.")
    schedule_type: Literal["fixed_linear", "fixed_root", "fixed_discrete", "custom"] | None = acts(
        None, "Difficulty schedule.")
    schedule_config: ScheduleConfig | None = acts(None, "Parameters of the schedule.")


class DataCurriculumConfig(Block):
    enabled: bool = acts(False, "Turn the metric-based curriculum on (seqlen metrics only).")
    data_cluster_path: str | None = no_effect(None, _SAMPLER)
    curriculum_metrics: dict[str, CurriculumMetricConfig] | None = acts(None, "One entry per metric.")

    @model_validator(mode="after")
    def _metrics_when_enabled(self) -> DataCurriculumConfig:
        if self.enabled and not self.curriculum_metrics:
            raise FieldProblem("curriculum_metrics", "is missing: needed when curriculum learning is enabled")
        return self


class DynamicBatchingConfig(Block):
    enabled: bool = refused(False, "dynamic batching (token-budget batches) changes what is trained and is not "
                                   "built; set \"enabled\": false", ok=lambda v: True)
    lr_scaling_method: str = no_effect("linear", _DYNAMIC)
    min_batch_size: Int = no_effect(1, _DYNAMIC, ge=1)
    max_batch_size: Int | None = no_effect(None, _DYNAMIC, ge=1)
    sequence_picking_order: str = no_effect("dataloader", _DYNAMIC)
    max_tokens: Int | None = no_effect(None, _DYNAMIC, ge=1)
    verbose: bool = no_effect(False, _DYNAMIC)

    @model_validator(mode="after")
    def _tokens_when_enabled(self) -> DynamicBatchingConfig:
        if self.enabled and self.max_tokens is None:
            raise FieldProblem("max_tokens", "is missing: needed when dynamic batching is enabled")
        return self


class DataSamplingConfig(Block):
    enabled: bool = acts(False, "Turn the data sampler features on.")
    num_epochs: Int = no_effect(1000, _SAMPLER, ge=1)
    num_workers: Int = no_effect(0, _SAMPLER, ge=0)
    pin_memory: bool = no_effect(False, _SAMPLER)
    curriculum_learning: DataCurriculumConfig = acts(None, "Metric-based sample curriculum.",
                                                     default_factory=DataCurriculumConfig)
    dynamic_batching: DynamicBatchingConfig = acts(None, "Token-budget batches (refused when enabled).",
                                                   default_factory=DynamicBatchingConfig)


class RandomLTDStepConfig(Block):
    require_steps: Int | None = no_effect(None, _LTD, gt=0)
    seq_per_step: Int | None = no_effect(None, _LTD, gt=0)


class RandomLTDScheduleConfig(Block):
    min_value: Int | None = no_effect(None, _LTD)
    max_value: Int | None = no_effect(None, _LTD)
    schedule_type: Literal["fixed_linear"] = no_effect("fixed_linear", _LTD)
    schedule_config: RandomLTDStepConfig = no_effect(None, _LTD, default_factory=RandomLTDStepConfig)


class LayerTokenLRConfig(Block):
    enabled: bool = refused(False, "layer-token LR schedule is not implemented (DeepSpeed raises too)")
    total_layer_tokens: Int | None = no_effect(None, "only read while enabled")
    warmup_type: str | None = no_effect(None, "only read while enabled")
    warmup_layer_tokens: Int | None = no_effect(None, "only read while enabled")


class RandomLTDConfig(Block):
    enabled: bool = refused(False, "random-LTD (dropping tokens in middle layers) changes what is trained and "
                                   "is not built; set \"enabled\": false", ok=lambda v: True)
    total_layer_num: Int | None = no_effect(None, _LTD)
    random_ltd_layer_num: Int | None = no_effect(None, _LTD)
    random_ltd_layer_id: list[Int] | None = no_effect(None, _LTD)
    model_mask_name: str | None = no_effect(None, _LTD)
    model_type: str | None = no_effect(None, _LTD)
    hidden_state_order: str | None = no_effect(None, _LTD)
    random_ltd_schedule: RandomLTDScheduleConfig | None = no_effect(None, _LTD)
    layer_token_lr_schedule: LayerTokenLRConfig = no_effect(None, _LTD, default_factory=LayerTokenLRConfig)


class DataRoutingConfig(Block):
    enabled: bool = no_effect(False, "data routing holds only random-LTD, which is refused when enabled")
    random_ltd: RandomLTDConfig = acts(None, "Random layerwise token dropping (refused when enabled).",
                                       default_factory=RandomLTDConfig)


class DataEfficiencyConfig(Block):
    enabled: bool = acts(False, "Turn the data-efficiency library on.")
    seed: Int = no_effect(1234, "the data order comes from the dataloader's own seed")
    data_sampling: DataSamplingConfig = acts(None, "What data is drawn.", default_factory=DataSamplingConfig)
    data_routing: DataRoutingConfig = acts(None, "Which layers see which tokens.", default_factory=DataRoutingConfig)

    @model_validator(mode="after")
    def _refuse_unbuilt(self) -> DataEfficiencyConfig:
        # Off switches anywhere above mean DeepSpeed never reads the block: only then is it fine.
        if not self.enabled:
            return self
        sampling, routing = self.data_sampling, self.data_routing
        if sampling.enabled and sampling.dynamic_batching.enabled:
            raise FieldProblem("data_sampling.dynamic_batching.enabled",
                               DynamicBatchingConfig.model_fields["enabled"].description)
        if routing.enabled and routing.random_ltd.enabled:
            raise FieldProblem("data_routing.random_ltd.enabled", RandomLTDConfig.model_fields["enabled"].description)
        return self
