"""The `data_efficiency` block (DeepSpeed's data sampling and routing library) and the
schedule settings the legacy curriculum shares with it.

zerotrain acts on the sampling curriculum: with `training_data` the loader's batch sampler
draws each batch from clusters of samples whose metric lies within the current difficulty
(data/curriculum_sampler.py), reading the metric's index files; without it a seqlen metric
still cuts each batch. Dynamic batching makes the training loader's batches by token count and
scales each step's LR (data_efficiency/variable_batch_size_and_lr.py). Random-LTD (data routing)
drops tokens in the middle layers (features/random_ltd.py). Like DeepSpeed, the settings of a
part are read only while that part is enabled; the checks DeepSpeed makes (as asserts or KeyErrors) are
one line each here."""

from __future__ import annotations

from typing import Literal

from pydantic import field_validator, model_validator

from .base import Block, FieldProblem, Int, Number, acts, no_effect, refused



class ScheduleConfig(Block):
    total_curriculum_step: Int | None = acts(None, "Steps until max difficulty (fixed_linear, fixed_root).")
    difficulty_step: Int | None = acts(None, "Difficulty is rounded down to a multiple of this.")
    root_degree: Int | None = acts(None, "Root of the schedule curve (fixed_root).")
    difficulty: list[Int] | None = acts(None, "Difficulty levels (fixed_discrete).")
    max_step: list[Int] | None = acts(None, "Last step of each level but the final one (fixed_discrete).")


class CurriculumMetricConfig(Block):
    index_to_sample_path: str | None = acts(None, "Index file prefix (.idx/.bin): row i holds the samples of the "
                                                  "i-th metric value, in ascending order (schedule_based).")
    index_to_metric_path: str | None = acts(None, "Index file prefix: row i holds the metric value of row i of "
                                                  "index_to_sample (value difficulty, schedule_based).")
    difficulty_type: Literal["value", "percentile"] | None = acts(
        None, "value: samples whose metric is <= the difficulty; percentile: the difficulty's share of samples "
              "in metric order (seqlen cutting takes value only).")
    clustering_type: Literal["single_cluster", "schedule_based"] | None = acts(
        None, "single_cluster: the metric picks no samples (all are one cluster; a post-process function acts "
              "on it); schedule_based: a new cluster each time the difficulty changes.")
    min_difficulty: Number | None = acts(None, "Starting difficulty.")
    max_difficulty: Number | None = acts(None, "Final difficulty.")
    schedule_type: Literal["fixed_linear", "fixed_root", "fixed_discrete", "custom"] | None = acts(
        None, "Difficulty schedule.")
    schedule_config: ScheduleConfig | None = acts(None, "Parameters of the schedule.")

    @model_validator(mode="after")
    def _percentiles_are_integers(self) -> CurriculumMetricConfig:
        # a percentile difficulty slices the samples in metric order: a count, not a value
        if self.difficulty_type == "percentile":
            for key in ("min_difficulty", "max_difficulty"):
                value = getattr(self, key)
                if value is not None and not isinstance(value, int):
                    raise FieldProblem(key, f"should be an integer percentile with difficulty_type percentile, "
                                            f"got {value!r}")
        return self

    def missing(self) -> tuple[str, str] | None:
        """(key, why) of the first setting the enabled curriculum needs and lacks."""
        for key in ("difficulty_type", "clustering_type", "min_difficulty", "max_difficulty", "schedule_type"):
            if getattr(self, key) is None:
                return key, "needed when curriculum learning is enabled"
        if self.clustering_type == "schedule_based":
            if self.index_to_sample_path is None:
                return "index_to_sample_path", "needed by clustering_type schedule_based"
            if self.difficulty_type == "value" and self.index_to_metric_path is None:
                return "index_to_metric_path", "needed by clustering_type schedule_based with difficulty_type value"
        return None


class DataCurriculumConfig(Block):
    enabled: bool = acts(False, "Turn the metric-based curriculum on.")
    data_cluster_path: str | None = acts(None, "Folder for the cluster files (made if absent; needed when the "
                                               "sampler runs, i.e. with training_data).")
    curriculum_metrics: dict[str, CurriculumMetricConfig] | None = acts(None, "One entry per metric.")

    @model_validator(mode="after")
    def _metrics_when_enabled(self) -> DataCurriculumConfig:
        if not self.enabled:
            return self
        if not self.curriculum_metrics:
            raise FieldProblem("curriculum_metrics", "is missing: needed when curriculum learning is enabled")
        for name, metric in self.curriculum_metrics.items():
            if (gap := metric.missing()) is not None:
                raise FieldProblem(f"curriculum_metrics.{name}.{gap[0]}", f"is missing: {gap[1]}")
        return self


