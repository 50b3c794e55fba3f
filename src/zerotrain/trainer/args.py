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

TASKS = ("clm", "mlm", "classification", "sft")
SFT_FORMATS = ("auto", "messages", "sharegpt", "prompt_completion", "alpaca")
STRATEGIES = ("no", "steps", "epoch")
OPTIMIZERS = ("adamw", "adam", "sgd", "momentum")
LR_DECAY_STYLES = ("linear", "cosine", "constant", "inverse-square-root")


def _opt(default, help: str, **extra) -> Any:
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help, **extra})
    return field(default=default, metadata={"help": help, **extra})


@dataclass
class ModelArguments:
    model_name_or_path: str | None = _opt(
        None, "Model to start from: a local folder (an HF model: config.json, weights, tokenizer; or a folder "
              "written by `zerotrain train`) or a hub id (roberta-base, meta-llama/Llama-3.2-1B), read from the "
              "HF cache or downloaded as transformers does (HF_HOME, HF_HUB_OFFLINE).")
    model_revision: str = _opt("main", "The hub revision (branch, tag or commit) of a hub id's model and tokenizer.")
    trust_remote_code: bool = _opt(False, "Run the custom model and tokenizer code a model folder or hub "
                                          "snapshot carries (transformers' trust_remote_code).")
    model_config: str | None = _opt(
        None, "Train from scratch: a preset (gpt-tiny, gpt-small, bert-tiny, bert-small, bert-base, gpt2-tiny, "
              "llama-tiny) or a JSON/YAML model config file (HF config with model_type, "
              "{\"zerotrain_model\": \"gpt\"|\"bert\", ...}, or a BERT config of hidden_size, "
              "num_hidden_layers, ... as the PLD recipe writes it: the built-in Pre-LN BERT).")
    tokenizer_name_or_path: str | None = _opt(
        None, "Tokenizer folder, tokenizer.json file or hub id; default: the model's tokenizer, else "
              "a built-in byte-level tokenizer (256 bytes + special tokens).")
    task: str = _opt("clm", "What to train: clm (causal LM), mlm (masked LM), classification, or sft (supervised "
                            "fine-tuning of a causal LM on conversations or instructions).", choices=TASKS)
    init_from: str | None = _opt(
        None, "Load matching weights (strict=False) from a model or checkpoint folder after building "
              "the model, e.g. an MLM-pretrained encoder for classification; prints missing and "
              "unexpected keys.")
    lora_rank: int = _opt(0, "LoRA rank; 0 trains all weights, > 0 trains only LoRA adapters (peft).")
    lora_alpha: float | None = _opt(None, "LoRA scaling numerator (scale = alpha / rank); default 2 x rank.")
    lora_dropout: float = _opt(0.0, "Dropout on the LoRA branch input.")
    lora_target_modules: str = _opt(
        "all", "Comma list of layers to adapt: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
               "down_proj (mapped to the model's own names), the model's own module names, or all.",
        aliases=("lora_target",))
    modules_to_save: str | None = _opt(
        None, "Comma list of modules trained in full and saved with the adapter (e.g. classifier).",
        aliases=("additional_target",))


