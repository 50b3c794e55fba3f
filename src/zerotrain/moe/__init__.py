"""`deepspeed.moe` under zerotrain's name, for scripts that import its helpers without using
expert layers: `utils` answers for a model that has none. zerotrain has no expert (MoE)
layers, so `moe.layer` (`MoE`), `moe.experts`, `moe.sharded_moe` and `moe.mappings` are
refused by name (helpers/refusals.py)."""

from ..helpers.refusals import missing

__getattr__ = missing(__name__, way="there are no expert (MoE) layers; zerotrain.moe has utils "
                      "(is_moe_param, split_params_into_different_moe_groups_for_optimizer) for models without them")
