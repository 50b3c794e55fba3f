"""`Trainer`: HF Trainer's loop on top of the zerotrain engine.

    Trainer(model, args, train_dataset, eval_dataset, ...).train()     options: planned here
    Trainer(model, plan, data=prepared, ...).train()                    zerotrain train (assembly.py)

    build:  the run plan (plan.py: options, parallel sizes, run folder, DeepSpeed config; made
            once) -> the batches (data/sampler.py; data/efficiency.py when data_efficiency draws
            them) -> the config's model and step values filled -> zerotrain's initialize
    loop:   for each micro-batch: engine(batch) -> engine.backward -> engine.step (step.py)
            at each optimizer step: one all-reduce of (loss, micro-batches, tokens) -> log / evaluate / save
    end:    final evaluation, model (or adapter) + tokenizer to output_dir, summary table
    events: TrainerCallback (callbacks.py) at train begin, step end, evaluate, save, train end

Curriculum, layer drop and ZeRO come from the DeepSpeed config and act inside the engine; the
trainer logs whatever the engine's features report (`log_fields`) without naming any of them.

    tokens        features.batch.count_tokens of every training forward: batch x sequence
                  length after any curriculum cut, padding included (every row counts the
                  padded length, as Megatron's and HF's counts do), summed over all ranks; the
                  token budget counts the same
    tokens_per_s  those tokens / seconds spent training; evaluation and checkpoint saves are
                  left out (an eval record carries its own eval_runtime)

A run stops early, on every rank at the same step, when the token budget is spent or on
Ctrl-C / SIGTERM (interrupt.py: checkpoint, resume command, exit 130 / 143). The last step
always has a checkpoint unless save_strategy is no.
"""

from __future__ import annotations

import json
import random
from typing import TYPE_CHECKING

import numpy as np
import torch

from ...comm import Comm, init_parallel
from ...engine.checkpointing import writes_shared_files
from ...engine.summary import told_elsewhere
from ...errors import ConfigError, DataError, NonFiniteStepsError
from ...features.engine_methods import token_budget_block, tokens_consumed
from ...features.model_api import is_hf_model
from ...initialize import initialize
from ...schedules import get_scheduler, resolve_warmup_steps
from ..args import TrainingArguments
from ..data.collate import Collator
from ..data.efficiency import drawn_batches
from ..data.sampler import SampledBatches
from ..ds_config import model_hidden_size, sample_length
from ..model.build import ModelInfo
from ..model.gradient_checkpointing import enable_gradient_checkpointing
from ..report.banner import banner, stop_line
from ..report.metrics_log import MetricsLog, write_predictions
from ..report.progress import Progress, summary_table
from ..plan import RunPlan, explicit_of, plan_run
from . import run_folder
from .callbacks import checked
from .saving import SavesAndResumes
from .evaluate import evaluate
from .interrupt import StopRequest, interrupted
from .step import MicroBatches, TrainClock, UnusedParameterCheck, decay_groups

