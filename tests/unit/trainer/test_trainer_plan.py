"""The run plan: made once by preflight, read by the assembly and the Trainer; the typed config
read for every decision; callbacks as TrainerCallback subclasses."""

from __future__ import annotations

import sys

import pytest
import torch
from trainer_helpers import options, run, write_text

import zerotrain.commands.train  # noqa: F401  (every module a run calls through, loaded before counting)
import zerotrain.trainer.assembly  # noqa: F401
from zerotrain.comm import init_parallel
from zerotrain.errors import ConfigError
from zerotrain.trainer import Trainer, TrainerCallback, TrainingArguments
from zerotrain.trainer.ds_config import build_deepspeed_config
from zerotrain.trainer.loop import run_folder
from zerotrain.trainer.model import build as models
from zerotrain.trainer.plan import plan_run
from zerotrain.trainer.preflight import preflight


def count_calls(monkeypatch, func) -> list:
    """Wrap `func` wherever a zerotrain module holds it; the list collects (calling module,
    result) for each call."""
    results = []

    def counted(*args, **kwargs):
        caller = sys._getframe(1).f_globals.get("__name__", "")
        results.append((caller, func(*args, **kwargs)))
        return results[-1][1]

    for name, module in list(sys.modules.items()):
        if name.startswith("zerotrain") and module is not None:
            for attr, value in list(vars(module).items()):
                if value is func:
                    monkeypatch.setattr(module, attr, counted)
    return results


class Events(TrainerCallback):
    def __init__(self):
        self.seen = []

    def on_train_begin(self, trainer):
        self.seen.append("begin")

    def on_step_end(self, trainer):
        self.seen.append(f"step{trainer.engine.global_steps}")

    def on_evaluate(self, trainer, metrics):
        self.seen.append("evaluate" if "eval_loss" in metrics else "evaluate without eval_loss")

    def on_save(self, trainer, folder):
        self.seen.append(folder.name)

    def on_train_end(self, trainer):
        self.seen.append("end")


def test_a_train_run_plans_once_and_the_trainer_runs_that_plan(tmp_path, monkeypatch):
    from zerotrain.cli import main

    counts = {f.__name__: count_calls(monkeypatch, f) for f in (init_parallel, preflight, build_deepspeed_config,
                                                                run_folder.check_output_dir)}
    used = []
    train = Trainer.train
    monkeypatch.setattr(Trainer, "train", lambda self: (used.append(self.plan), train(self))[1])
    argv = [f"--{k}={v}" for k, v in options(tmp_path, max_steps=1).items()]
    assert main(["train", *argv]) == 0
    by_trainer = {name: [result for caller, result in calls if not caller.startswith("zerotrain.initialize")]
                  for name, calls in counts.items()}  # zerotrain.initialize, the engine's, reuses the group
    assert {name: len(results) for name, results in by_trainer.items()} == \
        {"init_parallel": 1, "preflight": 1, "build_deepspeed_config": 1, "check_output_dir": 1}
    assert len(used) == 1 and used[0] is by_trainer["preflight"][0]
    assert used[0].comm.state is by_trainer["init_parallel"][0]


@pytest.mark.parametrize("ds, stage, dtype", [
    ({"bfloat16": {"enabled": True}, "zero_optimization": {"stage": 3}}, 3, torch.bfloat16),  # bf16's other key
    ({"zero_optimization": True}, 1, None),  # the boolean form: stage 1
])
def test_the_model_is_built_as_the_typed_config_says(tmp_path, monkeypatch, ds, stage, dtype):
    """The assembly reads the ZeRO stage and the compute dtype from the plan's typed config:
    every spelling the schema accepts decides the model build the same way."""
    class Built(Exception):
        pass

    def build_model(*args, **hub_options):
        raise Built(args[-1])  # the Partition (stage 3) or None, before any weight is made

    monkeypatch.setattr(models, "build_model", build_model)
    with pytest.raises(Built) as built:
        run(options(tmp_path, deepspeed=ds))
    partition = built.value.args[0]
    assert (partition.dtype if partition is not None else None) == dtype and (partition is not None) == (stage == 3)


