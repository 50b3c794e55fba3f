"""--pipeline_parallel_size: the trainer's models cut into pipeline layers compute what the
model computes (one stage, one process: every layer in order), and the layer names map back."""

from __future__ import annotations

import pytest
import torch

from zerotrain.errors import ConfigError
from zerotrain.trainer.model import build as models
from zerotrain.parallel.pipeline.from_model import split_model
from zerotrain.trainer.data.tokenizer import byte_tokenizer


@pytest.fixture(autouse=True)
def _single_process(monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("preset, task", [("gpt-tiny", "clm"), ("bert-tiny", "mlm"), ("gpt2-tiny", "clm"),
                                          ("llama-tiny", "clm")])
def test_split_layers_compute_the_models_loss(preset, task):
    torch.manual_seed(0)
    model, info = models.build_model(None, preset, task, byte_tokenizer())
    model.eval()
    ids = torch.randint(3, 200, (2, 12))
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0  # padding at the end of the second row
    labels = ids.masked_fill(mask == 0, -100)
    if task == "mlm":
        labels = torch.full_like(ids, -100)
        labels[:, 2:5] = ids[:, 2:5]
    kwargs = {"attention_mask": mask} if task == "mlm" else {}
    with torch.no_grad():
        out = model(input_ids=ids, labels=labels, **kwargs)
        want = out if torch.is_tensor(out) else out.loss
        own = {k: v.clone() for k, v in model.state_dict().items()}
    net, names = split_model(model, info.kind, task, 1)
    net.eval()
    with torch.no_grad():
        got = net.loss_fn(net((ids, mask)) if task == "mlm" else net(ids), labels)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6), (got, want)
    renamed = {names[k]: v for k, v in net.state_dict().items()}
    assert set(renamed) <= set(own) and all(torch.equal(v, own[k]) for k, v in renamed.items())
    assert {n for n, _ in model.named_parameters()} == {names[n] for n, _ in net.named_parameters()}


def test_models_that_cannot_be_split():
    model, info = models.build_model(None, "bert-tiny", "classification", byte_tokenizer(), num_labels=2)
    with pytest.raises(ConfigError, match="a bert model for task classification cannot be split"):
        split_model(model, info.kind, "classification", 2)


@pytest.mark.parametrize("preset, config, tensor, message", [
    ("llama-tiny", {}, 3, "tensor_parallel.autotp_size 3: the model has 4 attention heads, not divisible by 3; set "),
    ("llama-tiny", {"num_key_value_heads": 4, "intermediate_size": 130}, 4,
     "tensor_parallel.autotp_size 4: model.layers.0.mlp.gate_proj has 130 output features, not divisible by 4; "),
    ("gpt-tiny", {}, 4, "tensor_parallel.autotp_size 4: the model has 2 attention heads, not divisible by 4; "),
    ("gpt2-tiny", {}, 2, "tensor_parallel: GPT2LMHeadModel has no tensor-parallel plan "),
])
def test_stages_that_cannot_be_split_across_tensor_ranks(tmp_path, preset, config, tensor, message):
    """Checked on the whole model, before any stage is built (one process can check it)."""
    import json

    spec = tmp_path / "model.json"
    spec.write_text(json.dumps({**models.PRESETS[preset], **config}))
    model, info = models.build_model(None, str(spec), "clm", byte_tokenizer())
    with pytest.raises(ConfigError) as e:
        split_model(model, info.kind, "clm", 2, tensor=tensor)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)