@dataclass
class DataArguments:
    train_file: str | None = _opt(
        None, "Training data: .txt (a row per line), .jsonl, .json, .csv, a folder of text files (a "
              "row per file) or a folder written by datasets' save_to_disk.")
    validation_file: str | None = _opt(None, "Evaluation data, in any format train_file takes.")
    task_name: str | None = _opt(
        None, "GLUE fine-tuning (HF run_glue): cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte or wnli; sentence pairs, "
              "STS-B regression and the GLUE metrics. Data from --data_dir, or --train_file/--validation_file with "
              "the task's columns (or sentence1/sentence2) and label. Implies --task classification.")
    data_dir: str | None = _opt(
        None, "With task_name: the task's folder as GLUE distributes it (train.tsv, dev.tsv; MNLI dev_matched.tsv "
              "and dev_mismatched.tsv), or the GLUE folder holding it.")
    test_file: str | None = _opt(None, "Data for --do_predict (test_* metrics; classification also writes "
                                       "predictions.jsonl), in any format train_file takes.")
    text_column: str = _opt("text", "Column holding the text (jsonl, json, csv, saved datasets).",
                            aliases=("dataset_text_field",))
    label_column: str = _opt("label", "Column holding the class label (classification).")
    validation_split_percentage: float = _opt(
        5.0, "Without validation_file: percent of training rows held out for evaluation (0 for none).")
    block_size: int | None = _opt(
        None, "Tokens per training sequence: clm/mlm texts are concatenated and cut into chunks of "
              "this size; classification texts and sft conversations are truncated to it. Default: "
              "min(1024, model positions).", aliases=("cutoff_len", "max_seq_length"))
    line_by_line: bool = _opt(False, "clm/mlm: keep each row as its own (truncated, padded) sequence instead "
                                     "of concatenating rows into blocks.")
    sft_format: str = _opt(
        "auto", "sft: how rows hold conversations: messages (role/content list), sharegpt (conversations of "
                "from/value), prompt_completion, alpaca (instruction/input/output), or auto (by column names).",
        choices=SFT_FORMATS)
    chat_template: str | None = _opt(
        None, "sft: Jinja chat template file, or a built-in (chatml, llama3, alpaca); default: the tokenizer's own.",
        aliases=("template",))
    train_on_prompt: bool = _opt(False, "sft: compute the loss on every token, not only the assistant's.")
    packing: bool = _opt(False, "sft: pack several examples into each block_size sequence (positions restart per "
                                "example and attention stays within it; HF models).")
    preprocessing_num_workers: int | None = _opt(None, "Processes for tokenization (datasets map num_proc).")
    max_train_samples: int | None = _opt(None, "Use at most this many training samples (after grouping).",
                                         aliases=("max_samples",))
    max_eval_samples: int | None = _opt(None, "Use at most this many evaluation samples (after grouping).")
    mlm_probability: float = _opt(0.15, "mlm: fraction of tokens masked (80% [MASK], 10% random, 10% kept).")
    cache_dir: str | None = _opt(None, "Where tokenized datasets are cached; default ~/.cache/zerotrain/datasets.")
    overwrite_cache: bool = _opt(False, "Tokenize again even if a cached result exists.")


