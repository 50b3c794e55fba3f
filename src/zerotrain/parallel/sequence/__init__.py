"""Ulysses sequence parallelism: each rank holds 1/S of every sequence outside attention and 1/S
of the heads inside it (ulysses.py: the all-to-all around the core attention; batch.py: the
cut, the positions and the loss over the real labels; setup.py: the ranks and the engine;
hf.py: Hugging Face models under DeepSpeed's ALST names; tiled.py: ALST's memory pieces, the
MLP and the loss over tiles of the sequence)."""

from .hf import UlyssesSPAttentionHF, UlyssesSPDataLoaderAdapter
from .tiled import TiledFusedLogitsLoss, TiledMLP, sequence_tiled_compute, tile_model

__all__ = ["UlyssesSPAttentionHF", "UlyssesSPDataLoaderAdapter", "TiledMLP", "sequence_tiled_compute",
           "TiledFusedLogitsLoss", "tile_model"]
