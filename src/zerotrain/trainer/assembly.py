"""`zerotrain train` on one rank: process group -> run plan -> tokenizer -> data -> model ->
LoRA -> Trainer.

    init_parallel           joins the process group, once (the Trainer reuses this Comm)
    preflight -> RunPlan    options, files, run folder, DeepSpeed config: checked and built once
    tokenizer, data         the data sets the labels a classifier needs and the block size the
                            model must hold
    model                   built after the seed is set; under ZeRO-3 straight into each rank's
                            share, in the compute dtype (read from the plan's typed config)
    init_from, LoRA         LoRA goes on after init_from so the adapter sits on the loaded weights
    Trainer(model, plan)    the engine, the loader, the loop
"""

from __future__ import annotations

import dataclasses

from ..comm import Comm, init_parallel
from ..errors import ConfigError
from .plan import Options


def run(options: Options, callbacks=()) -> dict:
    from .data.prepare import prepare
    from .data.tokenizer import load_tokenizer
    from .loop.trainer import Trainer, set_seed
    from .model import build as models

    from .loop.glue_metrics import glue_metrics
    from .preflight import check_nodes, preflight
    from ..zero.offload.host_memory import return_large_blocks

    model_args, data_args, train_args = options.model, options.data, options.training
    comm = Comm(init_parallel(timeout_s=train_args.ddp_timeout))
    check_nodes(comm)
    plan = preflight(options, comm.world_size, comm=comm, callbacks=bool(callbacks))
    train_args = plan.options
    revision, remote_code = model_args.model_revision, model_args.trust_remote_code
    tokenizer = load_tokenizer(model_args.tokenizer_name_or_path, model_args.model_name_or_path, revision, remote_code)
    positions = models.positions_hint(model_args.model_name_or_path, model_args.model_config, revision)
    data = prepare(model_args, data_args, train_args.seed, tokenizer, positions, comm,
                   need_train=train_args.do_train is not False)
    num_labels = 1 if data.regression else len(data.labels) if data.labels else None
    set_seed(train_args.seed)
    partition = models.Partition(comm.rank, comm.world_size, plan.compute_dtype) if plan.zero_stage == 3 else None
    if partition is not None and plan.offloads:
        return_large_blocks()  # before the streamed load, whose temporaries would stay resident (host_memory.py)
    model, info = models.build_model(model_args.model_name_or_path, model_args.model_config, model_args.task,
                                     tokenizer, num_labels, partition, revision=revision,
                                     trust_remote_code=remote_code)
    if info.max_positions is not None and data.block_size > info.max_positions:
        raise ConfigError(f"block_size {data.block_size} is larger than the model's {info.max_positions} "
                          f"positions; use --block_size {info.max_positions} or less")
    if model_args.init_from:
        models.init_from(model, model_args.init_from, comm.rank, comm.world_size)
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
    train = data.train if train_args.do_train is not False else None
    if comm.rank == 0:
        counts = [f"{len(ds)} {name} samples" for name, ds in (("training", train), ("eval", data.eval),
                                                                ("test", data.test)) if ds is not None]
        print(f"data: {', '.join(counts)} of up to {data.block_size} tokens", flush=True)
        for note in data.notes:
            print(f"zerotrain: note: {note}", flush=True)
    if (train_args.eval_strategy != "no" or train_args.do_eval) and data.eval is None:
        what = f"eval_strategy {train_args.eval_strategy}" if train_args.eval_strategy != "no" else "do_eval"
        raise ConfigError(f"{what} needs evaluation data: pass --validation_file or a validation_split_percentage "
                          "that leaves at least one sample")
    trainer = Trainer(model, plan, tokenizer=tokenizer, callbacks=callbacks,
                      model_info=dataclasses.replace(info, lora_config=lora_config),
                      data=dataclasses.replace(data, train=train),
                      compute_metrics=glue_metrics(data_args.task_name) if data_args.task_name else None)
    return trainer.train()
