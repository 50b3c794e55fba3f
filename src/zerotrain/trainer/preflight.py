"""What the options alone decide, checked before any tokenizer, model or data file is loaded:
a mistake in the DeepSpeed config or an option costs a second, not the ~12 s of loading.

    files           data files, model folder or config, tokenizer, init_from, chat template exist
    the data plan   do_train / do_eval / do_predict have the data they need
    output_dir      not someone else's run (unless --overwrite_output_dir or resuming)
    DeepSpeed JSON  built from the options with stand-in model sizes, validated for the world size
    LR schedule     built once on a stand-in optimizer (bad lr_scheduler_kwargs fail here)

Run by the launcher before it starts any rank and by every rank before it loads anything;
the ranks also check that the nodes agree on how many they are (check_nodes).
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import torch

from ..errors import ConfigError, DataError
from .args import DataArguments, ModelArguments, TrainingArguments, check_data_plan

# sizes that stand in for the model's until it is built: only the config's validity is checked
_HIDDEN, _BLOCK, _STEPS = 64, 64, 1000


def preflight(model_args: ModelArguments, data_args: DataArguments, train_args: TrainingArguments,
              explicit: set[str], world_size: int) -> None:
    from .data.chat import check_chat_template
    from .data.tokenizer import check_tokenizer_source
    from .loop import run_folder
    from .model.build import check_init_from, check_model_source

    check_data_plan(data_args, train_args)
    for name in ("train_file", "validation_file", "test_file"):
        value = getattr(data_args, name)
        if value and not Path(value).expanduser().exists():
            raise DataError(f"{name} {value}: does not exist")
    check_model_source(model_args.model_name_or_path, model_args.model_config)
    if model_args.tokenizer_name_or_path not in (None, "", "byte"):
        check_tokenizer_source(model_args.tokenizer_name_or_path)
    if model_args.init_from:
        check_init_from(model_args.init_from)
    if model_args.task == "sft":
        check_chat_template(data_args.chat_template)
    output_dir = Path(train_args.output_dir).expanduser()
    run_folder.check_output_dir(output_dir, train_args.overwrite_output_dir, bool(train_args.resume_from_checkpoint))
    if train_args.resume_from_checkpoint:
        run_folder.resolve_resume(train_args.resume_from_checkpoint, output_dir)
    check_deepspeed_config(train_args, explicit, world_size, data_args.block_size)


def check_deepspeed_config(train_args: TrainingArguments, explicit: set[str], world_size: int,
                           block_size: int | None) -> None:
    from ..config import load_config
    from ..schedules import get_scheduler, resolve_warmup_steps
    from .ds_config import build_deepspeed_config, data_parallel_size, fill_schedule

    args = copy.copy(train_args)  # the config may adopt values into the options: not here
    data = data_parallel_size(args, explicit, world_size)  # the batch counts data-parallel ranks
    ds, uses_ds_scheduler = build_deepspeed_config(args, explicit, data, _HIDDEN, block_size or _BLOCK)
    total = args.max_steps if args.max_steps > 0 else _STEPS
    warmup = resolve_warmup_steps(total, args.warmup_steps, args.warmup_ratio)
    load_config(fill_schedule(ds, warmup, total), world_size=data)
    if uses_ds_scheduler:
        return
    stand_in = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=args.learning_rate)
    try:
        if args.lr_scheduler_type == "reduce_lr_on_plateau":
            get_scheduler(args.lr_scheduler_type, stand_in, scheduler_specific_kwargs=args.lr_scheduler_kwargs)
        else:
            get_scheduler(args.lr_scheduler_type, stand_in, warmup, total,
                          scheduler_specific_kwargs=args.lr_scheduler_kwargs)
    except (ConfigError, DataError):
        raise
    except (ValueError, TypeError) as e:
        raise ConfigError(f"lr_scheduler_type {args.lr_scheduler_type}: {e}") from None


def check_nodes(comm) -> None:
    """Every node was started with the --nnodes the job has: torchrun's static rendezvous starts
    as soon as the first node's count has arrived, so a node told another count would train in
    the wrong world, or wait forever."""
    from ..comm.launch import NNODES_ENV

    asked = os.environ.get(NNODES_ENV)
    answers = comm.all_gather_object((asked, comm.state.node))
    nodes = max(node for _, node in answers) + 1
    for rank, (count, node) in enumerate(answers):
        if count is not None and int(count.split(":")[-1]) != nodes and ":" not in count:
            raise ConfigError(f"node {node} (rank {rank}) was started with --nnodes {count}, but {nodes} node"
                              f"{'s' if nodes > 1 else ''} met at the rendezvous; start every node with --nnodes "
                              f"{nodes} (or the count you mean, on all of them)")
