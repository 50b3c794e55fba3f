"""Options from HF Trainer, TRL and LLaMA-Factory configs that zerotrain spells differently or
does not have: each is mapped, accepted with a notice that it has no effect, or refused with
the zerotrain option to use. (Renamed options with the same meaning are `aliases` of their
field in args.py: lora_target, additional_target, cutoff_len, max_seq_length, template, ...)

    refused     stage: pt      ->  "stage: use --task clm (pt) or --task sft (sft)"
    no effect   local_rank 0   ->  a notice: the rank comes from torchrun's environment
    value map   optim adamw_torch -> adamw; report_to all -> tensorboard, a list -> comma-separated
"""

from __future__ import annotations

from ..errors import ConfigError

# name -> (what to do instead, values that ask for what zerotrain does anyway and so pass quietly)
REFUSED: dict[str, tuple[str, tuple]] = {
    "stage": ("use --task clm (LLaMA-Factory's pt) or --task sft (sft)", ()),
    "finetuning_type": ("use --lora_rank N: > 0 trains LoRA adapters, 0 trains every weight", ()),
    "dataset": ("give files: --train_file PATH (and --validation_file); there is no dataset registry", ()),
    "dataset_dir": ("give files: --train_file PATH; there is no dataset registry", ()),
    "val_size": ("use --validation_split_percentage (a percent of the training rows)", ()),
    "formatting": ("use --sft_format (messages, sharegpt, prompt_completion, alpaca or auto)", ()),
    "assistant_only_loss": ("the loss covers only assistant tokens by default with --task sft; "
                            "--train_on_prompt covers every token", (True,)),
    "completion_only_loss": ("the loss covers only the completion by default with --task sft; "
                             "--train_on_prompt covers every token", (True,)),
    "plot_loss": ("run `zerotrain plot OUTPUT_DIR` (loss, eval loss, LR and feature curves)", (False,)),
    "logging_dir": ("TensorBoard events go to OUTPUT_DIR/tensorboard", ()),
    "fsdp": ("use --deepspeed with zero_optimization.stage 3 (parameters sharded)", ("", False)),
    "push_to_hub": ("zerotrain does not upload; push OUTPUT_DIR yourself", (False,)),
    "hub_model_id": ("zerotrain does not upload; push OUTPUT_DIR yourself", (None,)),
    "quantization_bit": ("quantized training is not supported; train in bf16 or fp16", (None,)),
    "flash_attn": ("the model's own attention implementation is used", ("auto", "disabled")),
    "torch_compile": ("torch.compile is not applied by zerotrain", (False,)),
    "load_best_model_at_end": ("the best checkpoint (lowest eval_loss) is named in trainer_state.json "
                               "and kept by save_total_limit; load it with --model_name_or_path", (False,)),
    "metric_for_best_model": ("the best checkpoint is the one with the lowest eval_loss", ("loss", "eval_loss")),
    "label_smoothing_factor": ("label smoothing is not supported", (0, 0.0)),
    "use_cpu": ("the device follows the machine: CUDA when torch sees a GPU, else CPU", (False,)),
    "no_cuda": ("the device follows the machine: CUDA when torch sees a GPU, else CPU", (False,)),
    "ddp_backend": ("the backend is chosen by device: nccl on GPU, gloo on CPU", (None,)),
    "tf32": ("TF32 matmuls are not switched by zerotrain; set torch.backends.cuda.matmul.allow_tf32", (None,)),
    "save_safetensors": ("weights are always written as safetensors", (True,)),
    "gradient_checkpointing_kwargs": ("--gradient_checkpointing recomputes each block (non-reentrant)", (None,)),
}

