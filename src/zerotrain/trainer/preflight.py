"""What the options alone decide, checked before any tokenizer, model or data file is loaded:
a mistake in the DeepSpeed config or an option costs a second, not the ~12 s of loading.

    files           data files, model folder or config, tokenizer, init_from, chat template exist
                    (a hub id is fetched into the HF cache here, before any rank starts);
                    report_to's packages are installed
    the data plan   do_train / do_eval / do_predict have the data they need
    the run plan    (plan.py) output_dir not someone else's run (unless --overwrite_output_dir
                    or resuming); the DeepSpeed config built from the options, typed and
                    validated for the world size; the data_efficiency block's batches agree
                    with the options; a `custom` curriculum schedule has someone to set its
                    function (a callback; the command line has none)
    LR schedule     built once on a stand-in optimizer (bad lr_scheduler_kwargs fail here)

Run by the launcher before it starts any rank, and by every rank before it loads anything:
the rank's plan is the one its Trainer runs. The ranks also check that the nodes agree on how
many they are (check_nodes).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ..errors import ConfigError, DataError
from .args import TrainingArguments, check_data_plan
from .plan import STAND_IN_STEPS, Options, RunPlan, plan_run


def preflight(options: Options, world_size: int, comm=None, callbacks: bool = False) -> RunPlan:
    """The run plan for these options on `world_size` processes (`comm`: this rank's), once
    every file they name exists. `callbacks`: the run has Python callbacks, which may set a
    custom curriculum schedule's function."""
    from .data.chat import check_chat_template
    from .data.efficiency import sampling_kind
    from .data.tokenizer import check_tokenizer_source
    from .model.build import check_init_from, check_model_source
    from .report.metrics_log import check_report_to

    model_args, data_args, train_args = options.model, options.data, options.training
    check_data_plan(data_args, train_args)
    check_report_to(train_args.report_to)
    for name in ("train_file", "validation_file", "test_file"):
        value = getattr(data_args, name)
        if value and not Path(value).expanduser().exists():
            raise DataError(f"{name} {value}: does not exist")
    check_model_source(model_args.model_name_or_path, model_args.model_config, model_args.model_revision)
    if model_args.tokenizer_name_or_path not in (None, "", "byte"):
        check_tokenizer_source(model_args.tokenizer_name_or_path, model_args.model_revision)
    if model_args.init_from:
        check_init_from(model_args.init_from)
    if model_args.task == "sft":
        check_chat_template(data_args.chat_template)
    plan = check_deepspeed_config(train_args, options.explicit, world_size, data_args.block_size, comm=comm,
                                  model_options=model_args, data_options=data_args)
    sampling_kind(plan)  # the data_efficiency block's batches against the options (data/efficiency.py)
    if not callbacks and train_args.do_train is not False:
        refuse_custom_schedules(plan.config)
    return plan


def custom_schedules(cfg) -> list[str]:
    """The enabled curriculum schedules of schedule_type custom, by their config path: the
    difficulty is a Python function (engine.set_custom_curriculum_learning_schedule)."""
    from ..data.curriculum_loader import curriculum_sampling_on

    found = []
    legacy = cfg.curriculum_learning
    if legacy is not None and legacy.enabled and legacy.schedule_type == "custom":
        found.append("curriculum_learning")
    if curriculum_sampling_on(cfg):
        metrics = cfg.data_efficiency.data_sampling.curriculum_learning.curriculum_metrics or {}
        found += [f"data_efficiency.data_sampling.curriculum_learning.curriculum_metrics.{name}"
                  for name, spec in metrics.items() if spec.schedule_type == "custom"]
    return found


def refuse_custom_schedules(cfg) -> None:
    """`zerotrain train` has no Python to set a custom schedule's function: without this line
    the run would load everything and fail at its first batch."""
    found = custom_schedules(cfg)
    if found:
        its = "its difficulty function" if len(found) == 1 else "their difficulty functions"
        raise ConfigError(f"{', '.join(f'{path}.schedule_type' for path in found)} custom: the command line cannot "
                          f"set {its}; use fixed_linear, fixed_root or fixed_discrete, or train from Python and call "
                          "engine.set_custom_curriculum_learning_schedule(fn) (with zerotrain.Trainer: "
                          "trainer.engine's, in a callback's on_train_begin)")


def check_deepspeed_config(train_args: TrainingArguments, explicit: set[str], world_size: int,
                           block_size: int | None, **plan_options) -> RunPlan:
    """The run plan (plan_run), with the LR schedule it asks for built on a stand-in optimizer."""
    from ..schedules import get_scheduler, resolve_warmup_steps

    plan = plan_run(train_args, explicit, world_size, block_size=block_size, **plan_options)
    if plan.built.uses_ds_scheduler:
        return plan
    args = plan.options
    total = args.max_steps if args.max_steps > 0 else STAND_IN_STEPS
    warmup = resolve_warmup_steps(total, args.warmup_steps, args.warmup_ratio)
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
    return plan


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
