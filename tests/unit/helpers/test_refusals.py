"""A DeepSpeed name zerotrain does not claim fails in one line naming it and the zerotrain way,
whichever door the script uses."""

import pytest

import zerotrain
from zerotrain.errors import NotBuiltError


@pytest.mark.parametrize("statement, words", [
    ("zerotrain.init_inference", "engine.module"),
    ("from zerotrain import DeepSpeedTransformerLayer", "fused kernels"),
    ("from zerotrain.ops.lamb import FusedLamb", "FusedAdam"),
    ("from zerotrain.ops.adam import FusedAdamW", "adam_w_mode"),
    ("import zerotrain.moe.layer", "expert"),
    ("from zerotrain.ops.sparse_attention import SparseSelfAttention", "sparse attention"),
    ("from zerotrain.runtime.zero.partition_parameters import ZeroParamStatus", "zerotrain.zero.Init"),
    ("from zerotrain.utils import groups", "new_group"),
    ("from zerotrain.accelerator import get_accelerators", "get_accelerator()"),
    ("from zerotrain.checkpointing import get_cuda_rng_tracker", "set_random_seed"),
])
def test_a_refused_name_says_what_to_use(statement, words):
    with pytest.raises(NotBuiltError) as info:
        exec(statement)
    message = str(info.value)
    assert "\n" not in message and "not in zerotrain" in message and words in message, message


def test_probes_of_the_top_level_still_get_attribute_errors():
    assert getattr(zerotrain, "no_such_helper", None) is None
    with pytest.raises(AttributeError, match="no_such_helper: not in zerotrain; docs/migrating.md"):
        zerotrain.no_such_helper
    assert not hasattr(zerotrain, "__wrapped__")


def test_deepspeed_module_names_are_aliases_of_zerotraines_own():
    from zerotrain.engine.engine import Engine
    from zerotrain.pipe import RepeatingLoader
    from zerotrain.runtime.engine import DeepSpeedEngine
    from zerotrain.runtime.zero import GatheredParameters
    from zerotrain.utils import RepeatingLoader as from_utils

    assert DeepSpeedEngine is Engine is zerotrain.DeepSpeedEngine
    assert from_utils is RepeatingLoader and GatheredParameters is zerotrain.zero.GatheredParameters
    cfg = zerotrain.DeepSpeedConfig({"train_batch_size": 8, "gradient_accumulation_steps": 2})
    assert cfg.train_micro_batch_size_per_gpu == 4
