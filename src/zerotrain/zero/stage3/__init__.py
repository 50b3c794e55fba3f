"""ZeRO stage 3: parameters sharded too. stage.py (the strategy), gather.py (every parameter
cut into one chunk per rank, and gathered back), schedule.py (which modules' parameters are
whole when), pages.py (the memory whole parameters use), partitioned_param.py (parameters
that notice being touched), init.py (`zerotrain.zero.Init`: a model built already
partitioned) and gathered_parameters.py (`zerotrain.zero.GatheredParameters`)."""
