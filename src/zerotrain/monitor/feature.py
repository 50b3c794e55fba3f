"""DeepSpeed's monitor as an engine feature: after every optimizer step, rank 0 writes

    Train/Samples/train_loss    the mean loss of the step's micro-batches on rank 0
    Train/Samples/lr            the first parameter group's learning rate
    Train/Samples/loss_scale    the loss scale (fp16 only)

at step = samples trained so far (engine.global_samples), to every enabled backend of the
config's tensorboard, csv_monitor, wandb and comet blocks, as DeepSpeed's engine does. The
engine only calls the hooks (engine/hooks.py): it never knows a monitor is attached.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..engine.hooks import EngineFeature
from .backends import CometBackend, CSVBackend, TensorBoardBackend, WandbBackend, require


def _folder(block) -> Path:
    return Path(block.output_path or "runs").expanduser() / block.job_name


def _on(block) -> bool:
    return block is not None and block.enabled


def check_packages(config) -> None:
    """Before training: each enabled block whose package is missing is one line naming its extra."""
    if _on(config.wandb):
        require("wandb", "wandb.enabled")
    if _on(config.comet):
        require("comet_ml", "comet.enabled")


def open_backends(config) -> list:
    """The enabled blocks' backends (called on rank 0 only)."""
    out = []
    if _on(config.tensorboard):
        out.append(TensorBoardBackend(_folder(config.tensorboard)))
    if _on(config.csv_monitor):
        out.append(CSVBackend(_folder(config.csv_monitor)))
    if _on(config.wandb):
        w = config.wandb
        out.append(WandbBackend("wandb.enabled", project=w.project, group=w.group, entity=w.team))
    if _on(config.comet):
        c = config.comet
        online = c.online if c.online is not None else os.environ.get("COMET_MODE", "").lower() != "offline"
        out.append(CometBackend("comet.enabled", every=c.samples_log_interval, api_key=c.api_key,
                                project_name=c.project, workspace=c.workspace, experiment_key=c.experiment_key,
                                mode=c.mode, online=online))
        if c.experiment_name:
            out[-1].experiment.set_name(c.experiment_name)
    return out


class MonitorFeature(EngineFeature):
    name = "monitor"

    def __init__(self, config):
        check_packages(config)
        self.config = config
        self.backends: list | None = None  # opened at train start, on rank 0
        self.loss_sum, self.loss_count = None, 0

    def on_train_start(self, engine) -> None:
        if engine.global_rank == 0 and self.backends is None:
            self.backends = open_backends(self.config)

    def after_backward(self, engine, loss) -> None:
        loss = loss.detach().float()
        self.loss_sum = loss if self.loss_sum is None else self.loss_sum + loss  # read once per step
        self.loss_count += 1

    def after_step(self, engine) -> None:
        total, count = self.loss_sum, self.loss_count
        self.loss_sum, self.loss_count = None, 0
        if not self.backends or total is None:
            return
        loss = total.item() / count
        step = engine.global_samples
        events = [("Train/Samples/train_loss", loss, step)]
        lrs = engine.get_lr()
        if lrs:
            events.append(("Train/Samples/lr", lrs[0], step))
        if engine.loss_scaler is not None:
            events.append(("Train/Samples/loss_scale", engine.loss_scale, step))
        for backend in self.backends:
            backend.write_events(events)

    def on_close(self, engine) -> None:
        for backend in self.backends or ():
            backend.close()
        self.backends = []


def monitor_feature(config):
    """The feature when any monitor block is enabled, else None (features/__init__.py's table)."""
    blocks = (config.tensorboard, config.csv_monitor, config.wandb, config.comet)
    return MonitorFeature(config) if any(_on(b) for b in blocks) else None
