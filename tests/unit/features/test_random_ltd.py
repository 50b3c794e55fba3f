"""Random-LTD through the engine: which layers see how many tokens, the counters and their
checkpoint, the DeepSpeed way of converting layers (the ViT and Megatron-DeepSpeed example
configs), and every bad input as one line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from feature_models import VOCAB, run_steps, single_process, tiny_gpt, tokens, zerotrain_log  # noqa: F401
from torch import nn

import zerotrain
from zerotrain.config import load_config
from zerotrain.data_efficiency import convert_to_random_ltd, layer_averaged_length, save_without_random_ltd
from zerotrain.errors import ConfigError, ModelInterfaceError
from zerotrain.features.random_ltd import RandomLTDFeature
from zerotrain.models import BertConfig, GPTConfig
from zerotrain.models.bert import PreLNBertMLM

COMPAT = Path(__file__).resolve().parents[2] / "compat"
SEQ = 16


def ltd(total=4, ids=(1, 2), lo=8, hi=16, require=4, per_step=4, **extra) -> dict:
    block = {"enabled": True, "total_layer_num": total, "random_ltd_layer_num": len(ids),
             "random_ltd_layer_id": list(ids), "model_mask_name": None, "model_type": "decoder",
             "hidden_state_order": "batch_seq_dim",
             "random_ltd_schedule": {"min_value": lo, "max_value": hi, "schedule_type": "fixed_linear",
                                     "schedule_config": {"require_steps": require, "seq_per_step": per_step}}}
    block.update(extra)
    return block


def config(block: dict, micro=2, ga=1) -> dict:
    return {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": ga, "gradient_clipping": 0.0,
            "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
            "data_efficiency": {"enabled": True, "data_routing": {"enabled": True, "random_ltd": block}}}


def seen_lengths(blocks) -> list[list[int]]:
    """Per block, the sequence length of each output it produced (before being put back)."""
    seen = [[] for _ in blocks]
    for i, block in enumerate(blocks):
        block.register_forward_hook(lambda m, a, out, i=i: seen[i].append(out.shape[1]))
    return seen


def one_line(err) -> str:
    text = str(err.value)
    assert "\n" not in text, text
    return text


# ---- what the layers see ----------------------------------------------------------------------
def test_gpt_middle_blocks_see_the_schedule_and_eval_sees_everything(zerotrain_log):
    model = tiny_gpt(n_layer=4)
    seen = seen_lengths(model.blocks)  # registered first: they see the routed call's own output
    engine, *_ = zerotrain.initialize(model=model, config=config(ltd()))
    assert "random-LTD (2 of 4 layers keep 8 -> 16 tokens over 4 steps) on blocks.1, blocks.2" in zerotrain_log.text
    run_steps(engine, 2)
    engine.eval()  # mid-schedule: an evaluation forward still sees every token
    with torch.no_grad():
        engine.module(tokens(0))
    engine.train()
    run_steps(engine, 3)
    schedule = [8, 8, 12, 12, 16]  # fixed_linear from 8 to 16 over 4 steps, multiples of 4
    assert seen[1] == seen[2] == schedule[:2] + [SEQ] + schedule[2:] and seen[0] == seen[3] == [SEQ] * 6
    # DeepSpeed's names: the scheduler on the engine and its state
    sched = engine.random_ltd_scheduler
    assert engine.random_ltd_enabled() and sched.get_random_ltd_layer_num() == 2
    assert sched.state["consumed_layer_tokens"] == sum(2 * (r * 2 + 16 * 2) for r in schedule)
    # Megatron-DeepSpeed's layer-averaged length, batch 2
    layer_tokens = sum(2 * layer_averaged_length(SEQ, r, 2, 4) for r in schedule)
    assert engine.features[0].log_fields(engine) == {"layer_tokens": layer_tokens, "ltd_seq": 16}
    assert layer_tokens == 2 * (12 + 12 + 14 + 14 + 16)


def test_resume_continues_bit_identically(tmp_path):
    cfg = config(ltd(require=8), ga=2)
    engine, *_ = zerotrain.initialize(model=tiny_gpt(n_layer=4), config=cfg)
    run_steps(engine, 3)
    engine.save_checkpoint(tmp_path)
    saved = (engine.random_ltd_scheduler.state_dict(), engine.features[0].layer_tokens)
    assert saved[0]["consumed_layer_tokens"] > 0 and saved[1] > 0
    straight = run_steps(engine, 3)
    state = engine.random_ltd_scheduler.state_dict()
    again, *_ = zerotrain.initialize(model=tiny_gpt(seed=5, n_layer=4), config=cfg)
    again.load_checkpoint(tmp_path)
    assert (again.random_ltd_scheduler.state_dict(), again.features[0].layer_tokens) == saved
    assert run_steps(again, 3) == straight
    assert again.random_ltd_scheduler.state_dict() == state
    assert again.features[0].layer_tokens == engine.features[0].layer_tokens


def test_bert_encoder_with_padding_trains_and_names_stay_plain():
    torch.manual_seed(0)
    model = PreLNBertMLM(BertConfig(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=3, n_head=2))
    names = list(model.state_dict())
    engine, *_ = zerotrain.initialize(model=model, config=config(ltd(total=3, ids=[1], model_type="encoder")))
    ids = tokens(0)
    mask = torch.ones_like(ids)
    mask[0, 12:] = 0
    labels = torch.where(torch.rand(ids.shape, generator=torch.Generator().manual_seed(1)) < 0.3, ids, -100)
    loss = engine(ids, attention_mask=mask, labels=labels)
    engine.backward(loss)
    engine.step()
    assert torch.isfinite(loss) and list(save_without_random_ltd(engine)) == names


# ---- DeepSpeed's convert_to_random_ltd and the real example configs ------------------------------
class Block(nn.Module):
    """A ViT-style block: (batch, tokens, width), no mask."""

    def __init__(self, width=8):
        super().__init__()
        self.norm, self.attn = nn.LayerNorm(width), nn.MultiheadAttention(width, 2, batch_first=True)
        self.mlp = nn.Linear(width, width)

    def forward(self, x):
        h = self.norm(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(x)


class TinyViT(nn.Module):
    def __init__(self, depth=12, width=8, patches=196):
        super().__init__()
        self.patch = nn.Linear(3, width)
        self.cls = nn.Parameter(torch.zeros(1, 1, width))
        self.pos = nn.Parameter(torch.randn(1, patches + 1, width) * 0.02)
        self.blocks = nn.Sequential(*(Block(width) for _ in range(depth)))
        self.head = nn.Linear(width, 10)

    def forward(self, images, labels):
        x = torch.cat([self.cls.expand(images.shape[0], -1, -1), self.patch(images)], dim=1) + self.pos
        return nn.functional.cross_entropy(self.head(self.blocks(x)[:, 0]), labels)


@pytest.mark.parametrize("when", ["after", "before"])
def test_vit_example_config_with_convert(when):
    path = COMPAT / "configs" / "DeepSpeedExamples__training__data_efficiency__vit_finetuning__config__" \
                                "ds_config_cifar_random_ltd.json"
    torch.manual_seed(0)
    model = TinyViT()
    seen = seen_lengths(model.blocks)
    if when == "before":
        assert convert_to_random_ltd(model, Block) is model
    engine, *_ = zerotrain.initialize(model=model, config=str(path))
    if when == "after":  # main_cifar.py's order
        assert convert_to_random_ltd(engine, Block) is engine
    engine.random_ltd_initialize()
    loss = engine(torch.randn(32, 196, 3), torch.randint(0, 10, (32,)))
    engine.backward(loss)
    engine.step()
    assert [s[0] for s in seen] == [197] + [32] * 10 + [197]  # min_value 32 of the 197 tokens
    assert engine.random_ltd_scheduler.state["consumed_layer_tokens"] == 32 * (32 * 10 + 197 * 2)


class SeqFirstLayer(nn.Module):
    """Megatron's layout: hidden (seq, batch, width), a causal boolean mask (True = masked)."""

    def __init__(self, width=8):
        super().__init__()
        self.attn, self.mlp = nn.MultiheadAttention(width, 2), nn.Linear(width, width)
        self.masks: list[tuple] = []

    def forward(self, hidden_states, attention_mask):
        self.masks.append(tuple(attention_mask.shape))
        # one mask for every head: the mask is [b or 1, 1, s, s]; MultiheadAttention takes [b * heads, s, s]
        m = attention_mask[:, 0].expand(hidden_states.shape[1], -1, -1).repeat_interleave(2, dim=0)
        return hidden_states + self.mlp(self.attn(hidden_states, hidden_states, hidden_states, attn_mask=m,
                                                  need_weights=False)[0])