@dataclass
class TrainingArguments:
    output_dir: str = _opt("", "Where checkpoints, metrics, plots and the final model go (required).")
    do_train: bool | None = _opt(None, "Train (default true); false with evaluation data evaluates the model only.")
    do_eval: bool | None = _opt(None, "Evaluate at the end (default: when there is evaluation data); true "
                                      "requires evaluation data.")
    do_predict: bool = _opt(False, "After training, evaluate on --test_file (test_* metrics).")
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
                  "cosine_warmup_with_min_lr, warmup_stable_decay, warmup_linear_decay_exp (the BERT PLD "
                  "recipe's; kwargs decay_rate, decay_steps; no warmup means a constant lr).")
    lr_scheduler_kwargs: dict = _opt({}, "Extra schedule arguments as JSON, e.g. {\"num_cycles\": 1}.")
    warmup_steps: float = _opt(0, "Warmup steps; a value in (0, 1) is a fraction of the total (HF 5.x).")
    warmup_ratio: float = _opt(0.0, "Warmup as a fraction of the total steps, used when warmup_steps is 0.")
    optim: str = _opt("adamw", "Optimizer: adamw, adam, sgd or momentum (SGD with momentum 0.9); mbgd "
                               "(mini-batch gradient descent) is sgd.", choices=OPTIMIZERS)
    train_tokens: int | None = _opt(
        None, "Stop once this many tokens are trained (Megatron-DeepSpeed's --train-tokens; the DeepSpeed config's "
              "token_budget.train_tokens); max_steps / num_train_epochs is then only a cap.",
        aliases=("train-tokens",))
    lr_decay_tokens: int | None = _opt(
        None, "Set the LR by tokens, as Megatron-DeepSpeed's --lr-decay-tokens (token_budget.lr_decay_tokens), "
              "instead of lr_scheduler_type: warmup over --warmup_steps steps (or --lr_warmup_tokens tokens), then "
              "decay over the tokens trained from the warmup's end to this count, then min_lr.",
        aliases=("lr-decay-tokens",))
    lr_warmup_tokens: int | None = _opt(
        None, "With lr_decay_tokens: warm the LR up over this many tokens instead of --warmup_steps.",
        aliases=("lr-warmup-tokens",))
    min_lr: float | None = _opt(None, "With lr_decay_tokens: the LR at the decay's end and after it (default 0).",
                                aliases=("min-lr",))
    lr_decay_style: str | None = _opt(
        None, "With lr_decay_tokens: the decay's shape: linear (default), cosine, constant or inverse-square-root.",
        choices=LR_DECAY_STYLES, aliases=("lr-decay-style",))
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
    resume_from_checkpoint: str | None = _opt(None, "Continue a run: a checkpoint folder, or `latest` for the newest "
                                                    "one in output_dir.")
    gradient_checkpointing: bool = _opt(False, "Recompute each block's activations in backward to save memory.")
    pipeline_parallel_size: int = _opt(1, "Pipeline stages: the model's blocks are split into this many stages "
                                          "(embedding first, head last); with --tensor_parallel_size each stage's "
                                          "projections are split too; processes = data parallel x stages x tensor.")
    tensor_parallel_size: int = _opt(1, "Tensor-parallel ranks: each block's attention and MLP projections are split "
                                        "across them (DeepSpeed's tensor_parallel.autotp_size), in every stage.")
    sequence_parallel_size: int = _opt(1, "Ulysses sequence-parallel ranks S: each holds 1/S of every sequence (padded "
                                          "to a multiple of S); causal decoders only; processes = data parallel x S.")
    ddp_timeout: int = _opt(1800, "Seconds a collective may wait before the process group gives up.")
    ddp_find_unused_parameters: bool | None = _opt(
        None, "Allow parameters that get no gradient in a step (default true); false makes such a "
              "parameter an error naming it.")
    group_by_length: bool = _opt(False, "Batch samples of similar length together to cut padding.")
    dataloader_num_workers: int = _opt(0, "Worker processes loading batches (0: in the main process).")
    deepspeed: Any = _opt(
        None, "DeepSpeed config: a JSON file, a JSON string or (in a YAML file) a mapping. \"auto\" "
              "values are filled from these options; values that contradict them are errors.")
    report_to: str = _opt("tensorboard", "Metric sinks besides metrics.jsonl, comma-separated: tensorboard, csv, "
                                         "wandb, mlflow, comet_ml (the last three: pip install zerotrain[wandb], "
                                         "[mlflow], [comet]) or none.",
                          choices=("tensorboard", "csv", "wandb", "mlflow", "comet_ml", "none"))
    disable_tqdm: bool = _opt(False, "Print log lines only, no progress bar.")
    save_on_interrupt: bool = _opt(True, "On Ctrl-C or SIGTERM, save a checkpoint at the step where every "
                                         "process stops (false: name the last one saved).")

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
                 "logging_steps", "save_steps", "ddp_timeout", "pipeline_parallel_size",
                 "tensor_parallel_size", "sequence_parallel_size"):
        value = getattr(args, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{name}: should be a positive integer, got {value!r}")
    from .report.metrics_log import report_names

    report_names(args.report_to)
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
    for name in ("train_tokens", "lr_decay_tokens", "lr_warmup_tokens", "min_lr"):
        value = getattr(args, name)
        low = 1 if name in ("train_tokens", "lr_decay_tokens") else 0
        if value is not None and (isinstance(value, bool) or not math.isfinite(value) or value < low):
            raise ConfigError(f"{name}: should be a number >= {low}, got {value!r}")
    if args.lr_decay_style is not None and args.lr_decay_style not in LR_DECAY_STYLES:
        raise ConfigError(f"lr_decay_style: should be one of {', '.join(LR_DECAY_STYLES)}, got "
                          f"{args.lr_decay_style!r}{did_you_mean(str(args.lr_decay_style), LR_DECAY_STYLES)}")
    if args.fp16 and args.bf16:
        raise ConfigError("fp16 and bf16 are both set; choose one")
    if args.max_steps == 0 or (args.max_steps < 0 and args.num_train_epochs == 0):
        raise ConfigError("nothing to train: set max_steps > 0 or num_train_epochs > 0")
    if args.lr_scheduler_type == "reduce_lr_on_plateau" and args.eval_strategy == "no":
        raise ConfigError("lr_scheduler_type reduce_lr_on_plateau is driven by the eval loss; set "
                          "eval_strategy to steps or epoch")
    if not isinstance(args.lr_scheduler_kwargs, dict):
        raise ConfigError(f"lr_scheduler_kwargs: should be a JSON object, got {args.lr_scheduler_kwargs!r}")
    if args.do_eval is False and args.eval_strategy != "no":
        raise ConfigError(f"do_eval false and eval_strategy {args.eval_strategy} contradict; drop one")
    if args.do_train is False and args.resume_from_checkpoint:
        raise ConfigError("resume_from_checkpoint continues training, and do_train is false; evaluate a "
                          "checkpoint with --model_name_or_path CHECKPOINT_DIR --do_train false")
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


def build(values: dict, explicit: set[str] | None = None,
          notices: list[str] | None = None) -> tuple[ModelArguments, DataArguments, TrainingArguments]:
    """Option name -> value (strings from the CLI or typed values from a file) -> the three
    dataclasses. Unknown names are errors with a did-you-mean; HF / LLaMA-Factory names
    zerotrain lacks are refused naming ours, or accepted with a line in `notices`
    (hf_options.py); `explicit` collects the names the user set (the DeepSpeed config may
    only disagree with options left at defaults)."""
    from . import hf_options

    known = {name: (cls, f) for cls in ALL for name, f in fields_of(cls).items()}
    alias = aliases()
    per_class: dict[type, dict] = {cls: {} for cls in ALL}
    for key, value in values.items():
        name = alias.get(key, key)
        if name not in known:
            if hf_options.is_foreign(key):
                note = hf_options.foreign(key, value)
                if note and notices is not None:
                    notices.append(note)
                continue
            raise ConfigError(f"{key}: unknown option{did_you_mean(key, list(known) + list(alias))}")
        cls, f = known[name]
        if name in per_class[cls] and key in alias:
            raise ConfigError(f"{key} and {name} set the same option; keep {name}")
        value, note = hf_options.noted_value(name, value)
        if note and notices is not None:
            notices.append(note)
        per_class[cls][name] = convert(key, f, hf_options.map_value(name, value))
        if explicit is not None:
            explicit.add(name)
    if per_class[DataArguments].get("task_name") and "task" not in per_class[ModelArguments]:
        per_class[ModelArguments]["task"] = "classification"  # run_glue: the task name says what is trained
    model, data = ModelArguments(**per_class[ModelArguments]), DataArguments(**per_class[DataArguments])
    training = TrainingArguments(**per_class[TrainingArguments])
    if not training.output_dir:
        raise ConfigError("output_dir is required: pass --output_dir DIR")
    check_together(model, data, training)
    return model, data, training


def check_together(model: ModelArguments, data: DataArguments, training: TrainingArguments) -> None:
    """Checks across the three groups that need nothing loaded."""
    for name, choices, value in (("task", TASKS, model.task), ("sft_format", SFT_FORMATS, data.sft_format)):
        if value not in choices:
            raise ConfigError(f"{name}: should be one of {', '.join(choices)}, got {value!r}"
                              f"{did_you_mean(str(value), choices)}")
    if model.task != "sft":
        for name in ("train_on_prompt", "packing"):
            if getattr(data, name):
                raise ConfigError(f"{name} is for --task sft (this run's task is {model.task})")
        if data.chat_template is not None:
            raise ConfigError(f"chat_template is for --task sft (this run's task is {model.task})")
    from .data.glue_tasks import check_glue_options

    check_glue_options(data, model.task, training.do_train is not False)
    if data.task_name and training.do_predict and data.data_dir:
        raise ConfigError("do_predict with data_dir: GLUE's test.tsv files have no labels to score; evaluate on the "
                          "dev files (do_eval), or give --train_file/--validation_file/--test_file with labels")
    if model.lora_rank < 0:
        raise ConfigError(f"lora_rank: should be >= 0, got {model.lora_rank}")
    if not 0.0 <= model.lora_dropout < 1.0:
        raise ConfigError(f"lora_dropout: should be in [0, 1), got {model.lora_dropout}")
    if model.modules_to_save and model.lora_rank == 0:
        raise ConfigError("modules_to_save needs LoRA: set --lora_rank > 0")
    if model.model_name_or_path and model.model_config:
        raise ConfigError("model_name_or_path and model_config both given: start from a folder or from a "
                          "config, not both")
    if training.do_predict and not data.test_file:
        raise ConfigError("do_predict needs --test_file PATH")
    if data.test_file and not training.do_predict:
        raise ConfigError("test_file is read only with --do_predict; add it or drop test_file")


def check_data_plan(data: DataArguments, training: TrainingArguments) -> None:
    """The data files asked for match what the run will do (train, evaluate, predict)."""
    trains = training.do_train is not False
    has_eval = bool(data.validation_file) or (bool(data.train_file) and data.validation_split_percentage > 0) \
        or bool(data.data_dir)
    if trains and not (data.train_file or data.data_dir):
        raise ConfigError("train_file is required: pass --train_file PATH (or --do_train false to evaluate only)")
    if not trains and not (has_eval or training.do_predict):
        raise ConfigError("do_train false leaves nothing to do: pass --validation_file (or --train_file with "
                          "validation_split_percentage > 0) to evaluate, or --do_predict with --test_file")
    if (training.eval_strategy != "no" or training.do_eval) and not has_eval:
        what = f"eval_strategy {training.eval_strategy}" if training.eval_strategy != "no" else "do_eval"
        raise ConfigError(f"{what} needs evaluation data: pass --validation_file or a validation_split_percentage "
                          "that leaves at least one sample")
