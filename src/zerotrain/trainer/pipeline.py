"""`zerotrain train` on one rank: tokenizer -> model -> data -> LoRA -> Trainer.

The order matters: the data sets the number of labels a classifier needs and the block size
the model must hold, the seed is set before any weight is drawn, and LoRA goes on after
`init_from` so the adapter sits on the loaded weights.
"""

from __future__ import annotations

from ..comm import Comm, init_parallel
from ..errors import ConfigError
from .args import DataArguments, ModelArguments, TrainingArguments


def run(model_args: ModelArguments, data_args: DataArguments, train_args: TrainingArguments,
        explicit: set[str] | None = None, callbacks=()) -> dict:
    from .data.prepare import prepare
    from .data.tokenizer import load_tokenizer
    from .loop.trainer import Trainer, set_seed
    from .model import build as models

    comm = Comm(init_parallel(timeout_s=train_args.ddp_timeout))
    tokenizer = load_tokenizer(model_args.tokenizer_name_or_path, model_args.model_name_or_path)
    positions = models.positions_hint(model_args.model_name_or_path, model_args.model_config)
    data = prepare(model_args, data_args, train_args.seed, tokenizer, positions, comm)
    num_labels = len(data.labels) if data.labels else None
    set_seed(train_args.seed)
    model, info = models.build_model(model_args.model_name_or_path, model_args.model_config, model_args.task,
                                     tokenizer, num_labels)
    if info.max_positions is not None and data.block_size > info.max_positions:
        raise ConfigError(f"block_size {data.block_size} is larger than the model's {info.max_positions} "
                          f"positions; use --block_size {info.max_positions} or less")
    if model_args.init_from:
        models.init_from(model, model_args.init_from, comm.rank)
    lora_config = None
    if model_args.lora_rank > 0:
        from .model.lora import apply_lora, count_parameters

        family = "zerotrain" if info.kind in ("gpt", "bert") else info.config.get("model_type", "")
        lora_config = apply_lora(model, family, model_args.lora_rank, model_args.lora_alpha,
                                 model_args.lora_dropout, model_args.lora_target_modules, model_args.modules_to_save)
        lora_config.update(task=model_args.task, num_labels=num_labels)
        trainable, total = count_parameters(model)
        if comm.rank == 0:
            print(f"LoRA rank {model_args.lora_rank} on {', '.join(lora_config['target_modules'])}: "
                  f"{trainable:,} trainable of {total:,} parameters ({100 * trainable / total:.2f}%)", flush=True)
    elif model_args.modules_to_save:
        raise ConfigError("modules_to_save needs LoRA: set --lora_rank > 0")
    if comm.rank == 0:
        n = sum(p.numel() for p in model.parameters())
        print(f"model {type(model).__name__} ({n / 1e6:.2f}M parameters), task {model_args.task}, "
              f"{len(data.train)} training samples of up to {data.block_size} tokens"
              f"{f', {len(data.eval)} eval samples' if data.eval is not None else ''}, "
              f"{comm.world_size} process{'es' if comm.world_size > 1 else ''}", flush=True)
    if train_args.eval_strategy != "no" and data.eval is None:
        raise ConfigError(f"eval_strategy {train_args.eval_strategy} needs evaluation data: pass --validation_file "
                          "or a validation_split_percentage that leaves at least one sample")
    trainer = Trainer(model, train_args, data.train, data.eval, task=model_args.task, tokenizer=tokenizer,
                      model_info=info, lora_config=lora_config, base_model=model_args.model_name_or_path,
                      num_labels=num_labels, block_size=data.block_size, mlm_probability=data_args.mlm_probability,
                      callbacks=callbacks, explicit=explicit)
    return trainer.train()
