"""Stand-in for the few torchvision names the DeepSpeedExamples scripts use (torchvision is not
installed here: PyPI's build does not match this torch). Only what the harness's scripts
touch: offline datasets of random images (no download), the transforms they compose, two
small classifier models with torchvision's attribute layout, and a no-op image writer.
Written for harness/deepspeed_scripts.py; not torchvision's code."""

from . import datasets, models, transforms, utils  # noqa: F401

__version__ = "0.0+zerotrain-standin"