class TinyMegatron(nn.Module):
    def __init__(self, depth=24, width=8):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.layers = nn.ModuleList(SeqFirstLayer(width) for _ in range(depth))
        self.head = nn.Linear(width, VOCAB)

    def forward(self, ids):
        s = ids.shape[1]
        mask = torch.ones(s, s, dtype=torch.bool).triu(1)[None, None]
        h = self.embed(ids).transpose(0, 1)
        for layer in self.layers:
            h = layer(h, attention_mask=mask)
        logits = self.head(h.transpose(0, 1))
        return nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))


def megatron_config() -> dict:
    """The template filled as ds_pretrain_gpt_1.3B_dense_base_script.sh fills it for the random-LTD
    run of its run script (start 128, 200000 steps, seq 2048, ZeRO 1); batch sizes for one process."""
    text = (COMPAT / "templates" / "Megatron-DeepSpeed__examples_deepspeed__data_efficiency__gpt__pretrain__"
                                   "ds_config_gpt_1clmetric_TEMPLATE.json").read_text()
    values = {"GBSIZE": 4, "MBSIZE": 4, "LOG_INTERVAL": 100, "ZERO_STAGE": 1, "PRESCALE_GRAD": "true",
              "DATA_EFFICIENCY_SEED": 1234, "LTD_ENABLED": "true", "LTD_MIN": 128, "LTD_MAX": 2048,
              "LTD_STEP": 200000, "CL_ENABLED": "false", "DATA_SAMPLING_NUM_WORKERS": 0,
              "CL_CLUSTER_PATH": "dummy", "CL_1st_METRIC_NAME": "dummy", "CL_1st_SAMPLE_PATH": "dummy",
              "CL_1st_METRIC_PATH": "dummy", "CL_1st_DIFF_TYPE": "value", "CL_1st_CLUSTER_TYPE": "single_cluster",
              "CL_1st_MIN": 2048, "CL_1st_MAX": 2048, "CL_1st_TOTAL_STEP": 1, "CL_1st_DIFF_STEP": 1,
              "CL_1st_ROOT": 1}
    for key in sorted(values, key=len, reverse=True):  # CL_1st_MIN before CL_1st_MI...: longest first
        text = text.replace(key, str(values[key]))
    assert not re.search(r"\b[A-Z][A-Z0-9_]{3,}\b", text)  # every placeholder filled
    cfg = json.loads(text)
    cfg["optimizer"] = {"type": "Adam", "params": {"lr": 1e-4}}  # Megatron passes its own
    return cfg


