"""The options of `zerotrain train`, with HF TrainingArguments' names and meanings.

Three dataclasses, as HF's example scripts split them: what to train (`ModelArguments`), on
what (`DataArguments`), and how (`TrainingArguments`). Each field's `help` is its CLI help
and its error text, so the docs live in one place. `parse_args` reads a YAML/JSON file of
options first and lets the command line override it; every mistake is one ConfigError line.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError, did_you_mean

TASKS = ("clm", "mlm", "classification")
STRATEGIES = ("no", "steps", "epoch")
OPTIMIZERS = ("adamw", "adam", "sgd", "momentum")


def _opt(default, help: str, **extra) -> Any:
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help, **extra})
    return field(default=default, metadata={"help": help, **extra})


@dataclass
class ModelArguments:
    model_name_or_path: str | None = _opt(
        None, "Local model folder to start from: an HF model (config.json, weights, tokenizer) or a "
              "folder written by `zerotrain train`.")
    model_config: str | None = _opt(
        None, "Train from scratch: a preset (gpt-tiny, gpt-small, bert-tiny, bert-small, gpt2-tiny, "
              "llama-tiny) or a JSON/YAML model config file (HF config with model_type, or "
              "{\"zerotrain_model\": \"gpt\"|\"bert\", ...}).")
    tokenizer_name_or_path: str | None = _opt(
        None, "Tokenizer folder or tokenizer.json file; default: the model folder's tokenizer, else "
              "a built-in byte-level tokenizer (256 bytes + special tokens).")
    task: str = _opt("clm", "What to train: clm (causal LM), mlm (masked LM) or classification.", choices=TASKS)
    init_from: str | None = _opt(
        None, "Load matching weights (strict=False) from a model or checkpoint folder after building "
              "the model, e.g. an MLM-pretrained encoder for classification; prints missing and "
              "unexpected keys.")
    lora_rank: int = _opt(0, "LoRA rank; 0 trains all weights, > 0 trains only LoRA adapters (peft).")
    lora_alpha: float | None = _opt(None, "LoRA scaling numerator (scale = alpha / rank); default 2 x rank.")
    lora_dropout: float = _opt(0.0, "Dropout on the LoRA branch input.")
    lora_target_modules: str = _opt(
        "all", "Comma list of layers to adapt: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
               "down_proj (mapped to the model's own names), the model's own module names, or all.")
    modules_to_save: str | None = _opt(
        None, "Comma list of modules trained in full and saved with the adapter (e.g. classifier).")


@dataclass
class DataArguments:
    train_file: str | None = _opt(
        None, "Training data: .txt (a row per line), .jsonl, .json, .csv, a folder of text files (a "
              "row per file) or a folder written by datasets' save_to_disk.")
    validation_file: str | None = _opt(None, "Evaluation data, in any format train_file takes.")
    text_column: str = _opt("text", "Column holding the text (jsonl, json, csv, saved datasets).")
    label_column: str = _opt("label", "Column holding the class label (classification).")
    validation_split_percentage: float = _opt(
        5.0, "Without validation_file: percent of training rows held out for evaluation (0 for none).")
    block_size: int | None = _opt(
        None, "Tokens per training sequence: clm/mlm texts are concatenated and cut into chunks of "
              "this size; classification texts are truncated to it. Default: min(1024, model positions).")
    line_by_line: bool = _opt(False, "clm/mlm: keep each row as its own (truncated, padded) sequence instead "
                                     "of concatenating rows into blocks.")
    preprocessing_num_workers: int | None = _opt(None, "Processes for tokenization (datasets map num_proc).")
    max_train_samples: int | None = _opt(None, "Use at most this many training samples (after grouping).")
    max_eval_samples: int | None = _opt(None, "Use at most this many evaluation samples (after grouping).")
    mlm_probability: float = _opt(0.15, "mlm: fraction of tokens masked (80% [MASK], 10% random, 10% kept).")
    cache_dir: str | None = _opt(None, "Where tokenized datasets are cached; default ~/.cache/zerotrain/datasets.")
    overwrite_cache: bool = _opt(False, "Tokenize again even if a cached result exists.")


@dataclass
class TrainingArguments:
    output_dir: str = _opt("", "Where checkpoints, metrics, plots and the final model go (required).")
    overwrite_output_dir: bool = _opt(False, "Allow writing into an output_dir that already holds a run.")
    per_device_train_batch_size: int = _opt(8, "Samples per forward on each process (micro-batch).")
    per_device_eval_batch_size: int = _opt(8, "Samples per evaluation forward on each process.")
    gradient_accumulation_steps: int = _opt(1, "Micro-batches summed into each optimizer step.")
    learning_rate: float = _opt(5e-5, "Peak learning rate.")
    weight_decay: float = _opt(0.0, "Decoupled weight decay (adamw) or L2 penalty (adam, sgd).")
    adam_beta1: float = _opt(0.9, "Adam beta1.")
    adam_beta2: float = _opt(0.999, "Adam beta2.")
    adam_epsilon: float = _opt(1e-8, "Adam epsilon.")
    max_grad_norm: float = _opt(1.0, "Clip the global gradient L2 norm to this; 0 disables clipping.")
    num_train_epochs: float = _opt(3.0, "Epochs to train (fractions allowed) when max_steps is not set.")
    max_steps: int = _opt(-1, "Optimizer steps to train; > 0 overrides num_train_epochs.")
    lr_scheduler_type: str = _opt(
        "linear", "HF schedule: linear, cosine, cosine_with_restarts, polynomial, constant, "
                  "constant_with_warmup, inverse_sqrt, reduce_lr_on_plateau, cosine_with_min_lr, "
                  "cosine_warmup_with_min_lr, warmup_stable_decay.")
    lr_scheduler_kwargs: dict = _opt({}, "Extra schedule arguments as JSON, e.g. {\"num_cycles\": 1}.")
    warmup_steps: float = _opt(0, "Warmup steps; a value in (0, 1) is a fraction of the total (HF 5.x).")
    warmup_ratio: float = _opt(0.0, "Warmup as a fraction of the total steps, used when warmup_steps is 0.")
    optim: str = _opt("adamw", "Optimizer: adamw, adam, sgd or momentum (SGD with momentum 0.9).",
                      choices=OPTIMIZERS)
    fp16: bool = _opt(False, "Train in fp16 with dynamic loss scaling.")
    bf16: bool = _opt(False, "Train in bfloat16.")
    seed: int = _opt(42, "Seed for weights, data order, masking and dropout.")
    logging_steps: int = _opt(10, "Log loss, lr and throughput every this many optimizer steps.")
    eval_strategy: str = _opt("no", "When to evaluate: no, steps (every eval_steps) or epoch.",
                              choices=STRATEGIES, aliases=("evaluation_strategy",))
    eval_steps: int | None = _opt(None, "Evaluate every this many steps (eval_strategy steps); default logging_steps.")
    save_strategy: str = _opt("steps", "When to save a checkpoint: no, steps (every save_steps) or epoch.",
                              choices=STRATEGIES)
    save_steps: int = _opt(500, "Save a checkpoint every this many steps (save_strategy steps).")
    save_total_limit: int | None = _opt(None, "Keep at most this many checkpoints (the best one is never deleted).")
    resume_from_checkpoint: str | None = _opt(
        None, "Continue a run: a checkpoint folder, or `latest` for the newest one in output_dir.")
    gradient_checkpointing: bool = _opt(False, "Recompute each block's activations in backward to save memory.")
    pipeline_parallel_size: int = _opt(1, "Pipeline stages: the model's blocks are split into this many stages "
                                          "(embedding first, head last); processes = data parallel x stages.")
    ddp_timeout: int = _opt(1800, "Seconds a collective may wait before the process group gives up.")
    ddp_find_unused_parameters: bool | None = _opt(
        None, "Allow parameters that get no gradient in a step (default true); false makes such a "
              "parameter an error naming it.")
    group_by_length: bool = _opt(False, "Batch samples of similar length together to cut padding.")
    dataloader_num_workers: int = _opt(0, "Worker processes loading batches (0: in the main process).")
    deepspeed: Any = _opt(
        None, "DeepSpeed config: a JSON file, a JSON string or (in a YAML file) a mapping. \"auto\" "
              "values are filled from these options; values that contradict them are errors.")
    report_to: str = _opt("tensorboard", "Metric sinks besides metrics.jsonl: tensorboard or none.",
                          choices=("tensorboard", "none"))
    disable_tqdm: bool = _opt(False, "Print log lines only, no progress bar.")

    def __post_init__(self):
        check_training_arguments(self)


ALL = (ModelArguments, DataArguments, TrainingArguments)


def fields_of(cls) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def aliases() -> dict[str, str]:
    """Accepted old spellings -> field name (evaluation_strategy -> eval_strategy)."""
    return {a: f.name for cls in ALL for f in dataclasses.fields(cls) for a in f.metadata.get("aliases", ())}


def check_training_arguments(args: TrainingArguments) -> None:
    """Checks that need only these options; the Trainer checks the rest against model and data."""
    for name in ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps",
                 "logging_steps", "save_steps", "ddp_timeout", "pipeline_parallel_size"):
        value = getattr(args, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{name}: should be a positive integer, got {value!r}")
    for name in ("eval_steps", "save_total_limit"):
        value = getattr(args, name)
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ConfigError(f"{name}: should be a positive integer, got {value!r}")
    for name in ("learning_rate", "weight_decay", "adam_epsilon", "max_grad_norm", "num_train_epochs"):
        value = getattr(args, name)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
            raise ConfigError(f"{name}: should be a finite number >= 0, got {value!r}")
    for name in ("adam_beta1", "adam_beta2"):
        if not 0.0 <= getattr(args, name) < 1.0:
            raise ConfigError(f"{name}: should be in [0, 1), got {getattr(args, name)}")
    for name, choices in (("eval_strategy", STRATEGIES), ("save_strategy", STRATEGIES), ("optim", OPTIMIZERS)):
        value = getattr(args, name)
        if value not in choices:
            raise ConfigError(f"{name}: should be one of {', '.join(choices)}, got {value!r}"
                              f"{did_you_mean(str(value), choices)}")
    if args.fp16 and args.bf16:
        raise ConfigError("fp16 and bf16 are both set; choose one")
    if args.max_steps == 0 or (args.max_steps < 0 and args.num_train_epochs == 0):
        raise ConfigError("nothing to train: set max_steps > 0 or num_train_epochs > 0")
    if args.lr_scheduler_type == "reduce_lr_on_plateau" and args.eval_strategy == "no":
        raise ConfigError("lr_scheduler_type reduce_lr_on_plateau is driven by the eval loss; set "
                          "eval_strategy to steps or epoch")
    if not isinstance(args.lr_scheduler_kwargs, dict):
        raise ConfigError(f"lr_scheduler_kwargs: should be a JSON object, got {args.lr_scheduler_kwargs!r}")
    if args.eval_steps is None:
        args.eval_steps = args.logging_steps


# ---- parsing --------------------------------------------------------------------------------
def _type_of(f: dataclasses.Field) -> str:
    return str(f.type).replace("typing.", "").replace(" ", "")


def convert(name: str, f: dataclasses.Field, value: Any) -> Any:
    """A CLI string or a file value -> the field's type; a bad value is a ConfigError."""
    kind = _type_of(f)
    if value is None or (isinstance(value, str) and value.lower() in ("none", "null") and "None" in kind):
        if "None" in kind or f.default is None:
            return None
        raise ConfigError(f"{name}: needs a value")
    try:
        if kind.startswith("bool"):
            if isinstance(value, bool):
                return value
            text = str(value).lower()
            if text in ("true", "1", "yes"):
                return True
            if text in ("false", "0", "no"):
                return False
            raise ValueError
        if kind.startswith("int"):
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if kind.startswith("float"):
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if kind.startswith("dict"):
            value = json.loads(value) if isinstance(value, str) else value
            if not isinstance(value, dict):
                raise ValueError
            return value
        if kind == "Any":
            if isinstance(value, str) and value.lstrip().startswith("{"):
                return json.loads(value)
            return value
        return str(value)
    except (ValueError, TypeError):
        raise ConfigError(f"{name}: cannot read {value!r} as {kind.split('|')[0]}") from None


