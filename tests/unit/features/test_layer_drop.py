"""Progressive layer drop: theta(t) (spec section 2, exact floats), the engine wiring, the
switchable blocks of our models and of HF models, and resume with PLD + curriculum."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn
from transformers import BertConfig as HFBertConfig
from transformers import BertForMaskedLM as HFBertForMaskedLM
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

import zerotrain
from feature_models import (SEQ, VOCAB, Recorder, config, linear_curriculum, run_steps, single_process,  # noqa: F401
                            start, tiny_gpt, tokens, zerotrain_log)
from zerotrain import ProgressiveLayerDrop, layerdrop
from zerotrain.errors import ModelInterfaceError
from zerotrain.features.engine_methods import curriculum_seqlen, tokens_consumed
from zerotrain.models import BertConfig, PreLNBertMLM, PreLNBertClassifier


def pld(theta=0.5, gamma=0.001, enabled=True) -> dict:
    return {"enabled": enabled, "theta": theta, "gamma": gamma}


# ---- theta(t) --------------------------------------------------------------------------------
@pytest.mark.parametrize("theta", [0.0, 0.1, 0.9, 1.0])
def test_schedule_is_exact(theta):
    p = ProgressiveLayerDrop(theta=theta, gamma=0.001)
    assert p.get_theta() == 1.0
    for i in range(10):
        p.update_state(i)
        assert p.get_theta() == (1.0 - theta) * np.exp(-0.001 * i) + theta
        assert p.get_state() == {"progressive_layer_drop": True, "pld_theta": p.get_theta()}


def test_constructor_defaults():
    p = ProgressiveLayerDrop()
    assert (p.theta, p.gamma) == (0.5, 0.001)


# ---- the engine --------------------------------------------------------------------------------
@pytest.mark.parametrize("ga", [1, 2])
def test_engine_theta_follows_the_formula_every_step(ga):
    engine = start(Recorder(), config(micro=1, ga=ga, progressive_layer_drop=pld(0.5, 0.01)))
    assert engine.get_pld_theta() == 1.0
    for i in range(50 // ga):  # 50 samples
        run_steps(engine, 1, batch=lambda s: torch.ones(1, 4))
        assert engine.get_pld_theta() == 0.5 * np.exp(-0.01 * i) + 0.5


def test_forwards_see_the_previous_steps_theta():
    model = Recorder()
    engine = start(model, config(micro=1, progressive_layer_drop=pld(0.5, 0.01)))
    run_steps(engine, 5, batch=lambda s: torch.ones(1, 4))
    seen = [c["pld_theta"] for c in model.calls]
    assert seen[:2] == [1.0, 1.0]
    assert seen[2:] == [0.5 * np.exp(-0.01 * (k - 1)) + 0.5 for k in range(2, 5)]
    assert all(c["progressive_layer_drop"] is True for c in model.calls)


def test_theta_updates_on_a_skipped_step_too():
    engine = start(Recorder(), config(micro=1, progressive_layer_drop=pld(0.5, 0.01)))
    for i in range(3):
        loss = engine(torch.ones(1, 4))
        engine.backward(loss * (float("nan") if i == 1 else 1.0))
        engine.step()
    assert engine.skipped_steps == 1
    assert engine.get_pld_theta() == 0.5 * np.exp(-0.01 * 2) + 0.5


def test_kwargs_in_training_only():
    model = Recorder()
    engine = start(model, config(progressive_layer_drop=pld()))
    engine.eval()
    engine(torch.ones(2, 4))
    assert model.calls[-1]["progressive_layer_drop"] is False and model.calls[-1]["pld_theta"] is None
    engine.train()
    engine(torch.ones(2, 4))
    assert model.calls[-1]["progressive_layer_drop"] is True and model.calls[-1]["pld_theta"] == 1.0


def test_theta_is_none_when_off():
    assert start(Recorder(), config()).get_pld_theta() is None
    assert start(Recorder(), config(progressive_layer_drop=pld(enabled=False))).get_pld_theta() is None


def test_model_that_cannot_take_the_kwargs_fails_at_initialize():
    with pytest.raises(ModelInterfaceError, match="pld_theta") as info:
        zerotrain.initialize(model=nn.Sequential(nn.Linear(4, 1)), config=config(progressive_layer_drop=pld()))
    assert isinstance(info.value, TypeError)


def test_logs_that_it_is_on(zerotrain_log):
    start(Recorder(), config(progressive_layer_drop=pld(0.5)))
    assert "Enabled progressive layer dropping (theta = 0.5)" in zerotrain_log.messages


# ---- masks -------------------------------------------------------------------------------------
def test_keep_frequencies_follow_the_paper():
    L, theta = 6, 0.3
    kept = np.array([layerdrop.keep_mask(L, theta, seed=0, key=k) for k in range(4000)], dtype=float)
    want = [1 - (i / L) * (1 - theta) for i in range(1, L + 1)]
    assert np.abs(kept.mean(0) - want).max() < 0.03
    assert layerdrop.keep_probabilities(L, theta) == pytest.approx(want)


def test_masks_depend_on_seed_and_key_only():
    torch.manual_seed(1)
    a = [layerdrop.keep_mask(8, 0.5, 3, k) for k in range(50)]
    torch.manual_seed(2)
    np.random.seed(5)
    b = [layerdrop.keep_mask(8, 0.5, 3, k) for k in range(50)]
    assert a == b
    assert a != [layerdrop.keep_mask(8, 0.5, 4, k) for k in range(50)]
    assert len({tuple(m) for m in a}) > 10  # keys give different masks
    assert all(layerdrop.keep_mask(8, 1.0, 3, k) == [True] * 8 for k in range(20))


class Add(nn.Module):
    def __init__(self, c: float):
        super().__init__()
        self.c = nn.Parameter(torch.tensor(c))
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x + self.c


def test_kept_blocks_are_rescaled_and_dropped_ones_never_run():
    blocks = layerdrop.LayerDrop([Add(1.0), Add(10.0)])
    x = torch.zeros(2, 3)
    key = next(k for k in range(100) if layerdrop.keep_mask(2, 0.0, 0, k) == [True, False])
    blocks.pass_key = key
    with blocks.dropping(0.0):  # p = [0.5, 0]
        y = x
        for b in blocks:
            y = b(y)
    assert torch.equal(y, torch.full((2, 3), 2.0))  # 0 + (1 - 0) / 0.5
    assert [b.calls for b in blocks] == [1, 0]
    y.sum().backward()
    assert blocks[0].c.grad is not None and blocks[1].c.grad is None
    assert len(list(blocks)) == 2 and [b.calls for b in blocks] == [1, 0]  # plain again after the pass


def test_gpt_theta_one_is_exactly_no_drop_and_theta_zero_skips_the_last_block():
    model = tiny_gpt(n_layer=4)
    x = tokens(0)
    assert torch.equal(model(x, labels=x), model(x, labels=x, progressive_layer_drop=True, pld_theta=1.0))
    calls = [0] * 4
    for i, b in enumerate(model.blocks):
        b.register_forward_hook(lambda m, a, o, i=i: calls.__setitem__(i, calls[i] + 1))
    for k in range(10):
        model.blocks.pass_key = k
        model(x, labels=x, progressive_layer_drop=True, pld_theta=0.0).backward()
    assert calls[3] == 0 and 0 < calls[0] <= 10
    assert all(p.grad is None for p in model.blocks[3].parameters())
    model.eval()
    model(x, labels=x, progressive_layer_drop=True, pld_theta=0.0)
    assert calls[3] == 1  # eval runs every block


def test_engine_drops_the_blocks_the_step_mask_says():
    model = tiny_gpt(n_layer=4)
    runs = []
    for i, b in enumerate(model.blocks):
        b.register_forward_hook(lambda m, a, o, i=i: runs[-1].append(i))
    engine = start(model, config(ga=2, micro=1, progressive_layer_drop=pld(0.0, 0.5)))
    for _ in range(6):
        theta = engine.get_pld_theta()
        for _ in range(2):
            runs.append([])
            x = tokens(engine.global_steps, rows=1)
            engine.backward(engine(x, labels=x))
            mask = layerdrop.keep_mask(4, theta, 0, engine.global_steps)
            engine.step()
            assert runs[-1] == [i for i in range(4) if mask[i]]
    assert any(len(r) < 4 for r in runs)


def test_bert_models_run_with_and_without_drop():
    cfg = BertConfig(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=3, n_head=2)
    torch.manual_seed(0)
    mlm, cls = PreLNBertMLM(cfg), PreLNBertClassifier(cfg)
    x = tokens(0)
    labels = torch.full_like(x, -100)
    labels[:, ::4] = x[:, ::4]
    mask = torch.ones_like(x)
    mask[1, 10:] = 0
    assert torch.equal(mlm(x, mask, labels=labels), mlm(x, mask, labels=labels, progressive_layer_drop=True, pld_theta=1.0))
    assert mlm(x).shape == (2, SEQ, VOCAB)
    assert cls(x, mask).shape == (2, 2)
    mlm.bert.blocks.pass_key = 3
    assert torch.isfinite(mlm(x, mask, labels=labels, progressive_layer_drop=True, pld_theta=0.2))
    assert torch.isfinite(cls(x, mask, labels=torch.tensor([0, 1]), progressive_layer_drop=True, pld_theta=0.2))


# ---- HF models ---------------------------------------------------------------------------------
class Passthrough(nn.Module):
    def forward(self, x, *args, **kwargs):
        return x


def hf_model(name: str):
    """A tiny HF model built from its config (no download) and the path of its block list."""
    torch.manual_seed(0)
    small = dict(hidden_size=32, intermediate_size=64, num_attention_heads=2, vocab_size=VOCAB,
                 max_position_embeddings=SEQ, num_hidden_layers=2)
    if name == "gpt2":
        return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=SEQ)), "transformer.h"
    if name == "llama":
        return LlamaForCausalLM(LlamaConfig(num_key_value_heads=2, **small)), "model.layers"
    if name == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(num_key_value_heads=2, **small)), "model.layers"
    return HFBertForMaskedLM(HFBertConfig(**small)), "bert.encoder.layer"


@pytest.mark.parametrize("name", ["gpt2", "llama", "qwen2", "bert"])
def test_hf_block_lists_become_switchable(name):
    model, path = hf_model(name)
    model.config.use_cache = False
    model.train()
    for m in model.modules():  # exact comparisons: no dropout
        if isinstance(m, nn.Dropout):
            m.p = 0.0
    keys = list(model.state_dict())
    x = tokens(0)
    plain = model(input_ids=x, labels=x).loss
    blocks = layerdrop.wrap(model)
    assert model.get_submodule(path) is blocks and list(model.state_dict()) == keys
    assert torch.equal(model(input_ids=x, labels=x, progressive_layer_drop=True, pld_theta=1.0).loss, plain)
    # theta 0 with two blocks: p = [0.5, 0], so the second never runs and the first is scaled by 2
    both = next(k for k in range(100) if layerdrop.keep_mask(2, 0.0, 0, k) == [False, False])
    first = next(k for k in range(100) if layerdrop.keep_mask(2, 0.0, 0, k) == [True, False])
    ref = copy.deepcopy(model)
    ref_blocks = ref.get_submodule(path)
    real_first = ref_blocks[0]
    parent, attr = path.rsplit(".", 1)

    class Doubled(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = real_first

        def forward(self, x, *args, **kwargs):
            return x + (real_first(x, *args, **kwargs) - x) / 0.5

    for key, stand_ins in ((both, [Passthrough(), Passthrough()]), (first, [Doubled(), Passthrough()])):
        setattr(ref.get_submodule(parent), attr, nn.ModuleList(stand_ins))
        blocks.pass_key = key
        got = model(input_ids=x, labels=x, progressive_layer_drop=True, pld_theta=0.0).loss
        want = ref(input_ids=x, labels=x).loss
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
        got.backward()
        assert all(p.grad is None for p in blocks[1].parameters())
        model.zero_grad(set_to_none=True)
    model.eval()
    assert torch.equal(model(input_ids=x, labels=x, progressive_layer_drop=True, pld_theta=0.0).loss, plain)


def test_hf_model_is_wrapped_at_initialize(zerotrain_log):
    model, _ = hf_model("llama")
    engine = start(model, config(progressive_layer_drop=pld(0.0, 1.0)))
    assert isinstance(model.model.layers, layerdrop.LayerDrop)
    assert any("made switchable" in m for m in zerotrain_log.messages)
    assert (f"progressive layer drop: {len(model.model.layers)} blocks of LlamaForCausalLM made switchable"
            in zerotrain_log.messages)
    x = tokens(0)
    for _ in range(4):
        out = engine(input_ids=x, labels=x)
        engine.backward(out.loss)
        engine.step()
    assert engine.get_pld_theta() == pytest.approx(np.exp(-3.0))


# ---- resume --------------------------------------------------------------------------------------
def test_pld_and_curriculum_survive_a_resume(tmp_path):
    cfg = config(progressive_layer_drop=pld(0.3, 0.2), curriculum_learning=linear_curriculum(4, SEQ, 8, 4))
    engine = start(tiny_gpt(n_layer=4), cfg)
    run_steps(engine, 4)
    engine.save_checkpoint(tmp_path)
    theta, seqlen = engine.get_pld_theta(), curriculum_seqlen(engine)
    losses = run_steps(engine, 5)
    resumed = start(tiny_gpt(seed=1, n_layer=4), cfg)
    resumed.load_checkpoint(tmp_path)
    assert (resumed.get_pld_theta(), curriculum_seqlen(resumed)) == (theta, seqlen)
    assert run_steps(resumed, 5) == losses  # same masks, same lengths: bit-identical


# ---- the mask generator and the stand-ins, piece by piece ----------------------------------------
from zerotrain.features.layer_drop import LayerDrop, LayerDropFeature, _mix, keep_mask, takes_pld_kwargs  # noqa: E402


def test_the_seed_mixer_is_splitmix64():
    # SplitMix64's published first outputs from state 0 (0xe220..., then 0x6e78... one step on):
    # _mix(seed, key) is the output from state seed * golden + key
    assert _mix(0, 0) == 0xE220A8397B1DCDAF
    assert _mix(1, 0) == _mix(0, 0x9E3779B97F4A7C15) == 0x6E789E6AA1B965F4


def test_masks_are_reproducible_across_versions():
    # Stored masks: a resumed run (or a checkpoint from an older zerotrain) must draw these again.
    assert ["".join("1" if k else "0" for k in keep_mask(8, 0.5, 1234, key)) for key in range(8)] == [
        "10100110", "10110011", "11111110", "01101000", "01110000", "11111111", "11111111", "11111000"]


class _Triple(nn.Module):
    """An older-HF-style block: (hidden, extra, extra), called with hidden_states=."""

    def __init__(self, add: float):
        super().__init__()
        self.add, self.attention_type = add, f"kind{add:g}"

    def forward(self, hidden_states):
        return hidden_states + self.add, "a", "b"


def test_tuple_blocks_by_keyword_keep_their_extras_and_dropped_ones_match_the_arity():
    blocks = LayerDrop([_Triple(1.0), _Triple(2.0), _Triple(3.0), _Triple(4.0)], seed=7)
    blocks.plan(0.5)
    mask, probs = blocks.mask, blocks.probs
    x, checked = torch.zeros(2), set()
    for i, layer in enumerate(blocks):
        out = layer(hidden_states=x)
        assert layer.attention_type == f"kind{i + 1}"  # stand-ins read through to the block
        if mask[i]:
            assert out[1:] == ("a", "b") and torch.allclose(out[0], x + (i + 1.0) / probs[i])
            checked.add("kept")
        elif any(mask[:i]):  # after a kept block the arity is known
            assert out[0] is x and out[1:] == (None, None)
            checked.add("dropped")
        x = out[0]
    assert checked == {"kept", "dropped"}  # this seed's draw has both


def test_a_dropped_block_returns_its_input_unchanged():
    blocks = LayerDrop([_Triple(1.0), _Triple(2.0)])
    blocks.mask, blocks.probs = [True, False], [0.5, 0.25]
    first, second = list(blocks)
    x = torch.ones(2)
    assert torch.equal(first(hidden_states=x)[0], x + 2.0)  # 1 + (2 - 1) / 0.5
    assert second(hidden_states=x) == (x, None, None)


def test_copies_of_stand_ins_do_not_recurse():
    blocks = LayerDrop([_Triple(1.0), _Triple(2.0)])
    blocks.mask, blocks.probs = [False, True], [0.5, 0.25]
    for stand_in in blocks:
        twin = copy.copy(stand_in)
        assert twin.attention_type == stand_in.attention_type


def test_passes_without_an_engine_use_a_running_count_and_a_key_once():
    n, theta = 6, 0.3
    blocks = LayerDrop([nn.Identity() for _ in range(n)], seed=5)
    seen = []
    for _ in range(3):
        blocks.plan(theta)
        seen.append(blocks.mask)
    assert seen == [keep_mask(n, theta, 5, k) for k in range(3)]
    blocks.pass_key = 40
    blocks.plan(theta)
    assert blocks.mask == keep_mask(n, theta, 5, 40)
    blocks.plan(theta)  # the engine's key is used once; then the count goes on
    assert blocks.mask == keep_mask(n, theta, 5, 4)


def test_theta_one_runs_the_blocks_themselves_and_slices_stay_module_lists():
    mods = [nn.Linear(2, 2) for _ in range(3)]
    blocks = LayerDrop(mods)
    assert isinstance(blocks[:2], nn.ModuleList) and list(blocks[:2]) == mods[:2]
    with blocks.dropping(1.0):
        assert all(a is b for a, b in zip(blocks, mods))  # nothing to scale or skip
        assert len(blocks[:2]) == 2


class _TwoLists(nn.Module):
    """A model with two block lists at paths wrap() does not know."""

    def __init__(self):
        super().__init__()
        self.enc = nn.Module()
        self.enc.blocks = nn.ModuleList([nn.Linear(2, 2) for _ in range(2)])
        self.dec = nn.Module()
        self.dec.blocks = nn.ModuleList([nn.Linear(2, 2) for _ in range(2)])
        self.fail = False

    def forward(self, x):
        for b in self.enc.blocks:
            x = b(x)
        for b in self.dec.blocks:
            x = b(x)
        if self.fail:
            raise RuntimeError("boom")
        return x


def test_wrap_at_given_paths_shares_one_hook_and_ends_the_pass_even_on_error():
    model = _TwoLists()
    with pytest.raises(ModelInterfaceError, match=r"^progressive_layer_drop: no block list found in _TwoLists "
                                                  r"\(looked for transformer.h, h, model.layers, layers, "
                                                  r"bert.encoder.layer, roberta.encoder.layer, encoder.layer\); "
                                                  r"pass path='<dotted name of the nn.ModuleList of blocks>'$"):
        layerdrop.wrap(model)
    enc, dec = layerdrop.wrap(model, "enc.blocks"), layerdrop.wrap(model, "dec.blocks")
    assert layerdrop.wrap(model, "dec.blocks") is dec  # a second wrap of the same list changes nothing
    assert takes_pld_kwargs(model)
    planned = []
    model.register_forward_pre_hook(lambda m, a: planned.append((enc.mask, dec.mask)))
    model.train()
    model(torch.ones(2), progressive_layer_drop=True, pld_theta=0.5)
    assert planned[-1][0] is not None and planned[-1][1] is not None  # both lists planned
    assert enc.mask is None and dec.mask is None
    model.fail = True
    with pytest.raises(RuntimeError, match="boom"):
        model(torch.ones(2), progressive_layer_drop=True, pld_theta=0.5)
    assert enc.mask is None and dec.mask is None  # cleared although the forward raised


class _AnyKwargs(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(()))

    def forward(self, x, **kwargs):
        return (self.w * x).mean()


def test_a_forward_with_var_kwargs_is_accepted_and_the_feature_reports_theta():
    engine = start(_AnyKwargs(), config(progressive_layer_drop=pld(0.5, 0.01)))
    feature = next(f for f in engine.features if isinstance(f, LayerDropFeature))
    assert feature.pld.get_theta() == 1.0 == engine.get_pld_theta()
    assert engine.feature(LayerDropFeature) is feature and tokens_consumed(engine) is None
    assert feature.log_fields(engine) == {"pld_theta": 1.0}
    with pytest.raises(ModelInterfaceError, match=r"^progressive_layer_drop is enabled but Sequential.forward cannot "
                                                  r"take the keyword arguments progressive_layer_drop and pld_theta "
                                                  r"that the engine passes in training; add them \(zerotrain.models "
                                                  r"has switchable blocks\), wrap an HF model with "
                                                  r"zerotrain.wrap\(model\), or disable progressive_layer_drop$"):
        start(nn.Sequential(nn.Linear(4, 1)), config(progressive_layer_drop=pld()))


def test_only_rank_0_says_layer_drop_is_on(zerotrain_log, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    ProgressiveLayerDrop(theta=0.5)
    monkeypatch.setenv("RANK", "0")
    ProgressiveLayerDrop(theta=0.25)
    said = {m for m in zerotrain_log.messages if m.startswith("Enabled progressive layer dropping")}
    assert said == {"Enabled progressive layer dropping (theta = 0.25)"}


def test_a_forward_without_a_readable_signature_does_not_take_the_kwargs():
    model = nn.Module()
    model.forward = torch.relu  # a builtin: inspect.signature cannot read it
    assert takes_pld_kwargs(model) is False
