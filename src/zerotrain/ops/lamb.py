"""`deepspeed.ops.lamb` under zerotrain's name: LAMB is not built, so every name here is refused
with the zerotrain way (an Adam, or any torch optimizer named in the config's optimizer block)."""

from ..helpers.refusals import missing

__getattr__ = missing(__name__, way="LAMB is not built; use zerotrain.ops.adam.FusedAdam or a torch optimizer "
                                    "named in the config's optimizer block")
