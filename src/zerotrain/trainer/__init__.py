"""HF-Trainer-style training on the zerotrain engine (`zerotrain train`).

Read in this order: args.py (the options), pipeline.py (how a run is put together),
trainer.py (the loop), then data.py / sampler.py / models.py / lora.py / ds_config.py as needed.
"""

from .args import DataArguments, ModelArguments, TrainingArguments
from .trainer import Trainer

__all__ = ["Trainer", "TrainingArguments", "ModelArguments", "DataArguments"]