if TYPE_CHECKING:
    from ..data.prepare import PreparedData


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class Trainer(SavesAndResumes):
    def __init__(self, model: torch.nn.Module, args: TrainingArguments | RunPlan, train_dataset=None,
                 eval_dataset=None, *, tokenizer=None, data_collator=None, compute_metrics=None, callbacks=(),
                 model_info: ModelInfo | None = None, data: PreparedData | None = None):
        """`args`: the options (HF's place for them), planned here, or the run plan preflight made
        (`zerotrain train`), used as it is. `data`: the prepared data sets (train, eval, test,
        extra eval sets, labels, block size) in place of train_dataset and eval_dataset.
        `model_info`: what the assembly knows of the model (kind, task, hidden size, LoRA).
        `compute_metrics(outputs, labels)`: HF's, over the whole eval set."""
        if data is not None:
            if train_dataset is not None or eval_dataset is not None:
                raise TypeError("Trainer: pass data=, or train_dataset / eval_dataset, not both")
            train_dataset, eval_dataset = data.train, data.eval
        self.callbacks = checked(callbacks)
        self.plan = plan = self._plan(args, train_dataset)
        self.args = args = plan.options
        self.model, self.tokenizer = model, tokenizer
        self.info = model_info or ModelInfo("hf" if is_hf_model(model) else "custom",
                                            plan.model_options.task, None, None, {})
        self.task = task = self.info.task
        self.lora_config = self.info.lora_config
        self.base_model = plan.model_options.model_name_or_path
        self.mlm_probability = plan.data_options.mlm_probability
        labels = data.labels if data is not None else None
        classes = (1 if data.regression else len(labels) if labels else None) if data is not None else None
        self.num_labels = classes or getattr(getattr(model, "config", None), "num_labels", None) or 2
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        self.test_dataset = data.test if data is not None else None
        self.label_names = labels  # classification: class id -> the data's label, for predictions.jsonl
        # compute_metrics over the whole eval set; more eval sets by metric suffix (MNLI "mm")
        self.compute_metrics, self.extra_eval = compute_metrics, dict(data.extra_eval if data is not None else {})
        self.rank0 = self.comm.rank == 0
        self.output_dir = plan.folder.output_dir
        sizes = plan.parallel  # the mesh's pipe x data x tensor
        self.data_rank, self.data_world = sizes.data_rank(self.comm.rank), sizes.data
        self.collator = data_collator or Collator(task, tokenizer.pad_token_id if tokenizer is not None else None)
        self._make_loader(train_dataset)
        set_seed(args.seed)
        if args.gradient_checkpointing:
            enable_gradient_checkpointing(model)
        trained, self.pipe_names = model, None  # --pipeline_parallel_size: this rank's stage keys -> the model's
        if sizes.pipeline > 1:
            from ...parallel.pipeline.from_model import split_model

            trained, self.pipe_names = split_model(model, self.info.kind, task, sizes.pipeline,
                                                   plan.built.config.get("pipeline"), sizes.tensor, sizes.data)
        self.total_steps = 0 if train_dataset is None else args.max_steps if args.max_steps > 0 else \
            self.batches.total_steps(args.num_train_epochs)
        if self.batches is not None:
            self.batches.check_total(self.total_steps)
        block = (data.block_size if data is not None else None) or (lambda: sample_length(train_dataset))
        self._make_engine(trained, block)
        self._open_run_folder()  # every rank has checked the options, the data and the config by now
        self.unused = UnusedParameterCheck(trained) if args.ddp_find_unused_parameters is False else None
        self.micro_batches = MicroBatches(self.engine, model, task, tokenizer, self.mlm_probability)
        self.keys = self.micro_batches.keys
        if self.pipe_names is not None:
            from ..pipeline_batches import PipelineMicroBatches

            self.micro_batches = PipelineMicroBatches(self.engine, self.keys, self.info.kind, task, tokenizer,
                                                      self.mlm_probability)
        if train_dataset is not None and "position_ids" in getattr(train_dataset, "column_names", ()) \
                and "position_ids" not in self.keys:
            raise ConfigError(f"packing needs a model whose forward takes position_ids (HF models); "
                              f"{type(model).__name__}.forward does not")
        self.stop = StopRequest()
        self.clock = TrainClock()
        self.epoch, self.micro_in_epoch, self.tokens = 0, 0, 0
        self.best_metric, self.best_checkpoint, self.last_eval = None, None, {}
        self.last_log: dict = {}
        self.history: list[dict] = []
        self.log: MetricsLog | None = None  # set by train(); a lone evaluate() only returns metrics
        self.progress: Progress | None = None
        self.last_saved: int | None = None  # step of the newest checkpoint this run wrote or resumed from
        if self.rank0:
            nodes = max(1, self.comm.world_size // (self.comm.state.local_world_size or self.comm.world_size))
            print(banner(self.engine, model, task, self.total_steps, nodes), flush=True)

    # ---- building ----------------------------------------------------------------------------
    def _plan(self, args: TrainingArguments | RunPlan, train_dataset) -> RunPlan:
        """The plan handed in (and its Comm), or one made here for the options alone."""
        plan = args if isinstance(args, RunPlan) else None
        if plan is not None and plan.comm is not None:
            self.comm = plan.comm
        else:
            self.comm = Comm(init_parallel(timeout_s=(plan.options if plan else args).ddp_timeout))
        if plan is None:
            return plan_run(args, explicit_of(args), self.comm.world_size, comm=self.comm,
                            block_size=lambda: sample_length(train_dataset))
        if plan.parallel.world != self.comm.world_size:
            raise ConfigError(f"the run plan is for {plan.parallel.world} processes and this run has "
                              f"{self.comm.world_size}; make the plan on the ranks that run it")
        return plan

    def _make_loader(self, dataset) -> None:
        """This rank's share of every batch: the trainer's sampler (data/sampler.py) or the
        data_efficiency block's (data/efficiency.py); None without a training set."""
        self.micro_per_epoch, self.batches = 1, None
        if dataset is None:  # evaluate only (do_train false)
            return
        made = (self.plan, dataset, self.args, self.data_rank, self.data_world, self.collator)
        self.batches = drawn_batches(*made) or SampledBatches(*made[1:])
        self.sampler = self.batches.sampler
        self.micro_per_epoch = self.batches.micro_per_epoch(0)

    def _make_engine(self, trained: torch.nn.Module, block_size) -> None:
        """The plan's config with the model's hidden size, the data's block size and the step
        counts filled in -> zerotrain's initialize; the LR schedule from the options unless the
        config's scheduler block drives it."""
        args, plan = self.args, self.plan
        schedule_steps = max(1, self.total_steps)
        self.warmup_steps = resolve_warmup_steps(schedule_steps, args.warmup_steps, args.warmup_ratio)
        self.ds_config = ds = plan.deepspeed_config(self.info.hidden_size or model_hidden_size(self.model),
                                                    block_size, self.warmup_steps, schedule_steps)
        uses_ds_scheduler, factory = plan.built.uses_ds_scheduler, None
        plateau = args.lr_scheduler_type == "reduce_lr_on_plateau"
        if not uses_ds_scheduler and not plateau:
            factory = lambda opt: get_scheduler(args.lr_scheduler_type, opt, self.warmup_steps,  # noqa: E731
                                                schedule_steps, scheduler_specific_kwargs=args.lr_scheduler_kwargs)
        extra = self.batches.engine_config(ds, self.output_dir) if self.batches is not None else {}
        try:
            with told_elsewhere():  # the banner says what runs
                self.engine, _, loader, _ = initialize(model=trained, config=ds, lr_scheduler=factory,
                                                       model_parameters=decay_groups(trained, args.weight_decay),
                                                       **extra)
        except ValueError as e:  # HF-style scheduler argument errors
            if isinstance(e, (ConfigError, DataError)):
                raise
            raise ConfigError(f"lr_scheduler_type {args.lr_scheduler_type}: {e}") from None
        # trainer/data/sampler.py and the curriculum's sampler: each global micro-batch in rank blocks
        self.engine.sample_dealing = "blocked"
        if self.batches is not None:
            self.batches.attach(self.engine, loader)
        self.plateau = get_scheduler("reduce_lr_on_plateau", self.engine.optimizer,
                                     scheduler_specific_kwargs=args.lr_scheduler_kwargs) \
            if plateau and not uses_ds_scheduler else None

    def _open_run_folder(self) -> None:
        """Clear an overwritten run's files, create output_dir, check who shares it."""
        self.node_main = writes_shared_files(self.engine)  # rank 0; with node-local storage one per node
        if self.node_main and self.args.overwrite_output_dir and not self.plan.folder.resuming:
            run_folder.clear_previous_run(self.output_dir)
        created = not self.output_dir.exists()
        if self.comm.state.local_rank == 0 or self.rank0:
            self.output_dir.mkdir(parents=True, exist_ok=True)
        self.comm.barrier()
        try:
            run_folder.check_storage(self.comm, self.output_dir, self.engine.config.checkpoint.use_node_local_storage)
        except ConfigError:
            if created and self.comm.state.local_rank == 0 and not any(self.output_dir.iterdir()):
                self.output_dir.rmdir()  # leave no trace of a run that could not start
            raise

    # ---- helpers -----------------------------------------------------------------------------
    @property
    def train_time(self) -> float:
        return self.clock.total

    def epoch_progress(self) -> float:
        return round(self.epoch + self.micro_in_epoch / self.micro_per_epoch, 4)

    def feature_fields(self) -> dict:
        """What the engine's features report now (curriculum seqlen, layer-drop theta, ...)."""
        fields = {}
        for feature in self.engine.features:
            fields.update(feature.log_fields(self.engine))
        if self.engine.loss_scaler is not None:
            fields["loss_scale"] = self.engine.loss_scale
        return fields

    def _emit(self, record: dict) -> None:
        self.history.append(record)
        if self.rank0 and self.log is not None:
            self.log.write(record)
            self.progress.log(record)

    # ---- training ----------------------------------------------------------------------------
    def train(self) -> dict:
        """Train to max_steps (or epochs); without a training set, evaluate (and predict) only."""
        for cb in self.callbacks:
            cb.on_train_begin(self)
        with self.stop.deferred():
            if self.train_dataset is None:
                self.progress = Progress(0, 0, False, False)
                if self.rank0:
                    self.log = MetricsLog(self.output_dir, self.args.report_to, None)
                return self._finish(trained=False)
            self._train_steps()
            return self._finish()

    def _train_steps(self) -> None:
        args, engine = self.args, self.engine
        resume_step = self._resume() if args.resume_from_checkpoint else None
        if self.rank0:
            self.log = MetricsLog(self.output_dir, args.report_to, resume_step)
        if resume_step is not None and resume_step >= self.total_steps and self.rank0:
            print(f"zerotrain: the checkpoint is at step {resume_step}, max_steps is {self.total_steps}: nothing left "
                  "to train; raise --max_steps (or num_train_epochs) to continue", flush=True)
        self.progress = Progress(self.total_steps, engine.global_steps, self.rank0, not args.disable_tqdm)
        engine.train()  # from_pretrained hands HF models over in eval mode (no dropout, no features)
        self.clock = TrainClock(self.clock.total)
        window = torch.zeros(3, dtype=torch.float64)  # loss sum, micro-batches, tokens since the last log
        while engine.global_steps < self.total_steps and not engine.should_stop():
            self.batches.set_epoch(self.epoch, skip=self.micro_in_epoch * args.per_device_train_batch_size)
            self.micro_per_epoch = self.batches.micro_per_epoch(self.epoch)  # token batches' may change
            for batch in self.batches:
                if self.micro_in_epoch >= self.micro_per_epoch:
                    break  # the remainder that does not fill an optimizer step
                boundary = self.micro_batches.at_boundary()
                try:
                    self.micro_batches.run(batch)
                except NonFiniteStepsError as e:
                    self.micro_in_epoch += 1
                    folder = self.save_checkpoint()
                    raise NonFiniteStepsError(f"{e}; saved that state to {folder}", e.last_good_step) from None
                self.micro_in_epoch += 1
                if not boundary:
                    continue
                stats = torch.cat([self.micro_batches.take(), torch.tensor([self.stop.weight()], dtype=torch.float64)])
                self.comm.all_reduce(stats)  # one small collective per optimizer step, the stop request with it
                window += stats[:3]
                counted = tokens_consumed(engine)  # the engine's count, when it keeps one
                self.tokens = counted if counted is not None else self.tokens + int(stats[2])
                if self.unused is not None:
                    self.unused.check(engine.global_steps)
                step = engine.global_steps
                fields = self.feature_fields()
                if step % args.logging_steps == 0 or step == self.total_steps or engine.should_stop():
                    record = {"step": step, "epoch": self.epoch_progress(), "tokens": self.tokens,
                              "loss": window[0].item() / max(window[1].item(), 1.0), "lr": engine.get_lr()[0],
                              "grad_norm": engine.get_global_grad_norm(),
                              "tokens_per_s": round(window[2].item() / max(self.clock.lap(), 1e-9))}
                    record.update({k: v for k, v in fields.items() if k not in record})
                    self._emit({k: v for k, v in record.items() if v is not None})
                    self.last_log = record
                    window.zero_()
                self.progress.step({**Progress.postfix(self.last_log), **Progress.postfix(fields, fields)})
                signum = StopRequest.agreed(stats[3].item())
                if signum:
                    self._interrupted(step, signum)
                epoch_done = self.micro_in_epoch >= self.micro_per_epoch
                self._maybe_evaluate_and_save(step, epoch_done)
                for cb in self.callbacks:
                    cb.on_step_end(self)
                if step >= self.total_steps or engine.should_stop():
                    break
            if self.micro_in_epoch >= self.micro_per_epoch:
                self.epoch, self.micro_in_epoch = self.epoch + 1, 0
        line = stop_line(self.tokens, token_budget_block(engine), engine.global_steps, self.total_steps)
        if line and self.rank0:
            print(line, flush=True)
        if args.save_strategy != "no" and self.last_saved != engine.global_steps:
            self.save_checkpoint()  # the last step always has a checkpoint
        self.clock.stop()

    def _interrupted(self, step: int, signum: int) -> None:
        """Every rank is here at the same step: checkpoint (or name the last one), then raise."""
        self.clock.stop()
        if self.args.save_on_interrupt and self.last_saved != step:
            self.save_checkpoint()
        self.progress.close()
        if self.log is not None:
            self.log.close()
        folder = str(self.output_dir / f"checkpoint-{self.last_saved}") if self.last_saved is not None else None
        raise interrupted(signum, step, self.total_steps, folder, self.last_saved == step,
                          self.comm.world_size != (self.comm.state.local_world_size or self.comm.world_size))

    def _maybe_evaluate_and_save(self, step: int, epoch_done: bool) -> None:
        args = self.args
        evaluate = (args.eval_strategy == "steps" and step % args.eval_steps == 0) or \
                   (args.eval_strategy == "epoch" and epoch_done)
        if evaluate and self.eval_dataset is not None:
            self.evaluate()
        save = (args.save_strategy == "steps" and step % args.save_steps == 0) or \
               (args.save_strategy == "epoch" and epoch_done)
        if save:
            self.save_checkpoint()

    def evaluate(self) -> dict:
        """Eval metrics over the whole eval set (every rank must call this)."""
        if self.eval_dataset is None:
            return {}
        with self.clock.paused():
            metrics = self._evaluate(self.eval_dataset)
            for suffix, dataset in self.extra_eval.items():  # run_glue's names: eval_accuracy_mm
                metrics.update({f"{k}_{suffix}": v for k, v in self._evaluate(dataset).items()})
        step = self.engine.global_steps
        self.last_eval = {"step": step, **metrics}
        if self.plateau is not None and "eval_loss" in metrics:
            self.plateau.step(metrics["eval_loss"])
        self._emit({"step": step, "epoch": self.epoch_progress(), "tokens": self.tokens, **metrics})
        for cb in self.callbacks:
            cb.on_evaluate(self, metrics)
        return metrics

    def _evaluate(self, dataset, prefix: str = "eval", predictions: list | None = None) -> dict:
        args = self.args
        if self.pipe_names is not None:
            from ..pipeline_batches import evaluate_pipeline

            return evaluate_pipeline(self.engine, dataset, collator=self.collator, keys=self.keys, kind=self.info.kind,
                                     task=self.task, batch_size=args.per_device_eval_batch_size,
                                     workers=args.dataloader_num_workers, seed=args.seed, data_rank=self.data_rank,
                                     data_world=self.data_world, tokenizer=self.tokenizer,
                                     mlm_probability=self.mlm_probability, prefix=prefix)
        return evaluate(self.engine, dataset, collator=self.collator, keys=self.keys, task=self.task,
                        num_labels=self.num_labels, batch_size=args.per_device_eval_batch_size,
                        workers=args.dataloader_num_workers, seed=args.seed, tokenizer=self.tokenizer,
                        mlm_probability=self.mlm_probability, prefix=prefix, predictions=predictions,
                        compute_metrics=self.compute_metrics)

    def predict(self, dataset) -> dict:
        """test_* metrics over `dataset` (HF's predict); classification also writes the predicted
        label of every row to predictions.jsonl (rank 0)."""
        predictions = [] if self.task == "classification" else None
        metrics = self._evaluate(dataset, "test", predictions)
        if self.rank0 and predictions is not None:
            write_predictions(self.output_dir, predictions, self.label_names)
        self._emit({"step": self.engine.global_steps, "tokens": self.tokens, **metrics})
        return metrics

    def _finish(self, trained: bool = True) -> dict:
        self.progress.close()
        final = {}
        if self.eval_dataset is not None and self.args.do_eval is not False:
            final = self.evaluate() if self.last_eval.get("step") != self.engine.global_steps or not trained else \
                {k: v for k, v in self.last_eval.items() if k != "step"}
        if self.test_dataset is not None and self.args.do_predict:
            final.update(self.predict(self.test_dataset))
        if trained:
            self.save_model()
        losses = [r["loss"] for r in self.history if "loss" in r]
        results = {"global_step": self.engine.global_steps, "epoch": self.epoch_progress(), "tokens": self.tokens,
                   "train_time_s": round(self.train_time, 2),
                   "tokens_per_s": round(self.tokens / max(self.train_time, 1e-9)),
                   "train_loss": losses[-1] if losses else None, **final,
                   "best_checkpoint": self.best_checkpoint, "best_eval_loss": self.best_metric}
        if not trained:
            results = {"global_step": self.engine.global_steps, **final}
        if self.rank0:
            (self.output_dir / "trainer_state.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
            self.log.close()
            rows = [(k, v) for k, v in results.items() if v is not None]
            print(summary_table(rows + [("output_dir", str(self.output_dir))]), flush=True)
        for cb in self.callbacks:
            cb.on_train_end(self)
        return results
