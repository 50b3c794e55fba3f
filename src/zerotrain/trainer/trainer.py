"""`Trainer`: HF Trainer's loop on top of the zerotrain engine.

    Trainer(model, args, train_dataset, eval_dataset, ...).train()

    build:  join the process group (ddp_timeout) -> DeepSpeed config from the args (ds_config.py)
            -> zerotrain.initialize -> sampler and loaders (sampler.py)
    loop:   for each micro-batch: engine(batch) -> engine.backward -> engine.step
            at each optimizer step: one all-reduce of (loss, tokens) -> log / evaluate / save
    end:    final evaluation, model (or adapter) + tokenizer to output_dir, summary table

Curriculum, layer drop and ZeRO come from the DeepSpeed config and act inside the engine;
the trainer only reads their state (seqlen, theta) for the logs.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

import zerotrain

from ..comm import Comm, init_parallel
from ..errors import ConfigError, DataError, NonFiniteStepsError
from ..schedules import get_scheduler, resolve_warmup_steps
from . import checkpoints as ckpt
from .args import TrainingArguments
from .data import Collator, mask_tokens
from .ds_config import build_deepspeed_config, check_no_auto_left, fill_schedule
from .forward import Batches, decay_groups, forward_keys, UnusedParameterCheck
from .metrics import MetricsLog, eval_sums, finish, logits_of
from .models import ModelInfo, enable_gradient_checkpointing
from .progress import Progress, summary_table
from .sampler import EvalSampler, TrainSampler


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _explicit_of(args: TrainingArguments) -> set[str]:
    """Options that differ from their defaults count as set by the user (Python API)."""
    fresh = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
             for f in dataclasses.fields(args)}
    return {name for name, default in fresh.items() if getattr(args, name) != default}


class Trainer:
    def __init__(self, model: torch.nn.Module, args: TrainingArguments, train_dataset, eval_dataset=None, *,
                 task: str = "clm", tokenizer=None, data_collator=None, model_info: ModelInfo | None = None,
                 lora_config: dict | None = None, base_model: str | None = None, num_labels: int | None = None,
                 block_size: int | None = None, mlm_probability: float = 0.15, callbacks=(),
                 explicit: set[str] | None = None):
        self.args, self.task, self.tokenizer = args, task, tokenizer
        self.model, self.lora_config, self.base_model = model, lora_config, base_model
        self.info = model_info or ModelInfo("hf" if hasattr(model, "save_pretrained") else "custom", task,
                                            None, None, {})
        self.num_labels = num_labels or getattr(getattr(model, "config", None), "num_labels", None) or 2
        self.mlm_probability, self.callbacks = mlm_probability, list(callbacks)
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        self.comm = Comm(init_parallel(timeout_s=args.ddp_timeout))
        self.rank0 = self.comm.rank == 0
        self.output_dir = Path(args.output_dir).expanduser()
        resuming = bool(args.resume_from_checkpoint)
        ckpt.check_output_dir(self.output_dir, args.overwrite_output_dir, resuming)
        if resuming:
            ckpt.resolve_resume(args.resume_from_checkpoint, self.output_dir)
        stages = args.pipeline_parallel_size
        if self.comm.world_size % stages:
            raise ConfigError(f"--pipeline_parallel_size {stages}: the {self.comm.world_size} processes are not a "
                              f"multiple of it; launch a multiple of {stages}")
        world = self.comm.world_size // stages  # data-parallel ranks (the mesh's data index is rank % world)
        ds, uses_ds_scheduler = build_deepspeed_config(args, explicit if explicit is not None else _explicit_of(args),
                                                       world, self.info.hidden_size, block_size or 0)
        mb, ga = args.per_device_train_batch_size, args.gradient_accumulation_steps  # the config may have set them
        self.collator = data_collator or Collator(task, tokenizer.pad_token_id if tokenizer is not None else None)
        lengths = self._lengths(train_dataset) if args.group_by_length else None
        self.sampler = TrainSampler(len(train_dataset), mb, self.comm.rank % world, world, args.seed, lengths)
        self.loader = DataLoader(train_dataset, batch_size=mb, sampler=self.sampler, collate_fn=self.collator,
                                 num_workers=args.dataloader_num_workers,
                                 generator=torch.Generator().manual_seed(args.seed))  # keeps the global RNG untouched
        self.micro_per_epoch = len(self.loader) // ga * ga
        if self.micro_per_epoch == 0:
            raise ConfigError(f"an epoch has {len(self.loader)} micro-batches per process, fewer than "
                              f"gradient_accumulation_steps {ga}; lower it or the batch size, or add data")
        self.comm.barrier()  # every rank has checked before rank 0 touches anything
        if self.rank0:
            if args.overwrite_output_dir and not resuming:
                ckpt.clear_previous_run(self.output_dir)
            self.output_dir.mkdir(parents=True, exist_ok=True)
        set_seed(args.seed)
        if args.gradient_checkpointing:
            enable_gradient_checkpointing(model)
        self.keys = forward_keys(model)
        self.pipe_names = None  # --pipeline_parallel_size: this rank's stage keys -> the model's
        if stages > 1:
            from .pipeline_split import split_model

            pipe_model, self.pipe_names = split_model(model, self.info.kind, task, stages, ds.get("pipeline"))
        self.steps_per_epoch = self.micro_per_epoch // ga
        self.total_steps = args.max_steps if args.max_steps > 0 else \
            max(1, math.ceil(args.num_train_epochs * self.steps_per_epoch))
        self.warmup_steps = resolve_warmup_steps(self.total_steps, args.warmup_steps, args.warmup_ratio)
        check_no_auto_left(fill_schedule(ds, self.warmup_steps, self.total_steps))
        self.ds_config = ds
        factory = None
        plateau = args.lr_scheduler_type == "reduce_lr_on_plateau"
        if not uses_ds_scheduler and not plateau:
            factory = lambda opt: get_scheduler(args.lr_scheduler_type, opt, self.warmup_steps,  # noqa: E731
                                                self.total_steps, scheduler_specific_kwargs=args.lr_scheduler_kwargs)
        try:
            trained = pipe_model if stages > 1 else model
            self.engine, _, _, _ = zerotrain.initialize(model=trained, config=ds, lr_scheduler=factory,
                                                        model_parameters=decay_groups(trained, args.weight_decay))
        except ValueError as e:  # HF-style scheduler argument errors
            if isinstance(e, (ConfigError, DataError)):
                raise
            raise ConfigError(f"lr_scheduler_type {args.lr_scheduler_type}: {e}") from None
        self.plateau = get_scheduler("reduce_lr_on_plateau", self.engine.optimizer,
                                     scheduler_specific_kwargs=args.lr_scheduler_kwargs) \
            if plateau and not uses_ds_scheduler else None
        self.unused = UnusedParameterCheck(trained) if args.ddp_find_unused_parameters is False else None
        self.epoch, self.micro_in_epoch, self.tokens, self.train_time = 0, 0, 0, 0.0
        self.best_metric, self.best_checkpoint, self.last_eval = None, None, {}
        self.last_log: dict = {}
        self.history: list[dict] = []
        self.log: MetricsLog | None = None  # set by train(); a lone evaluate() only returns metrics
        self.progress: Progress | None = None

    # ---- helpers -----------------------------------------------------------------------------
    @staticmethod
    def _lengths(dataset) -> list[int]:
        if hasattr(dataset, "column_names") and "length" in dataset.column_names:
            return list(dataset["length"])
        return [len(dataset[i]["input_ids"]) for i in range(len(dataset))]

    def epoch_progress(self) -> float:
        return round(self.epoch + self.micro_in_epoch / self.micro_per_epoch, 4)

    def _emit(self, record: dict) -> None:
        self.history.append(record)
        if self.rank0 and self.log is not None:
            self.log.write(record)
            self.progress.log(record)

    # ---- training ----------------------------------------------------------------------------
    def train(self) -> dict:
        args, engine = self.args, self.engine
        resume_step = self._resume() if args.resume_from_checkpoint else None
        if self.rank0:
            self.log = MetricsLog(self.output_dir, args.report_to == "tensorboard", resume_step)
        self.progress = Progress(self.total_steps, engine.global_steps, self.rank0, not args.disable_tqdm)
        batches = Batches(self)
        start, window_start, window_tokens = time.perf_counter(), time.perf_counter(), 0
        window = torch.zeros(2, dtype=torch.float64)  # loss sum, micro-batches since the last log
        while engine.global_steps < self.total_steps and not engine.should_stop():
            self.sampler.set_epoch(self.epoch, skip=self.micro_in_epoch * args.per_device_train_batch_size)
            for batch in self.loader:
                if self.micro_in_epoch >= self.micro_per_epoch:
                    break  # the remainder that does not fill an optimizer step
                boundary = batches.at_boundary()
                try:
                    loss, tokens = batches.train_step(batch)
                except NonFiniteStepsError as e:
                    self.micro_in_epoch += 1
                    folder = self.save_checkpoint()
                    raise NonFiniteStepsError(f"{e}; saved that state to {folder}", e.last_good_step) from None
                self.micro_in_epoch += 1
                stats = torch.tensor([loss, 1.0, tokens], dtype=torch.float64)
                if not boundary:
                    batches.pending += stats
                    continue
                stats += batches.pending
                batches.pending.zero_()
                self.comm.all_reduce(stats)  # one small collective per optimizer step
                window += stats[:2]
                self.tokens += int(stats[2])
                window_tokens += int(stats[2])
                if self.unused is not None:
                    self.unused.check(engine.global_steps)
                step = engine.global_steps
                fields = batches.live_fields()
                if step % args.logging_steps == 0 or step == self.total_steps:
                    elapsed = time.perf_counter() - window_start
                    record = {"step": step, "epoch": self.epoch_progress(),
                              "tokens": self.tokens, "loss": window[0].item() / max(window[1].item(), 1.0),
                              "lr": engine.get_lr()[0], "grad_norm": engine.get_global_grad_norm(),
                              "tokens_per_s": round(window_tokens / max(elapsed, 1e-9)), **fields}
                    self._emit({k: v for k, v in record.items() if v is not None})
                    self.last_log = record
                    window.zero_()
                    window_start, window_tokens = time.perf_counter(), 0
                self.progress.step({**Progress.postfix(self.last_log), **Progress.postfix(fields)})
                epoch_done = self.micro_in_epoch >= self.micro_per_epoch
                self._maybe_evaluate_and_save(step, epoch_done)
                for cb in self.callbacks:
                    getattr(cb, "on_step_end", lambda t: None)(self)
                if step >= self.total_steps or engine.should_stop():
                    break
            if self.micro_in_epoch >= self.micro_per_epoch:
                self.epoch, self.micro_in_epoch = self.epoch + 1, 0
        self.train_time += time.perf_counter() - start
        return self._finish()

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
        engine, args = self.engine, self.args
        data_world = self.comm.world_size // self.args.pipeline_parallel_size  # a pipeline's stages read alike
        sampler = EvalSampler(len(self.eval_dataset), self.comm.rank % data_world, data_world)
        valid = sampler.valid()
        loader = DataLoader(self.eval_dataset, batch_size=args.per_device_eval_batch_size, sampler=sampler,
                            collate_fn=self.collator, num_workers=args.dataloader_num_workers)
        generator = torch.Generator().manual_seed(args.seed)  # the same masks at every evaluation
        if self.pipe_names is not None:
            from .pipeline_split import evaluate_pipeline

            return self._report_eval(evaluate_pipeline(self, loader, generator))
        sums, pos = torch.zeros(3 + 3 * self.num_labels, dtype=torch.float64), 0
        engine.eval()
        with torch.no_grad():
            for batch in loader:
                n = len(batch["input_ids"])
                ok = torch.tensor(valid[pos: pos + n])
                pos += n
                if self.task == "mlm":
                    batch = mask_tokens(batch, self.tokenizer, self.mlm_probability, generator)
                inputs = {k: v.to(engine.device) for k, v in batch.items() if k in self.keys and k != "labels"}
                logits = logits_of(engine(**inputs)).cpu()
                sums += eval_sums(self.task, logits, batch, ok, self.num_labels)
        engine.train()
        self.comm.all_reduce(sums)
        return self._report_eval(finish(self.task, sums, self.num_labels))

    def _report_eval(self, metrics: dict) -> dict:
        engine = self.engine
        self.last_eval = {"step": engine.global_steps, **metrics}
        if self.plateau is not None and "eval_loss" in metrics:
            self.plateau.step(metrics["eval_loss"])
        self._emit({"step": engine.global_steps, "epoch": self.epoch_progress(), "tokens": self.tokens, **metrics})
        for cb in self.callbacks:
            getattr(cb, "on_evaluate", lambda t, m: None)(self, metrics)
        return metrics

    # ---- saving and resuming -----------------------------------------------------------------
    def _state(self) -> dict:
        return {"epoch": self.epoch, "micro_in_epoch": self.micro_in_epoch, "tokens": self.tokens,
                "world_size": self.comm.world_size,
                "train_time": self.train_time, "best_metric": self.best_metric,
                "best_checkpoint": self.best_checkpoint,
                "plateau": self.plateau.state_dict() if self.plateau is not None else None}

    def save_checkpoint(self) -> Path:
        step = self.engine.global_steps
        tag = f"checkpoint-{step}"
        folder = self.output_dir / tag
        metric = self.last_eval.get("eval_loss") if self.last_eval.get("step") == step else None
        if metric is not None and (self.best_metric is None or metric < self.best_metric):
            self.best_metric, self.best_checkpoint = metric, str(folder)
        self.engine.save_checkpoint(str(self.output_dir), tag=tag, client_state={"trainer": self._state()})
        self.save_model(folder)
        if self.rank0:
            best = Path(self.best_checkpoint) if self.best_checkpoint else None
            ckpt.rotate(self.output_dir, self.args.save_total_limit, best)
        self.comm.barrier()
        for cb in self.callbacks:
            getattr(cb, "on_save", lambda t, p: None)(self, folder)
        return folder

    def save_model(self, folder: Path | None = None) -> Path:
        """Weights (or the LoRA adapter) + tokenizer; a collective under ZeRO-3."""
        from .lora import save_adapter
        from .models import save_model

        folder = Path(folder) if folder is not None else self.output_dir
        state = self.engine.module_state_dict()
        if self.pipe_names is not None:  # every stage's weights, under the model's names
            from .pipeline_split import whole_state

            state = whole_state(self.engine, state, self.pipe_names)
        if self.rank0:
            if self.lora_config is not None:
                save_adapter(folder, state, self.lora_config, self.base_model)
                if self.tokenizer is not None:
                    self.tokenizer.save_pretrained(str(folder))
            else:
                save_model(folder, self.model, self.info, state, self.tokenizer)
        return folder

    def _resume(self) -> int:
        save_dir, tag = ckpt.resolve_resume(self.args.resume_from_checkpoint, self.output_dir)
        path, client = self.engine.load_checkpoint(str(save_dir), tag=tag)
        state = (client or {}).get("trainer")
        if path is None or state is None:
            raise ConfigError(f"--resume_from_checkpoint {self.args.resume_from_checkpoint}: "
                              f"{path or save_dir} is not a checkpoint written by `zerotrain train`")
        written_by = state.get("world_size", self.comm.world_size)
        if written_by != self.comm.world_size:  # the data order is planned per process count
            raise ConfigError(f"--resume_from_checkpoint: {path} was written by {written_by} processes and this run "
                              f"has {self.comm.world_size}; resume with --nproc_per_node {written_by} (its position "
                              "in the epoch exists only for that count)")
        self.epoch, self.micro_in_epoch, self.tokens = state["epoch"], state["micro_in_epoch"], state["tokens"]
        self.train_time, self.best_metric = state["train_time"], state["best_metric"]
        self.best_checkpoint = state["best_checkpoint"]
        if self.plateau is not None and state.get("plateau") is not None:
            self.plateau.load_state_dict(state["plateau"])
        if self.rank0:
            print(f"resumed from {path} at step {self.engine.global_steps} (epoch {self.epoch})", flush=True)
        return self.engine.global_steps

    def _finish(self) -> dict:
        self.progress.close()
        final = self.evaluate() if self.eval_dataset is not None and \
            self.last_eval.get("step") != self.engine.global_steps else \
            {k: v for k, v in self.last_eval.items() if k != "step"}
        self.save_model()
        losses = [r["loss"] for r in self.history if "loss" in r]
        results = {"global_step": self.engine.global_steps, "epoch": self.epoch_progress(), "tokens": self.tokens,
                   "train_time_s": round(self.train_time, 2),
                   "tokens_per_s": round(self.tokens / max(self.train_time, 1e-9)),
                   "train_loss": losses[-1] if losses else None, **final,
                   "best_checkpoint": self.best_checkpoint, "best_eval_loss": self.best_metric}
        if self.rank0:
            (self.output_dir / "trainer_state.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
            self.log.close()
            rows = [(k, v) for k, v in results.items() if v is not None]
            print(summary_table(rows + [("output_dir", str(self.output_dir))]), flush=True)
        for cb in self.callbacks:
            getattr(cb, "on_train_end", lambda t: None)(self)
        return results
