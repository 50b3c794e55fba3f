"""The PLD recipe's BERT model config through --model_config, and the bert-base preset of its shape,
checked against HF transformers' BERT layer of the same config."""

from __future__ import annotations

import json

import pytest
import torch

from zerotrain.errors import ConfigError
from zerotrain.models.bert import BertConfig, bert_config_keys
from zerotrain.trainer.data.tokenizer import byte_tokenizer
from zerotrain.trainer.model.build import PRESETS, build_model

SEED = {"vocab_size_or_config_json_file": 119547, "hidden_size": 768, "num_hidden_layers": 12,
        "num_attention_heads": 12, "intermediate_size": 3072, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 512, "type_vocab_size": 2,
        "initializer_range": 0.02}


def _hf_layer_parameters(cfg: dict) -> int:
    from transformers import BertConfig as HFConfig
    from transformers.models.bert.modeling_bert import BertLayer

    with torch.device("meta"):
        layer = BertLayer(HFConfig(**{k if k != "vocab_size_or_config_json_file" else "vocab_size": v
                                      for k, v in cfg.items()}))
    return sum(p.numel() for p in layer.parameters())


def test_the_seeds_config_is_bert_base_pre_ln():
    cfg = BertConfig(**bert_config_keys(SEED))
    assert (cfg.vocab_size, cfg.n_embd, cfg.n_layer, cfg.n_head, cfg.n_inner, cfg.activation, cfg.dropout,
            cfg.attn_dropout, cfg.n_positions, cfg.type_vocab_size, cfg.init_std) == \
        (119547, 768, 12, 12, 3072, "gelu", 0.1, 0.1, 512, 2, 0.02)
    from zerotrain.models import PreLNBertMLM

    with torch.device("meta"):
        model = PreLNBertMLM(cfg)
    block = sum(p.numel() for p in model.bert.blocks[0].parameters())
    assert block == _hf_layer_parameters(SEED)  # the same block as HF's BERT-Base layer (Pre-LN order aside)
    assert model.bert.wte.weight.shape == (119547, 768) and len(model.bert.blocks) == 12


def test_bert_base_preset_has_the_seeds_shape():
    preset = {k: v for k, v in PRESETS["bert-base"].items() if k != "zerotrain_model"}
    seed = bert_config_keys({k: v for k, v in SEED.items() if k != "vocab_size_or_config_json_file"})
    assert preset == seed


def test_a_model_config_file_in_the_seeds_keys_builds_the_built_in_bert(tmp_path):
    small = {**SEED, "vocab_size_or_config_json_file": 300, "hidden_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 2, "intermediate_size": 96, "hidden_act": "gelu_new",
             "attention_probs_dropout_prob": 0.2, "max_position_embeddings": 64, "initializer_range": 0.05}
    path = tmp_path / "bert_config.json"
    path.write_text(json.dumps(small), encoding="utf-8")
    torch.manual_seed(0)
    model, info = build_model(None, str(path), "mlm", byte_tokenizer())
    assert info.kind == "bert" and info.max_positions == 64
    block = model.bert.blocks[0]
    assert block.fc.out_features == 96 and block.dropout == 0.1 and block.attn_dropout == 0.2
    assert model.bert.wte.num_embeddings == 300  # larger than the tokenizer's 259: kept
    x = torch.linspace(-3, 3, 7)
    assert torch.equal(block.act(x), torch.nn.functional.gelu(x, approximate="tanh"))
    assert model.bert.wpe.weight.std().item() == pytest.approx(0.05, rel=0.05)
    classifier, _ = build_model(None, str(path), "classification", byte_tokenizer(), 1)
    assert classifier.classifier.out_features == 1  # a regression head
    loss = classifier(torch.randint(0, 259, (3, 10)), labels=torch.tensor([0.5, 2.0, 4.0]))
    assert loss.ndim == 0 and torch.isfinite(loss)


def test_bad_configs_are_one_line_each(tmp_path):
    def build(spec):
        path = tmp_path / "c.json"
        path.write_text(json.dumps(spec), encoding="utf-8")
        return build_model(None, str(path), "mlm", byte_tokenizer())

    with pytest.raises(ConfigError, match="smaller than the tokenizer's 259 tokens"):
        build({**SEED, "vocab_size_or_config_json_file": 100, "num_hidden_layers": 1})
    with pytest.raises(ConfigError, match="vocab_size_or_config_json_file should be the vocabulary size"):
        build({**SEED, "vocab_size_or_config_json_file": "vocab.json"})
    with pytest.raises(ConfigError, match="hidden_act 'tanh'"):
        build({**SEED, "hidden_act": "tanh", "num_hidden_layers": 1})
    with pytest.raises(ConfigError, match="hidden_size and n_embd set the same thing"):
        build({"zerotrain_model": "bert", "hidden_size": 64, "n_embd": 64})


def test_mean_pooling_reads_the_mean_of_the_non_padding_positions():
    import torch

    from zerotrain.errors import ConfigError
    from zerotrain.models import BertConfig, PreLNBertClassifier

    torch.manual_seed(0)
    cfg = BertConfig(n_embd=32, n_layer=1, n_head=2, n_positions=16, pooling="mean")
    model = PreLNBertClassifier(cfg).eval()
    ids = torch.randint(0, 256, (2, 8))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    h = model.bert(ids, mask, None)
    first_row = h[0].mean(0)
    second_row = h[1, :5].mean(0)
    want = model.classifier(torch.tanh(model.pooler(torch.stack([first_row, second_row]))))
    torch.testing.assert_close(model(ids, attention_mask=mask), want)
    cls = PreLNBertClassifier(BertConfig(n_embd=32, n_layer=1, n_head=2, n_positions=16)).eval()
    cls.load_state_dict(model.state_dict())
    assert not torch.allclose(cls(ids, attention_mask=mask), want)
    with pytest.raises(ConfigError, match="BertConfig.pooling 'max'"):
        PreLNBertClassifier(BertConfig(pooling="max"))
