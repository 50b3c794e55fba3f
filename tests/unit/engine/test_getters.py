"""DeepSpeed's engine getters read the config in force."""

import torch

import zerotrain


def test_getters_read_the_config():
    cfg = {"train_batch_size": 2, "bf16": {"enabled": True}, "gradient_clipping": 0.5,
           "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
           "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    engine, *_ = zerotrain.initialize(model=torch.nn.Linear(2, 2), config=cfg)
    assert (engine.bfloat16_enabled(), engine.fp16_enabled()) == (True, False)
    assert (engine.zero_optimization(), engine.zero_optimization_stage()) == (True, 2)
    assert engine.zero_offload_optimizer().device == "cpu" and engine.zero_use_cpu_optimizer()
    assert engine.zero_offload_param() is None and engine.gradient_clipping() == 0.5
    engine.destroy()
    engine, *_ = zerotrain.initialize(model=torch.nn.Linear(2, 2), config={"train_batch_size": 2})
    assert (engine.bfloat16_enabled(), engine.zero_optimization(), engine.zero_use_cpu_optimizer()) == (False, False, False)
    engine.destroy()
