"""Data feeding for the engine: a seeded, resumable, rank-disjoint sampler and loader."""

from .loader import DistributedSampler, build_dataloader

__all__ = ["DistributedSampler", "build_dataloader"]