def test_megatron_example_config_routes_seq_first_layers_with_their_mask():
    torch.manual_seed(0)
    model = TinyMegatron()
    engine, *_ = zerotrain.initialize(model=model, config=megatron_config())
    convert_to_random_ltd(engine, SeqFirstLayer)  # megatron/training.py's call
    loss = engine(torch.randint(0, VOCAB, (4, 160)))
    engine.backward(loss)
    engine.step()
    masks = [layer.masks[0] for layer in model.layers]
    assert masks == [(1, 1, 160, 160)] + [(4, 1, 128, 128)] * 22 + [(1, 1, 160, 160)]
    assert engine.features[0].log_fields(engine)["layer_tokens"] == 4 * ((160 * 2 + 128 * 22) // 24)


# ---- bad inputs, one line each -----------------------------------------------------------------------
def config_problem(block: dict) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(config(block))
    return one_line(err)


@pytest.mark.parametrize("change,message", [
    ({"random_ltd_layer_num": 3}, "random_ltd.random_ltd_layer_num: 3 should equal the number of random_ltd_layer_id"),
    ({"random_ltd_layer_id": [1, 4], "random_ltd_layer_num": 2}, "random_ltd.random_ltd_layer_id: [1, 4] should be "
                                                                  "distinct layer indices from 0 to total_layer_num - 1"),
    ({"model_type": None}, "random_ltd.model_type is missing: needed when random-LTD is enabled"),
    ({"model_type": "seq2seq"}, "random_ltd.model_type"),
    ({"hidden_state_order": "batch_dim_seq"}, "random_ltd.hidden_state_order"),
    ({"random_ltd_schedule": {"min_value": 32, "max_value": 16, "schedule_config": {"require_steps": 1,
                                                                                    "seq_per_step": 8}}},
     "min_value: 32 is above max_value 16"),
    ({"layer_token_lr_schedule": {"enabled": True}}, "layer_token_lr_schedule.enabled"),
])
def test_config_mistakes(change, message):
    assert message in config_problem({**ltd(), **change})


def test_switched_by_its_own_enabled_as_deepspeed():
    cfg = config(ltd())
    cfg["data_efficiency"]["data_routing"]["enabled"] = False  # DeepSpeed reads random_ltd.enabled alone
    engine, *_ = zerotrain.initialize(model=tiny_gpt(n_layer=4), config=cfg)
    assert engine.random_ltd_enabled()
    cfg["data_efficiency"]["data_routing"]["random_ltd"] = {"enabled": False, "random_ltd_layer_num": 3}
    engine, *_ = zerotrain.initialize(model=tiny_gpt(n_layer=4), config=cfg)
    assert not engine.random_ltd_enabled() and engine.random_ltd_scheduler is None


@pytest.mark.parametrize("model,block,error,message", [
    (lambda: tiny_gpt(n_layer=4), ltd(total=6), ModelInterfaceError,
     "random_ltd.total_layer_num: 6, but GPT has 4 zerotrain blocks; set it to 4"),
    (lambda: tiny_gpt(n_layer=4), ltd(hidden_state_order="seq_batch_dim"), ConfigError,
     "hidden_state_order: 'seq_batch_dim', but the layers of PreLNBlock take [batch, seq, hidden]"),
    (lambda: PreLNBertMLM(BertConfig(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=4, n_head=2)), ltd(),
     ConfigError, "model_type: 'decoder', but the model's blocks are bidirectional (encoder); set it to encoder"),
])
def test_model_mismatches_at_initialize(model, block, error, message):
    with pytest.raises(error) as err:
        zerotrain.initialize(model=model(), config=config(block))
    assert message in one_line(err)


def test_layer_id_matching_nothing_is_one_line():
    torch.manual_seed(0)
    engine, *_ = zerotrain.initialize(model=TinyViT(depth=2), config=config(ltd(total=4, ids=[1, 3])))
    with pytest.raises(ModelInterfaceError) as err:
        convert_to_random_ltd(engine, Block)
    assert one_line(err) == ("data_efficiency.data_routing.random_ltd.random_ltd_layer_id: 3 matches no layer: TinyViT "
                             "has 2 Block layers (ids 0-1); list ids below 2")
    with pytest.raises(TypeError, match="should be an nn.Module subclass"):
        convert_to_random_ltd(engine, "Block")


def test_interface_mistakes():
    engine, *_ = zerotrain.initialize(model=TinyViT(depth=4), config=config(ltd(model_mask_name="attention_mask")))
    with pytest.raises(ModelInterfaceError) as err:
        convert_to_random_ltd(engine, Block)
    assert "model_mask_name: Block.forward (blocks.1) has no argument 'attention_mask'" in one_line(err)
    with pytest.raises(ModelInterfaceError) as err:  # no layer routed: the first training forward says so
        engine(torch.randn(2, 196, 3), torch.randint(0, 10, (2,)))
    assert "random-LTD is enabled but no layer of TinyViT is routed: call" in one_line(err)
    plain, *_ = zerotrain.initialize(model=TinyViT(depth=4), config={**config(ltd()), "data_efficiency": None})
    with pytest.raises(ModelInterfaceError) as err:
        convert_to_random_ltd(plain, Block)
    assert "convert_to_random_ltd: random-LTD is not enabled in the config" in one_line(err)


def test_a_pipeline_routes_its_blocks_by_whole_pipeline_ids_or_says_it_has_none():
    from zerotrain.models.block import PreLNBlock
    from zerotrain.pipe import LayerSpec, PipelineModule

    layers = [torch.nn.Linear(8, 8), LayerSpec(PreLNBlock, 8, 2), PreLNBlock(8, 2)]
    model = PipelineModule(layers, num_stages=1, loss_fn=lambda out, _: out.mean())
    engine, *_ = zerotrain.initialize(model=model, config=config(ltd(total=2, ids=[1])))
    assert engine.feature(RandomLTDFeature).layers == ["2"] and not hasattr(model.get_submodule("1"), "_random_ltd")
    plain = PipelineModule([torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)], num_stages=1,
                           loss_fn=lambda out, _: out.mean())
    with pytest.raises(ModelInterfaceError) as err:
        zerotrain.initialize(model=plain, config=config(ltd(total=2, ids=[1])))
    assert one_line(err).startswith("data_efficiency.data_routing.random_ltd: the PipelineModule has no "
                                    "zerotrain blocks (PreLNBlock) to route; call "
                                    "zerotrain.data_efficiency.convert_to_random_ltd")

