"""What DeepSpeed scripts (and HF/accelerate through them) call on initialize, the engine and the
optimizer: args.deepspeed_config, a client optimizer's own groups, attributes of the wrapped
model, the fp16 scale on the optimizer, save_16bit_model, frozen-free checkpoints."""

from __future__ import annotations

import argparse
import copy
import json
import logging
import pickle

import pytest
import torch
from safetensors.torch import load_file as load_safetensors
from torch import nn

import zerotrain
from zerotrain.errors import ConfigError

from engine_helpers import (adamw, assert_same_params, config, gpt_config, micro_batch, mlp, mse, nan_step,
                            no_optimizer_config, tiny_gpt, train_engine, train_gpt, train_reference)


# ---- initialize ------------------------------------------------------------------------------
def test_args_deepspeed_config_and_the_deprecated_deepscale_config(tmp_path, zerotrain_log):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config(micro=3)))
    engine, *_ = zerotrain.initialize(args=argparse.Namespace(deepspeed_config=str(path)), model=mlp())
    assert engine.train_micro_batch_size_per_gpu() == 3
    engine, *_ = zerotrain.initialize(args=argparse.Namespace(deepscale_config=str(path), local_rank=0), model=mlp())
    assert engine.train_micro_batch_size_per_gpu() == 3
    assert any("deepscale_config is deprecated" in r.getMessage() for r in zerotrain_log.records)
    with pytest.raises(ConfigError, match="both deepscale_config and deepspeed_config"):
        zerotrain.initialize(args=argparse.Namespace(deepscale_config=str(path), deepspeed_config=str(path)),
                             model=mlp())
    with pytest.raises(ConfigError, match="config twice"):
        zerotrain.initialize(args=argparse.Namespace(deepspeed_config=str(path)), model=mlp(), config=config())
    with pytest.raises(ConfigError, match="first argument is args .* pass the model as model="):
        zerotrain.initialize(mlp(), config=config())


def test_client_optimizer_groups_win_over_model_parameters_and_empty_groups_go(zerotrain_log):
    model = mlp()
    model[2].bias.requires_grad_(False)
    reference = copy.deepcopy(model)

    def groups(m):
        return [{"params": [m[0].weight, m[0].bias], "lr": 0.05}, {"params": [m[2].weight], "lr": 0.2},
                {"params": [m[2].bias], "lr": 0.3}, {"params": [], "lr": 9.0}]

    client = torch.optim.SGD(groups(model), lr=0.1)
    engine, optimizer, _, _ = zerotrain.initialize(model=model, optimizer=client,
                                                   model_parameters=[model[0].weight], config=no_optimizer_config())
    assert optimizer is client
    assert [g["lr"] for g in optimizer.param_groups] == [0.05, 0.2]  # frozen-only and empty groups dropped
    assert any("model_parameters is ignored" in r.getMessage() for r in zerotrain_log.records)
    train_engine(engine, 3, 1)
    ref_groups = groups(reference)[:2]
    train_reference(reference, torch.optim.SGD(ref_groups, lr=0.1), 3, 1, clip=1e9)  # clip: skips the frozen
    assert_same_params(model, reference)


