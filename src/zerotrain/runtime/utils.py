"""`deepspeed.runtime.utils` under zerotrain's name: the DeepSpeed-named alias of
helpers/seed_memory.py (set_random_seed, see_memory_usage)."""

from ..helpers.refusals import missing
from ..helpers.seed_memory import see_memory_usage, set_random_seed

__all__ = ["set_random_seed", "see_memory_usage"]
__getattr__ = missing(__name__, way="zerotrain.runtime.utils has set_random_seed and see_memory_usage")
