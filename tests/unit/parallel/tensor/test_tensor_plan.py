"""Which layers a tensor-parallel split cuts, and the one-line refusals (no processes needed)."""

from __future__ import annotations

import pytest
import torch

from zerotrain.config import load_config, tensor_parallel_size
from zerotrain.config.report import no_effect_keys
from zerotrain.errors import ConfigError
from zerotrain.models.gpt import GPT, GPTConfig
from zerotrain.parallel.tensor.plan import tensor_plan


def _llama(heads: int = 4, kv: int = 2, inner: int = 64):
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=inner, num_hidden_layers=2,
                                        num_attention_heads=heads, num_key_value_heads=kv))


def test_gpt_blocks_are_split_and_the_head_stays_whole_when_asked():
    plan, why = tensor_plan(GPT(GPTConfig.preset("tiny")), 2, vocab=False)
    assert why is None
    assert plan == {"blocks.0.qkv": "fused_colwise:3", "blocks.0.proj": "rowwise", "blocks.0.fc": "colwise",
                    "blocks.0.fc_out": "rowwise", "blocks.1.qkv": "fused_colwise:3", "blocks.1.proj": "rowwise",
                    "blocks.1.fc": "colwise", "blocks.1.fc_out": "rowwise"}


def test_a_given_plan_is_checked_against_the_model_it_splits():
    """A pipeline stage's share of the whole model's plan (PipelineModule(tensor_plan=...))."""
    gpt = GPT(GPTConfig.preset("tiny"))
    assert tensor_plan(gpt, 2, given={"blocks.1.fc": "colwise"}) == ({"blocks.1.fc": "colwise"}, None)
    assert tensor_plan(gpt, 2, given={}) == ({}, None)  # a stage with nothing to split
    with pytest.raises(ConfigError, match=r"^tensor_parallel: the plan names blocks.7.fc, which is not a module of GPT;"):
        tensor_plan(gpt, 2, given={"blocks.7.fc": "colwise"})
    with pytest.raises(ConfigError, match=r"blocks.1.ln_1 is a LayerNorm, not a Linear"):
        tensor_plan(gpt, 2, given={"blocks.1.ln_1": "colwise"})


def test_hf_plan_comes_from_the_config_and_reaches_into_wrappers():
    wrapped = torch.nn.ModuleDict({"inner": _llama()})
    plan, _ = tensor_plan(wrapped, 2)
    assert plan["inner.model.layers.1.self_attn.q_proj"] == "colwise"
    assert plan["inner.model.layers.0.mlp.down_proj"] == "rowwise"
    # q, k, v and gate, up read one input each: their modules convert it once
    assert plan["inner.model.layers.1.self_attn"] == plan["inner.model.layers.0.mlp"] == "shared_input"
    assert len(plan) == 14 + 4 and not any("lm_head" in k or "embed" in k for k in plan)


def test_the_vocabulary_is_split_where_it_divides():
    gpt, _ = tensor_plan(GPT(GPTConfig.preset("tiny")), 2, vocab=None)
    assert {k: v for k, v in gpt.items() if "blocks" not in k} == {"wte": "vocab_embedding", "lm_head": "vocab_head"}
    llama, why = tensor_plan(torch.nn.ModuleDict({"inner": _llama()}), 2, vocab=True)
    assert why is None
    assert llama["inner.model.embed_tokens"] == "vocab_embedding" and llama["inner.lm_head"] == "vocab_head"
    odd = GPT(GPTConfig(vocab_size=63, n_embd=32, n_head=2, n_layer=1))
    plan, why = tensor_plan(odd, 2, vocab=None)  # null: whole, and why
    assert why == "the vocabulary of 63 tokens does not divide by 2" and "wte" not in plan
    with pytest.raises(ConfigError, match="^tensor_parallel.vocab_parallel_lm_head true: the vocabulary of 63 tokens "
                                          "does not divide by 2; set it to false .* or pad the vocabulary$"):
        tensor_plan(odd, 2, vocab=True)


@pytest.mark.parametrize("model,message", [
    (lambda: GPT(GPTConfig(n_embd=36, n_head=3, n_layer=1)), "the model has 3 attention heads, not divisible by 2"),
    (lambda: _llama(kv=1), "the model has 1 key/value heads, not divisible by 2"),
    (lambda: _llama(kv=4, inner=66), "model.layers.0.mlp.gate_proj has 66 output features, not divisible by 4"),
    (lambda: torch.nn.Linear(4, 4), "Linear has no tensor-parallel plan"),
])
def test_what_cannot_be_split_is_one_line(model, message):
    size = 4 if "66" in message else 2
    with pytest.raises(ConfigError, match=message) as info:
        tensor_plan(model(), size)
    assert "\n" not in str(info.value) and ("autotp_size" in str(info.value) or "tensor_parallel" in str(info.value))


def test_the_block_is_read_before_the_layout():
    assert tensor_parallel_size({"tensor_parallel": {"autotp_size": 2}}) == 2
    assert tensor_parallel_size({"tensor_parallel": {"autotp_size": 2, "enabled": False}}) == 1
    assert tensor_parallel_size({"train_batch_size": 4}) == 1
    assert tensor_parallel_size({"tensor_parallel": {"autotp_size": "two"}}) == 1  # load_config names it
    with pytest.raises(ConfigError, match="tensor_parallel.autotp_size"):
        load_config({"train_batch_size": 4, "tensor_parallel": {"autotp_size": "two"}}, world_size=4)
    cfg = load_config({"train_batch_size": 4, "tensor_parallel": {"autotp_size": 2, "tp_overlap_comm": True,
                                                                   "tp": {"tp_size": 2}}}, world_size=2)
    assert cfg.tensor_parallel.size == 2
    assert no_effect_keys(cfg) == ["tensor_parallel.tp_overlap_comm", "tensor_parallel.tensor_parallel"]
