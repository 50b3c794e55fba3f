"""`deepspeed.runtime.data_pipeline.data_routing.helper`: zerotrain's convert_to_random_ltd and
the state-dict helpers (data_efficiency/routing.py)."""

from ....data_efficiency.routing import convert_to_random_ltd, remove_random_ltd_state_dict, save_without_random_ltd
from ....helpers.refusals import missing

__all__ = ["convert_to_random_ltd", "remove_random_ltd_state_dict", "save_without_random_ltd"]
__getattr__ = missing(__name__, way="the helper has convert_to_random_ltd, save_without_random_ltd and "
                                    "remove_random_ltd_state_dict")