# ---- the engine stands in for the model --------------------------------------------------------
class Captioner(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(6, 3)
        self.vocab = ["a", "b", "c"]

    def forward(self, x):
        return self.body(x)

    def generate(self, x, max_new_tokens: int = 1):
        return [self.vocab[i] for i in self.body(x).argmax(-1).tolist()] * max_new_tokens


def test_attributes_and_methods_of_the_model_are_reached_through_the_engine():
    engine, *_ = zerotrain.initialize(model=Captioner(), config=config())
    x = torch.randn(2, 6)
    assert engine.generate(x, max_new_tokens=2) == engine.module.generate(x, max_new_tokens=2)
    assert engine.vocab is engine.module.vocab
    assert engine.body is engine.module.body
    assert engine.train_micro_batch_size_per_gpu() == 2  # the engine's own names still win
    with pytest.raises(AttributeError, match="neither the engine nor its Captioner has an attribute 'nope'"):
        engine.nope


# ---- the fp16 scale where DeepSpeed scripts read it ------------------------------------------------
def test_fp16_loss_scale_is_readable_on_the_optimizer():
    fp16 = {"enabled": True, "initial_scale_power": 8, "loss_scale_window": 2, "hysteresis": 1}
    model = mlp()
    engine, optimizer, _, _ = zerotrain.initialize(model=model, config=config(fp16=fp16))
    # fp16 keeps separate fp32 masters, stepped by AdamW block by block (as DeepSpeed returns its
    # own fp16 optimizer wrapper); it is a torch optimizer to torch's schedulers
    assert isinstance(optimizer, torch.optim.Optimizer) and type(optimizer.inner) is torch.optim.AdamW
    assert engine.optimizer is optimizer
    assert (optimizer.cur_scale, optimizer.loss_scale, optimizer.dynamic_loss_scale, optimizer.scale_window) \
        == (256.0, 256.0, True, 2)
    assert optimizer.loss_scale_config.cur_iter == 0
    train_engine(engine, 3, 1, dtype=torch.float16)
    assert (optimizer.cur_scale, optimizer.loss_scale_config.cur_iter) == (512.0, 3)
    nan_step(engine, 9, dtype=torch.float16)
    assert (optimizer.cur_scale, engine.optimizer.loss_scale) == (256.0, 256.0)
    static = zerotrain.initialize(model=mlp(), config=config(fp16={"enabled": True, "loss_scale": 128}))[1]
    assert (static.cur_scale, static.dynamic_loss_scale, static.scale_window) == (128.0, False, None)
    assert type(zerotrain.initialize(model=mlp(), config=config())[1]) is torch.optim.AdamW  # fp32: untouched


# ---- save_16bit_model ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["pytorch_model.bin", "model.safetensors"])
def test_save_16bit_model_writes_the_whole_module_in_its_dtype(tmp_path, name):
    engine, *_ = zerotrain.initialize(model=tiny_gpt(), config=gpt_config(bf16={"enabled": True}))
    train_gpt(engine, 2)
    assert engine.save_16bit_model(tmp_path, name) is True
    path = tmp_path / name
    saved = load_safetensors(path) if name.endswith(".safetensors") else torch.load(path, weights_only=True)
    want = engine.module_state_dict()
    assert saved.keys() == want.keys()  # both names of the tied embedding
    for k in want:
        assert saved[k].dtype == torch.bfloat16 and torch.equal(saved[k], want[k]), k
    for k, v in saved.items():  # each its own storage, not the flat buffer it was a view of
        assert v.untyped_storage().nbytes() == v.numel() * v.element_size(), k


def test_save_16bit_model_loads_into_transformers(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    hf_config = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=1, n_head=2)
    engine, *_ = zerotrain.initialize(model=GPT2LMHeadModel(hf_config), config=gpt_config(fp16={"enabled": True}))
    tokens = torch.randint(0, 64, (2, 16))
    engine.backward(engine(tokens, labels=tokens).loss)
    engine.step()
    hf_config.save_pretrained(tmp_path)
    engine.save_16bit_model(tmp_path, "model.safetensors", exclude_frozen_parameters=True)
    loaded = GPT2LMHeadModel.from_pretrained(tmp_path, dtype=torch.float16)
    for k, v in engine.module_state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k


def test_save_16bit_model_can_leave_frozen_parameters_out(tmp_path):
    model = mlp()
    model[0].requires_grad_(False)
    engine, *_ = zerotrain.initialize(model=model, config=config())
    engine.save_16bit_model(tmp_path, exclude_frozen_parameters=True)
    assert sorted(torch.load(tmp_path / "pytorch_model.bin")) == ["2.bias", "2.weight"]


@pytest.mark.parametrize("save_dir", [None, "", "  "])
def test_saving_into_no_folder_is_one_clear_error(save_dir):
    engine, *_ = zerotrain.initialize(model=mlp(), config=config())
    with pytest.raises(ConfigError, match="save_checkpoint: save_dir is"):
        engine.save_checkpoint(save_dir)
    with pytest.raises(ConfigError, match="save_16bit_model: save_dir is"):
        engine.save_16bit_model(save_dir)


# ---- checkpoints without the frozen parameters -----------------------------------------------
def test_checkpoint_without_frozen_parameters_resumes(tmp_path):
    def frozen_first(seed):
        model = mlp(seed)
        model[0].requires_grad_(False)
        return model

    engine, *_ = zerotrain.initialize(model=frozen_first(0), config=config())
    train_engine(engine, 2, 1)
    engine.save_checkpoint(tmp_path, tag="t", exclude_frozen_parameters=True)
    saved = torch.load(tmp_path / "t" / "model_states.pt", weights_only=True)["module"]
    assert sorted(saved) == ["2.bias", "2.weight"]
    other = frozen_first(1)  # different frozen values: they are the model's own, not the checkpoint's
    frozen_before = copy.deepcopy(other[0].state_dict())
    resumed, *_ = zerotrain.initialize(model=other, config=config())
    resumed.load_checkpoint(tmp_path, tag="t")  # strict: the frozen keys are missing on purpose
    assert resumed.global_steps == 2
    assert all(torch.equal(v, frozen_before[k]) for k, v in other[0].state_dict().items())
    assert torch.equal(other[2].weight, engine.module[2].weight)


def test_load_state_dict_from_zero_checkpoint_puts_the_weights_into_a_model(tmp_path):
    from zerotrain.checkpoint.consolidate import load_state_dict_from_zero_checkpoint
    from zerotrain.errors import CheckpointError

    engine, *_ = zerotrain.initialize(model=tiny_gpt(), config=gpt_config(zero_optimization={"stage": 2}))
    train_gpt(engine, 2)
    engine.save_checkpoint(tmp_path)
    fresh = tiny_gpt(seed=5)
    assert load_state_dict_from_zero_checkpoint(fresh, tmp_path) is fresh
    assert_same_params(fresh, engine.module, atol=0)
    with pytest.raises(CheckpointError, match="does not match the model"):
        load_state_dict_from_zero_checkpoint(mlp(), tmp_path)


@pytest.mark.parametrize("safe", [False, True])
def test_convert_zero_checkpoint_to_fp32_state_dict_writes_a_model_file(tmp_path, safe):
    from zerotrain.checkpoint.consolidate import convert_zero_checkpoint_to_fp32_state_dict

    model = tiny_gpt()
    model.blocks[0].requires_grad_(False)
    engine, *_ = zerotrain.initialize(model=model, config=gpt_config(bf16={"enabled": True},
                                                                     zero_optimization={"stage": 2}))
    train_gpt(engine, 2)
    engine.save_checkpoint(tmp_path / "ckpt")
    path = convert_zero_checkpoint_to_fp32_state_dict(tmp_path / "ckpt", tmp_path / "out", safe_serialization=safe,
                                                      exclude_frozen_parameters=True)
    assert path.name == ("model.safetensors" if safe else "pytorch_model.bin")
    state = load_safetensors(path) if safe else torch.load(path, weights_only=True)
    want = {k: v for k, v in engine.module_state_dict().items() if not k.startswith("blocks.0.")}
    assert state.keys() == want.keys()
    assert all(state[k].dtype == torch.float32 for k in state)
    if not safe:  # the tied embedding is one tensor under both names, as DeepSpeed writes it
        assert state["lm_head.weight"] is state["wte.weight"]


# ---- stage 3: releasing what stays gathered ------------------------------------------------------
@pytest.mark.parametrize("persistence", [0, None])  # None: the default keeps all tiny params whole
def test_empty_partition_cache_releases_the_parameters_kept_whole(persistence):
    zero = {"stage": 3} if persistence is None else {"stage": 3, "stage3_param_persistence_threshold": persistence}
    engine, *_ = zerotrain.initialize(model=tiny_gpt(), config=gpt_config(zero_optimization=zero))
    train_gpt(engine, 2)
    engine.eval()
    with torch.no_grad():
        tokens = torch.randint(0, 64, (2, 16))
        engine(tokens, labels=tokens)
    whole = [n for n, p in engine.module.named_parameters() if p.untyped_storage().nbytes()]
    assert whole, "the test needs stage 3 to keep something whole after an evaluation forward"
    engine.empty_partition_cache()
    assert [n for n, p in engine.module.named_parameters() if p.untyped_storage().nbytes()] == []
    engine.train()
    train_gpt(engine, 3)  # gathers again as usual


def test_empty_partition_cache_is_harmless_at_stage_0():
    engine, *_ = zerotrain.initialize(model=mlp(), config=config())
    engine.empty_partition_cache()
    x, y = micro_batch(0)
    engine.backward(mse(engine, x, y))
    engine.step()