# Megatron-DeepSpeed's sample- and iteration-counted LR options: the token-based ones replace them
# (the curriculum recipe's conversion: x the full sequence length, and x the global batch for iterations)
LEGACY_TOKEN_OPTIONS: dict[str, str] = {
    "lr_decay_samples": "use --lr_decay_tokens: {value} samples x the full sequence length (block_size)",
    "lr_decay_iters": "use --lr_decay_tokens: {value} iterations x the full sequence length (block_size) x the "
                      "global batch (samples per optimizer step)",
    "rampup_batch_size": "a batch-size ramp-up is not supported; with a sequence-length curriculum the recipe "
                         "removes it (both shrink the early batches' tokens): drop it and keep a fixed batch",
    "lr_warmup_iters": "use --warmup_steps {value} (optimizer steps)",
    "lr_warmup_samples": "use --warmup_steps: {value} samples / the global batch (samples per optimizer step)",
}

# values that name what zerotrain does under another name: (the value used, the note printed)
NOTED_VALUES: dict[tuple[str, str], tuple[str, str]] = {
    ("optim", "mbgd"): ("sgd", "optim mbgd: mini-batch gradient descent is SGD over mini-batches; training with sgd"),
}

NO_EFFECT: dict[str, str] = {
    "local_rank": "the rank comes from torchrun's environment",
    "run_name": "runs are named by their output_dir",
    "remove_unused_columns": "the trainer keeps only the columns the model's forward takes",
    "include_num_input_tokens_seen": "tokens are always counted (tokens in every log record)",
    "dataloader_pin_memory": "batches are small CPU tensors copied per micro-batch",
    "logging_first_step": "the first logging step follows logging_steps",
}

VALUE_MAPS: dict[str, dict] = {
    "optim": {"adamw_torch": "adamw", "adamw_torch_fused": "adamw", "adamw_hf": "adamw",
              "adamw_apex_fused": "adamw"},
    "report_to": {"all": "tensorboard"},
}


def foreign(key: str, value) -> str | None:
    """An option zerotrain does not have under that name: a notice when it is accepted with no
    effect, None when its value is what zerotrain does anyway; a ConfigError otherwise. Names
    that are neither return a KeyError (the caller reports an unknown option)."""
    if key in NO_EFFECT:
        return f"{key}: no effect in zerotrain ({NO_EFFECT[key]})"
    legacy = key.replace("-", "_")
    if legacy in LEGACY_TOKEN_OPTIONS:
        raise ConfigError(f"{key}: not a zerotrain option; {LEGACY_TOKEN_OPTIONS[legacy].format(value=value)}")
    hint, harmless = REFUSED[key]
    if any(_means(value, h) for h in harmless):
        return None
    raise ConfigError(f"{key}: not a zerotrain option; {hint}")


def _means(value, wanted) -> bool:
    """Whether a file value or a command-line string means `wanted` (False, None, 0, "auto")."""
    text = str(value).strip().lower()
    if wanted is None:
        return value is None or text in ("none", "null")
    if isinstance(wanted, bool):
        return text in (("true", "1", "yes") if wanted else ("false", "0", "no"))
    if isinstance(wanted, (int, float)):
        try:
            return float(value) == wanted
        except (TypeError, ValueError):
            return False
    return text == wanted


def is_foreign(key: str) -> bool:
    return key in REFUSED or key in NO_EFFECT or key.replace("-", "_") in LEGACY_TOKEN_OPTIONS


def foreign_nargs(key: str) -> int:
    """How many command-line values a foreign option takes (its answer quotes them all)."""
    return 3 if key.replace("-", "_") == "rampup_batch_size" else 1


def noted_value(name: str, value) -> tuple[object, str | None]:
    """(the value zerotrain uses, a note) for a value that names one of ours differently."""
    if isinstance(value, str) and (name, value.lower()) in NOTED_VALUES:
        return NOTED_VALUES[(name, value.lower())]
    return value, None


def map_value(name: str, value):
    """HF spellings of values (optim adamw_torch, report_to all or a list of one) -> ours."""
    if name == "report_to" and isinstance(value, (list, tuple)):  # HF's list: several sinks
        return ",".join(VALUE_MAPS[name].get(v, v) if isinstance(v, str) else str(v) for v in value)
    return VALUE_MAPS.get(name, {}).get(value, value) if isinstance(value, str) else value