class DynamicBatchingConfig(Block):
    enabled: bool = acts(False, "Batch by token count: with training_data (and data_efficiency and data_sampling "
                                "enabled) the loader packs samples into at most max_tokens tokens, and each step's LR "
                                "is scaled by its sample count; also read by "
                                "get_dataloader_and_lr_scheduler_for_variable_batch_size_deepspeed.")
    metrics_path: str | None = acts(None, "Data analyzer output folder: the lengths are read from "
                                          "<metrics_path>/seqlen/seqlen_sample_to_metric (.idx/.bin) when there; "
                                          "otherwise each sample's length is measured.")
    lr_scaling_method: Literal["linear", "sqrt", "none"] = acts(
        "linear", "LR x samples / train_batch_size (linear), x its square root (sqrt), or as scheduled (none).")
    min_batch_size: Int = acts(1, "Fewest samples in a pack; packing ends where a pack cannot reach it.", ge=0)
    max_batch_size: Int | None = acts(None, "Most samples in a pack.", ge=1)
    sequence_picking_order: Literal["random", "seqlen", "dataloader"] = acts(
        "dataloader", "Order samples are packed in: dataset order, ascending length, or shuffled by "
                      "data_efficiency.seed (reshuffled each epoch).")
    max_tokens: Int | None = acts(None, "Most tokens (summed sample lengths) in a pack; train_batch_size packs make "
                                        "a step.", ge=1)
    verbose: bool = acts(False, "Log every step's packs and every LR scaling.")

    @field_validator("lr_scaling_method", mode="before")
    @classmethod
    def _none_any_case(cls, value):
        return "none" if value is None or (isinstance(value, str) and value.lower() == "none") else value

    @model_validator(mode="after")
    def _tokens_when_enabled(self) -> DynamicBatchingConfig:
        if self.enabled and self.max_tokens is None:
            raise FieldProblem("max_tokens", "is missing: needed when dynamic batching is enabled")
        if self.max_batch_size is not None and self.min_batch_size > self.max_batch_size:
            raise FieldProblem("min_batch_size", f"{self.min_batch_size} is above max_batch_size "
                                                 f"{self.max_batch_size}: no pack could be made")
        return self


class DataSamplingConfig(Block):
    enabled: bool = acts(False, "Turn the data sampler features on.")
    num_epochs: Int = acts(1000, "The curriculum sampler stops after this many times the dataset's samples.", ge=1)
    num_workers: Int = acts(0, "Worker processes of the curriculum sampler's loader.", ge=0)
    pin_memory: bool = acts(False, "Pin the dynamic-batching loader's memory (DeepSpeed reads it there only; the "
                                   "curriculum's loader pins as the engine's other loaders do).")
    curriculum_learning: DataCurriculumConfig = acts(None, "Metric-based sample curriculum.",
                                                     default_factory=DataCurriculumConfig)
    dynamic_batching: DynamicBatchingConfig = acts(None, "Batches by token count, LR scaled per step.",
                                                   default_factory=DynamicBatchingConfig)


class RandomLTDStepConfig(Block):
    require_steps: Int | None = acts(None, "Steps from min_value to max_value.", gt=0)
    seq_per_step: Int | None = acts(None, "The kept length is rounded down to a multiple of this.", gt=0)


class RandomLTDScheduleConfig(Block):
    min_value: Int | None = acts(None, "Tokens each routed layer keeps at step 0.", gt=0)
    max_value: Int | None = acts(None, "Tokens kept at the end of the schedule (the full sequence length: from "
                                       "then on nothing is dropped).", gt=0)
    schedule_type: Literal["fixed_linear"] = acts("fixed_linear", "Kept length: linear in the step, then frozen.")
    schedule_config: RandomLTDStepConfig = acts(None, "Parameters of the schedule.",
                                                default_factory=RandomLTDStepConfig)


class LayerTokenLRConfig(Block):
    enabled: bool = refused(False, "layer-token LR schedule is not implemented (DeepSpeed raises too)")
    total_layer_tokens: Int | None = no_effect(None, "only read while enabled")
    warmup_type: str | None = no_effect(None, "only read while enabled")
    warmup_layer_tokens: Int | None = no_effect(None, "only read while enabled")


