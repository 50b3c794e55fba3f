"""Monitors: DeepSpeed's monitor blocks acting through the engine's hooks (feature.py), and
the backends both the engine and the trainer's report_to write to (backends.py)."""

from .backends import EXTRAS, CometBackend, CSVBackend, MLflowBackend, TensorBoardBackend, WandbBackend, require
from .feature import MonitorFeature, monitor_feature

__all__ = ["EXTRAS", "CSVBackend", "CometBackend", "MLflowBackend", "MonitorFeature", "TensorBoardBackend",
           "WandbBackend", "monitor_feature", "require"]
