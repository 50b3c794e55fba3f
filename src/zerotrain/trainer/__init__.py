"""HF-Trainer-style training on the zerotrain engine (`zerotrain train`).

Read in this order:

    args.py        the options (HF TrainingArguments names); hf_options.py: HF / LLaMA-Factory names
                   mapped or refused; ds_config.py: the DeepSpeed config from the options
    plan.py        the run plan: options, parallel sizes, run folder and DeepSpeed config, made once
    preflight.py   what the options alone decide, checked before anything is loaded: makes the plan
    assembly.py    how one run is put together: plan -> tokenizer -> data -> model -> LoRA -> Trainer
    loop/          the Trainer: its loop (trainer.py), its events (callbacks.py), one micro-batch
                   and what it counts (step.py), evaluation (evaluate.py) and the GLUE metrics
                   (glue_metrics.py), Ctrl-C / SIGTERM (interrupt.py), the run folder: resume,
                   rotation, shared or node-local storage (run_folder.py)
    data/          data files -> tokenized, cached datasets (readers, prepare), conversations and
                   chat templates (chat), packing, tokenizers, batches (collate), which rank trains
                   on which sample (sampler); GLUE tasks, their files and pair encoding
                   (glue_tasks, glue_files, glue)
    model/         presets, model folders in and out (build), LoRA (lora), gradient checkpointing
    report/        what a run shows and writes: the banner, metrics.jsonl and TensorBoard
                   (metrics_log, tensorboard), the progress bar and summary (progress), the PNG (plot)
"""

from .args import DataArguments, ModelArguments, TrainingArguments
from .loop.callbacks import TrainerCallback
from .loop.trainer import Trainer
from .plan import RunPlan

__all__ = ["Trainer", "TrainerCallback", "TrainingArguments", "ModelArguments", "DataArguments", "RunPlan"]
