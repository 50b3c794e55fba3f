"""The trainer's checkpoints: what it adds to the engine's (its place in the epoch, the best
checkpoint so far, the plateau scheduler), the model folder inside each one, and resuming."""

from __future__ import annotations

from pathlib import Path

from ...checkpoint.deepspeed import deepspeed_folder
from ...checkpoint.universal import is_universal
from ...errors import ConfigError
from . import run_folder
from .step import TrainClock


class SavesAndResumes:
    """Mixed into Trainer (loop/trainer.py), whose attributes these methods use."""

    def _state(self) -> dict:
        return {"epoch": self.epoch, "micro_in_epoch": self.micro_in_epoch, "tokens": self.tokens,
                "world_size": self.comm.world_size, "data_parallel_size": self.data_world,
                "train_time": self.clock.total, "best_metric": self.best_metric,
                "best_checkpoint": self.best_checkpoint,
                "plateau": self.plateau.state_dict() if self.plateau is not None else None}

    def save_checkpoint(self) -> Path:
        """checkpoint-<step>: the engine's files and the model folder (save_model), published
        together under one manifest, so a checkpoint that verifies is also a loadable model."""
        step = self.engine.global_steps
        tag = f"checkpoint-{step}"
        folder = self.output_dir / tag
        metric = self.last_eval.get("eval_loss") if self.last_eval.get("step") == step else None
        if metric is not None and (self.best_metric is None or metric < self.best_metric):
            self.best_metric, self.best_checkpoint = metric, str(folder)
        with self.clock.paused():
            self.engine.save_checkpoint(str(self.output_dir), tag=tag, client_state={"trainer": self._state()},
                                        extra_files=lambda staging: self.save_model(staging, self.node_main))
            self.last_saved = step
            if self.node_main:
                best = Path(self.best_checkpoint) if self.best_checkpoint else None
                run_folder.rotate(self.output_dir, self.args.save_total_limit, best)
            self.comm.barrier()
        for cb in self.callbacks:
            cb.on_save(self, folder)
        return folder

    def save_model(self, folder: Path | None = None, writer: bool | None = None) -> Path:
        """Weights (or the LoRA adapter) + tokenizer, written by `writer` (default rank 0); a
        collective under ZeRO-3, so every rank calls it."""
        from ..model.build import save_model, save_model_streamed
        from ..model.lora import save_adapter

        folder = Path(folder) if folder is not None else self.output_dir
        writer = self.rank0 if writer is None else writer
        if self.engine.parameters_partitioned and self.lora_config is None and self.pipe_names is None:
            save_model_streamed(folder, self.model, self.info, self.engine.module_state_entries(), writer,
                                self.tokenizer)  # one parameter whole at a time
            return folder
        state = self.engine.module_state_dict()
        if self.pipe_names is not None:  # every stage's weights, under the model's names
            from ...parallel.pipeline.from_model import whole_state

            state = whole_state(self.engine, state, self.pipe_names)
        if writer:
            if self.lora_config is not None:
                save_adapter(folder, state, self.lora_config, self.base_model)
                if self.tokenizer is not None:
                    self.tokenizer.save_pretrained(str(folder))
            else:
                save_model(folder, self.model, self.info, state, self.tokenizer)
        return folder

    def _deepspeed_position(self) -> dict:
        """A checkpoint DeepSpeed wrote (or converted to its universal format) holds no place
        in an epoch: continue after the micro-batches its steps consumed, in this run's sample
        order. zerotrain's own conversions keep the trainer's state, and skip this."""
        epoch, micro = divmod(self.engine.global_steps * self.engine.gradient_accumulation_steps(),
                              self.micro_per_epoch)
        return {"epoch": epoch, "micro_in_epoch": micro, "tokens": 0, "world_size": self.comm.world_size,
                "data_parallel_size": self.data_world, "train_time": 0.0, "best_metric": None, "best_checkpoint": None}

    def _resume(self) -> int:
        save_dir, tag = self.plan.folder.resume
        path, client = self.engine.load_checkpoint(str(save_dir), tag=tag)
        state = (client or {}).get("trainer")
        if path is not None and state is None and (deepspeed_folder(path) is not None or is_universal(Path(path))):
            state = self._deepspeed_position()
        if path is None or state is None:
            raise ConfigError(f"--resume_from_checkpoint {self.args.resume_from_checkpoint}: "
                              f"{path or save_dir} is not a checkpoint written by `zerotrain train`")
        # the data order is planned per data-parallel rank (sequence, tensor and pipeline ranks of
        # one data index read the same batches); a checkpoint without that count names its processes
        if "data_parallel_size" in state:
            written_by, here, what = state["data_parallel_size"], self.data_world, "data-parallel ranks"
        else:
            written_by, here, what = state.get("world_size", self.comm.world_size), self.comm.world_size, "processes"
        if written_by != here:
            raise ConfigError(f"--resume_from_checkpoint: {path} was written by {written_by} {what} and this run "
                              f"has {here}; resume with {written_by} {what} (its position in the epoch exists only "
                              "for that count)")
        self.epoch, self.micro_in_epoch, self.tokens = state["epoch"], state["micro_in_epoch"], state["tokens"]
        self.clock = TrainClock(state["train_time"])
        self.best_metric, self.best_checkpoint = state["best_metric"], state["best_checkpoint"]
        self.last_saved = self.engine.global_steps
        if self.plateau is not None and state.get("plateau") is not None:
            self.plateau.load_state_dict(state["plateau"])
        if self.rank0:
            print(f"resumed from {path} at step {self.engine.global_steps} (epoch {self.epoch})", flush=True)
        return self.engine.global_steps

