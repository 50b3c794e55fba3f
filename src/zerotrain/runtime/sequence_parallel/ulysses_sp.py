"""`deepspeed.runtime.sequence_parallel.ulysses_sp` under zerotrain's name: the DeepSpeed-named
alias of parallel/sequence/ (UlyssesSPAttentionHF, UlyssesSPDataLoaderAdapter; TiledMLP,
sequence_tiled_compute and TiledFusedLogitsLoss from tiled.py)."""

from ...helpers.refusals import missing
from ...parallel.sequence import UlyssesSPAttentionHF, UlyssesSPDataLoaderAdapter
from ...parallel.sequence.tiled import TiledFusedLogitsLoss, TiledMLP, sequence_tiled_compute

__all__ = ["UlyssesSPAttentionHF", "UlyssesSPDataLoaderAdapter", "TiledMLP", "sequence_tiled_compute",
           "TiledFusedLogitsLoss"]
__getattr__ = missing(__name__, way="zerotrain.runtime.sequence_parallel.ulysses_sp has " + ", ".join(__all__))
