"""DeepSpeed's monitor blocks: where the engine writes Train/Samples/train_loss, lr and
loss_scale at every optimizer step (monitor/ does the writing; a block that is absent or
`"enabled": false` writes nothing). The wandb and comet blocks need their packages
(`pip install zerotrain[wandb]`, `zerotrain[comet]`); initialize names the extra when one is
missing."""

from __future__ import annotations

from typing import Any

from .base import Block, Int, acts, no_effect

_JOB = "DeepSpeedJobName"


class TensorBoardConfig(Block):
    enabled: bool = acts(False, "Write TensorBoard event files (zerotrain's own writer: no package needed).")
    output_path: str = acts("", "Folder the job's folder goes in; empty: ./runs.")
    job_name: str = acts(_JOB, "Subfolder of output_path for this job's event files.")


class CSVMonitorConfig(Block):
    enabled: bool = acts(False, "Write one CSV file per event (step,value rows).")
    output_path: str = acts("", "Folder the job's folder goes in; empty: ./runs.")
    job_name: str = acts(_JOB, "Subfolder of output_path for this job's CSV files.")


class WandbConfig(Block):
    enabled: bool = acts(False, "Log to Weights & Biases (needs zerotrain[wandb]); WANDB_MODE=offline "
                                "keeps the run on disk.")
    group: str | None = acts(None, "wandb.init group.")
    team: str | None = acts(None, "wandb.init entity.")
    project: str = acts("deepspeed", "wandb.init project.")


class CometConfig(Block):
    enabled: bool = acts(False, "Log to Comet (needs zerotrain[comet]).")
    samples_log_interval: Int = acts(100, "Log every this many samples.", ge=1)
    project: str | None = acts(None, "Comet project.")
    workspace: str | None = acts(None, "Comet workspace.")
    api_key: str | None = acts(None, "Comet API key (else COMET_API_KEY).")
    experiment_name: str | None = acts(None, "Name of the experiment.")
    experiment_key: str | None = acts(None, "Key of an experiment to continue.")
    online: bool | None = acts(None, "false: an offline experiment, written to disk.")
    mode: str | None = acts(None, "Comet's start mode (get, create, get_or_create).")


_IGNORED = "DeepSpeed ignores it too: the tensorboard, wandb, csv_monitor and comet blocks configure the monitors"


class MonitorBlocks(Block):
    """The four blocks, at the config's top level as in DeepSpeed."""

    tensorboard: TensorBoardConfig | None = acts(None, "TensorBoard monitor.")
    wandb: WandbConfig | None = acts(None, "Weights & Biases monitor.")
    csv_monitor: CSVMonitorConfig | None = acts(None, "CSV monitor.")
    comet: CometConfig | None = acts(None, "Comet monitor.")
    monitor_config: Any = no_effect(None, _IGNORED)