@pytest.mark.parametrize("ds, stage, dtype, offloads", [
    ({"bfloat16": {"enabled": True}}, 0, torch.bfloat16, False),
    ({"bf16": {"enabled": "auto"}, "zero_optimization": True}, 1, torch.bfloat16, False),  # --bf16 fills "auto"
    ({"fp16": {"enabled": True}, "zero_optimization": {"stage": 2, "cpu_offload": True}}, 2, torch.float16, True),
    ({"zero_optimization": {"stage": 3, "offload_param": {"device": "none"}}}, 3, None, False),
    ({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}, 3, None, True),
    ({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/tmp"}}}, 3, None, True),
])
def test_the_plan_reads_the_typed_config(tmp_path, ds, stage, dtype, offloads):
    """Stage and dtype decide how the model is built; `offloads` whether malloc's mmap threshold
    is fixed before a stage-3 streamed load (zero/offload/host_memory.py), where host memory is the ceiling."""
    plan = plan_run(TrainingArguments(output_dir=str(tmp_path / "o"), deepspeed=ds, bf16="bf16" in ds), set(), 1)
    assert (plan.zero_stage, plan.compute_dtype, plan.offloads) == (stage, dtype, offloads)


def test_the_plan_holds_the_adopted_options_and_leaves_the_users_alone(tmp_path):
    ds = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 3, "tensor_parallel": {"autotp_size": 2},
          "optimizer": {"type": "AdamW", "params": {"lr": 0.003}}}
    args = TrainingArguments(output_dir=str(tmp_path / "o"), deepspeed=ds)
    plan = plan_run(args, set(), 4)
    assert plan.adopted == {"tensor_parallel_size": 2, "per_device_train_batch_size": 4,
                            "gradient_accumulation_steps": 3, "learning_rate": 0.003}
    assert (plan.options.per_device_train_batch_size, plan.options.tensor_parallel_size) == (4, 2)
    assert (args.per_device_train_batch_size, args.tensor_parallel_size, args.learning_rate) == (8, 1, 5e-5)
    assert (plan.parallel.world, plan.parallel.tensor, plan.parallel.data) == (4, 2, 2)
    assert [plan.parallel.data_rank(r) for r in range(4)] == [0, 0, 1, 1]
    assert plan.config.train_batch_size == 4 * 3 * 2


def test_sequence_parallel_size_from_the_option_or_the_config(tmp_path):
    """The S ranks of a data index read the same batches: the batch triad counts world / S."""
    ds = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1}
    args = TrainingArguments(output_dir=str(tmp_path / "o"), deepspeed=ds, sequence_parallel_size=2)
    plan = plan_run(args, {"sequence_parallel_size"}, 4)
    assert (plan.parallel.data, plan.parallel.sequence, plan.config.train_batch_size) == (2, 2, 4)
    assert plan.built.config["sequence_parallel_size"] == 2  # what initialize splits by
    assert [plan.parallel.data_rank(r) for r in range(4)] == [0, 0, 1, 1]  # sequence fastest, as the mesh
    adopted = plan_run(TrainingArguments(output_dir=str(tmp_path / "o"),
                                         deepspeed={**ds, "sequence_parallel_size": 4}), set(), 4)
    assert adopted.adopted["sequence_parallel_size"] == 4 and adopted.parallel.data == 1
    auto = plan_run(TrainingArguments(output_dir=str(tmp_path / "o"),
                                      deepspeed={**ds, "sequence_parallel_size": "auto"}, sequence_parallel_size=2),
                    {"sequence_parallel_size"}, 2)
    assert auto.built.config["sequence_parallel_size"] == 2 and auto.parallel.data == 1


@pytest.mark.parametrize("ds, options, world, message", [
    ({"sequence_parallel_size": 4}, {"sequence_parallel_size": 2}, 4,
     "the DeepSpeed config disagrees with the options: sequence_parallel_size=4 vs --sequence_parallel_size 2. Make "
     "them equal, set the DeepSpeed value to \"auto\", or drop the option"),
    ({}, {"sequence_parallel_size": 2}, 3, "--sequence_parallel_size 2: the 3 processes are not a multiple of 2; "
     "launch a multiple of 2 (data parallel x sequence)"),
    ({}, {"sequence_parallel_size": 2, "pipeline_parallel_size": 2}, 4,
     "--sequence_parallel_size 2 with --pipeline_parallel_size 2: sequence parallelism is not combined with pipeline "
     "or tensor parallelism here; keep one of them above 1"),
    ({"tensor_parallel": {"autotp_size": 2}}, {"sequence_parallel_size": 2}, 4,
     "--sequence_parallel_size 2 with --tensor_parallel_size 2: sequence parallelism is not combined with pipeline "
     "or tensor parallelism here; keep one of them above 1"),
])
def test_sequence_parallel_mistakes_are_one_line(tmp_path, ds, options, world, message):
    args = TrainingArguments(output_dir=str(tmp_path / "o"), deepspeed=ds, **options)
    with pytest.raises(ConfigError) as err:
        plan_run(args, set(options), world)
    assert str(err.value) == message


def test_callback_events_arrive_in_order_and_others_are_refused(tmp_path):
    events = Events()
    values = options(tmp_path, max_steps=2, save_strategy="steps", save_steps=2, eval_strategy="steps", eval_steps=1,
                     validation_file=str(write_text(tmp_path / "eval.txt", 40, seed=1)))
    run(values, [events])
    assert events.seen == ["begin", "evaluate", "step1", "evaluate", "checkpoint-2", "step2", "end"]

    class OnlyAMethod:
        def on_step_end(self, trainer):
            pass

    with pytest.raises(TypeError, match="^callbacks: OnlyAMethod is not a zerotrain.TrainerCallback; subclass it"):
        Trainer(torch.nn.Linear(2, 2), TrainingArguments(output_dir=str(tmp_path / "x")), callbacks=[OnlyAMethod()])


def test_a_plan_for_another_world_size_is_refused(tmp_path):
    plan = plan_run(TrainingArguments(output_dir=str(tmp_path / "o")), set(), 2)
    with pytest.raises(ConfigError, match="the run plan is for 2 processes and this run has 1"):
        Trainer(torch.nn.Linear(2, 2), plan)