def read_options_file(path: str) -> dict:
    """A YAML or JSON mapping of option names to values."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{path}: options file not found")
    try:
        text = p.read_text(encoding="utf-8")
        if p.suffix == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    except Exception as e:  # yaml and json errors carry the line in their text
        raise ConfigError(f"{path}: cannot parse: {str(e).splitlines()[0]}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level should be a mapping of option names to values")
    return data


def build(values: dict, explicit: set[str] | None = None) -> tuple[ModelArguments, DataArguments, TrainingArguments]:
    """Option name -> value (strings from the CLI or typed values from a file) -> the three
    dataclasses. Unknown names are errors with a did-you-mean; `explicit` collects the names
    the user set (the DeepSpeed config may only disagree with options left at defaults)."""
    known = {name: (cls, f) for cls in ALL for name, f in fields_of(cls).items()}
    alias = aliases()
    per_class: dict[type, dict] = {cls: {} for cls in ALL}
    for key, value in values.items():
        name = alias.get(key, key)
        if name not in known:
            raise ConfigError(f"{key}: unknown option{did_you_mean(key, list(known) + list(alias))}")
        cls, f = known[name]
        if name in per_class[cls] and key in alias:
            raise ConfigError(f"{key} and {name} set the same option; keep {name}")
        per_class[cls][name] = convert(key, f, value)
        if explicit is not None:
            explicit.add(name)
    model, data = ModelArguments(**per_class[ModelArguments]), DataArguments(**per_class[DataArguments])
    training = TrainingArguments(**per_class[TrainingArguments])
    if not training.output_dir:
        raise ConfigError("output_dir is required: pass --output_dir DIR")
    return model, data, training