class RandomLTDConfig(Block):
    enabled: bool = acts(False, "Turn random layerwise token dropping on.")
    total_layer_num: Int | None = acts(None, "Layers of the model (must match it); weighs consumed_layer_tokens "
                                             "and layer_tokens.", ge=1)
    random_ltd_layer_num: Int | None = acts(None, "How many layers drop tokens: the length of random_ltd_layer_id.",
                                            ge=1)
    random_ltd_layer_id: list[Int] | None = acts(None, "Which layers drop tokens, counted from 0 in model order.")
    model_mask_name: str | None = acts(None, "The mask argument of layers given to convert_to_random_ltd (null: "
                                             "none); zerotrain's blocks and HF layers use their own.")
    model_type: Literal["encoder", "decoder"] | None = acts(
        None, "decoder: causal layers (kept tokens stay in order; checked against zerotrain's blocks); encoder: "
              "bidirectional.")
    hidden_state_order: Literal["batch_seq_dim", "seq_batch_dim"] | None = acts(
        None, "Layout of the layers' hidden states: [batch, seq, hidden] or [seq, batch, hidden].")
    random_ltd_schedule: RandomLTDScheduleConfig | None = acts(None, "How many tokens the routed layers keep.")
    layer_token_lr_schedule: LayerTokenLRConfig = no_effect(None, "an LR schedule by layer tokens is not "
                                                                  "implemented (DeepSpeed raises too); refused when "
                                                                  "enabled", default_factory=LayerTokenLRConfig)

    def problem(self) -> tuple[str, str] | None:
        """(key, why) of the first inconsistency of an enabled block."""
        for key in ("total_layer_num", "random_ltd_layer_num", "random_ltd_layer_id", "model_type",
                    "hidden_state_order", "random_ltd_schedule"):
            if getattr(self, key) is None:
                return key, "is missing: needed when random-LTD is enabled"
        schedule = self.random_ltd_schedule
        for key in ("min_value", "max_value"):
            if getattr(schedule, key) is None:
                return f"random_ltd_schedule.{key}", "is missing: needed when random-LTD is enabled"
        for key in ("require_steps", "seq_per_step"):
            if getattr(schedule.schedule_config, key) is None:
                return f"random_ltd_schedule.schedule_config.{key}", "is missing: needed by schedule_type fixed_linear"
        if schedule.min_value > schedule.max_value:
            return "random_ltd_schedule.min_value", (f"{schedule.min_value} is above max_value "
                                                     f"{schedule.max_value}")
        ids = self.random_ltd_layer_id
        if len(ids) != self.random_ltd_layer_num:
            return "random_ltd_layer_num", (f"{self.random_ltd_layer_num} should equal the number of "
                                            f"random_ltd_layer_id entries ({len(ids)})")
        if len(set(ids)) != len(ids) or min(ids) < 0 or max(ids) >= self.total_layer_num:
            return "random_ltd_layer_id", (f"{ids} should be distinct layer indices from 0 to total_layer_num - 1 "
                                           f"({self.total_layer_num - 1})")
        return None


class DataRoutingConfig(Block):
    enabled: bool = no_effect(False, "random-LTD is switched by random_ltd.enabled alone, as DeepSpeed reads it")
    random_ltd: RandomLTDConfig = acts(None, "Random layerwise token dropping.", default_factory=RandomLTDConfig)


class DataEfficiencyConfig(Block):
    enabled: bool = acts(False, "Turn the data sampling features on (random-LTD follows random_ltd.enabled alone, "
                                "as in DeepSpeed).")
    seed: Int = acts(1234, "Seed of the curriculum sampler's own generator (cluster shuffles, batch draws) and of "
                           "random-LTD's kept tokens.")
    data_sampling: DataSamplingConfig = acts(None, "What data is drawn.", default_factory=DataSamplingConfig)
    data_routing: DataRoutingConfig = acts(None, "Which layers see which tokens.", default_factory=DataRoutingConfig)

    @model_validator(mode="after")
    def _check_random_ltd(self) -> DataEfficiencyConfig:
        # DeepSpeed's engine switches random-LTD by random_ltd.enabled alone, whatever the switches
        # above it say; the sampling side is read only with every switch above it on.
        if (ltd := self.random_ltd_on()) is not None and (gap := ltd.problem()) is not None:
            raise FieldProblem(f"data_routing.random_ltd.{gap[0]}", gap[1])
        return self

    def random_ltd_on(self) -> RandomLTDConfig | None:
        """The random-LTD block when it is switched on, else None."""
        return self.data_routing.random_ltd if self.data_routing.random_ltd.enabled else None
