"""Random-LTD's maths: the schedule against DeepSpeed's formula written out here, the kept
tokens' properties, and a routed layer against a brute-force reference (pick each sample's
kept tokens, run the layer on them alone, put the results back)."""

from __future__ import annotations

import math

import pytest
import torch

from zerotrain.data_efficiency import RandomLTDScheduler, kept_token_indices
from zerotrain.data_efficiency.random_ltd import gather_tokens, sample_indices, scatter_tokens
from zerotrain.data_efficiency.routing import RoutedLayer, TokenRouter
from zerotrain.errors import ConfigError
from zerotrain.models.block import PreLNBlock


# ---- the schedule ----------------------------------------------------------------------------
def deepspeed_schedule(steps, lo, hi, require, per_step, total_layers, routed, batch):
    """DeepSpeed 0.19.8's RandomLTDScheduler, step by step: the value before each step's
    forward and consumed_layer_tokens after it (update_seq(global_steps) per forward)."""
    value, consumed, values, counts = lo, 0, [], []
    for step in steps:
        if value < hi:
            nxt = (float(step) / require) ** (1.0 / 1)
            nxt = math.floor(nxt * (hi - lo) + lo)
            nxt -= nxt % per_step
            value = min(nxt, hi)
        consumed += batch * (value * routed + hi * (total_layers - routed))
        values.append(value)
        counts.append(consumed)
    return values, counts


def block(lo=128, hi=1024, require=400, per_step=8, total=12, routed=10, batch=4):
    return {"total_layer_num": total, "random_ltd_layer_num": routed, "random_ltd_layer_id": list(range(1, routed + 1)),
            "global_batch_size": batch,
            "random_ltd_schedule": {"min_value": lo, "max_value": hi, "schedule_type": "fixed_linear",
                                    "schedule_config": {"require_steps": require, "seq_per_step": per_step}}}


@pytest.mark.parametrize("lo,hi,require,per_step", [(128, 1024, 400, 8), (32, 197, 3910, 8), (100, 512, 37, 16),
                                                    (2048, 2048, 1, 16), (5, 64, 7, 3)])
def test_schedule_matches_deepspeed_step_for_step(lo, hi, require, per_step):
    steps = list(range(2 * require + 20))
    values, counts = deepspeed_schedule(steps, lo, hi, require, per_step, 12, 10, 4)
    sched = RandomLTDScheduler(block(lo, hi, require, per_step))
    got_values, got_counts = [], []
    for step in steps:
        for _ in range(3):  # three micro-batches per step: counted once per step
            sched.update_seq(step)
        got_values.append(sched.get_current_seq())
        got_counts.append(sched.state["consumed_layer_tokens"])
    assert got_values == values and got_counts == counts
    # max_value is reached only once the line passes the next multiple of seq_per_step above it:
    # past require_steps when max_value is not a multiple (the ViT example's 197)
    assert values[-1] == hi
    assert sched.get_total_layer_tokens(len(steps)) == counts[-1]


def test_state_dict_round_trip_continues_the_count():
    a = RandomLTDScheduler(block())
    for step in range(50):
        a.update_seq(step)
    b = RandomLTDScheduler(block())
    b.load_state_dict(a.state_dict())
    assert set(a.state_dict()) == {"consumed_layer_tokens", "current_steps", "current_value", "min_value", "max_value"}
    for step in range(50, 60):
        a.update_seq(step)
        b.update_seq(step)
    assert a.state_dict() == b.state_dict()
    before = dict(a.state)
    a.get_total_layer_tokens(10)  # computed aside: the scheduler's own state does not move
    assert a.state == before


def test_scheduler_errors_are_one_line():
    bad = block()
    del bad["random_ltd_schedule"]["min_value"]
    with pytest.raises(ConfigError, match=r"random_ltd_schedule\.min_value: is missing"):
        RandomLTDScheduler(bad)
    bad = block()
    bad["random_ltd_schedule"]["schedule_config"]["seq_per_step"] = 0
    with pytest.raises(ConfigError, match="seq_per_step: should be a positive integer"):
        RandomLTDScheduler(bad)


# ---- which tokens are kept --------------------------------------------------------------------
def test_kept_tokens_are_sorted_distinct_and_split_independent():
    samples = torch.arange(8)
    kept = kept_token_indices(1234, 7, 3, samples, 64, 20)
    assert kept.shape == (8, 20)
    assert bool((kept[:, 1:] > kept[:, :-1]).all()) and int(kept.min()) >= 0 and int(kept.max()) < 64
    halves = torch.cat([kept_token_indices(1234, 7, 3, samples[:4], 64, 20),
                        kept_token_indices(1234, 7, 3, samples[4:], 64, 20)])
    assert torch.equal(kept, halves)  # a sample keeps the same tokens in any micro-batch
    for other in ((1235, 7, 3), (1234, 8, 3), (1234, 7, 4)):  # seed, step and layer all matter
        assert not torch.equal(kept, kept_token_indices(*other, samples, 64, 20))
    assert len({tuple(row) for row in kept.tolist()}) == 8  # and the sample


def test_kept_tokens_are_uniform():
    kept = kept_token_indices(0, 0, 0, torch.arange(4000), 32, 8)
    counts = torch.bincount(kept.flatten(), minlength=32).double()
    expected = 4000 * 8 / 32
    # every position kept about 1000 times (binomial sd ~27): a biased hash is far outside
    assert float((counts - expected).abs().max()) < 150


@pytest.mark.parametrize("dealing", ["interleaved", "blocked"])
def test_sample_indices_cover_the_global_batch_once(dealing):
    world, micro, accumulation = 3, 2, 2
    seen = sorted(i for r in range(world) for m in range(accumulation)
                  for i in sample_indices(0, micro, r, world, dealing, m, "cpu").tolist())
    assert seen == list(range(world * micro * accumulation))


def test_gather_scatter_round_trip_both_layouts():
    x = torch.randn(3, 10, 4)
    kept = kept_token_indices(0, 0, 0, torch.arange(3), 10, 4)
    part = gather_tokens(x, kept)
    assert torch.equal(part[1], x[1, kept[1]])
    assert torch.equal(scatter_tokens(x, part, kept), x)
    assert torch.equal(gather_tokens(x.transpose(0, 1), kept, batch_first=False), part.transpose(0, 1))
    y = scatter_tokens(x, part + 1, kept)
    assert torch.equal(y[1, kept[1]], x[1, kept[1]] + 1) and int((y != x).any(-1).sum()) == 3 * 4


# ---- one routed layer against the brute-force reference ---------------------------------------
class FixedSeq:
    """A scheduler stand-in with a fixed kept length."""

    def __init__(self, keep):
        self.keep = keep

    def get_current_seq(self):
        return self.keep


def reference(layer, x, kept, call):
    """Each sample alone: its kept tokens through the layer, the results put back."""
    out = x.clone()
    for i in range(x.shape[0]):
        out[i, kept[i]] = call(layer, x[i:i + 1, kept[i]], i, kept[i])[0]
    return out


def check_routed(layer, x, call_full, call_part, keep=5, layer_id=2, seed=7, step=3):
    router = TokenRouter(FixedSeq(keep), seed)
    router.step = step
    routed = RoutedLayer(router, layer_id, "mask" if isinstance(layer, PreLNBlock) else "attention_mask")
    routed.attach(layer)
    kept = kept_token_indices(seed, step, layer_id, torch.arange(x.shape[0]), x.shape[1], keep)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    got = call_full(layer, x1)
    routed.detach(layer)
    want = reference(layer, x2, kept, call_part)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    grads_got = torch.autograd.grad(got.square().sum(), [x1, *layer.parameters()])
    grads_want = torch.autograd.grad(want.square().sum(), [x2, *layer.parameters()])
    for a, b in zip(grads_got, grads_want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    dropped = torch.ones_like(x, dtype=torch.bool)
    dropped[torch.arange(x.shape[0])[:, None], kept] = False
    assert torch.equal(got[dropped], x[dropped])  # dropped tokens skip the layer
    assert not torch.equal(got[~dropped], x[~dropped])


def test_causal_block_matches_reference():
    torch.manual_seed(0)
    layer = PreLNBlock(16, 2, causal=True).train()
    x = torch.randn(3, 12, 16)
    check_routed(layer, x, lambda m, h: m(h), lambda m, h, i, k: m(h))


def test_encoder_block_with_padding_mask_matches_reference():
    torch.manual_seed(0)
    layer = PreLNBlock(16, 2, causal=False).train()
    x = torch.randn(3, 12, 16)
    mask = torch.ones(3, 1, 1, 12, dtype=torch.bool)
    mask[1, ..., 9:] = False  # sample 1 is padded
    check_routed(layer, x, lambda m, h: m(h, mask), lambda m, h, i, k: m(h, mask[i:i + 1, ..., k]))


def test_square_mask_is_gathered_at_rows_and_columns():
    torch.manual_seed(0)
    layer = PreLNBlock(16, 2, causal=False).train()
    x = torch.randn(2, 10, 16)
    mask = torch.ones(10, 10, dtype=torch.bool).tril()
    mask[:, 0] = True  # a mask that is not a prefix pattern: slicing [:r, :r] would be wrong
    check_routed(layer, x, lambda m, h: m(h, mask[None, None]),
                 lambda m, h, i, k: m(h, mask[k][:, k][None, None]))


def test_llama_layer_gathers_rotary_positions_and_mask():
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    cfg = transformers.LlamaConfig(hidden_size=16, intermediate_size=32, num_attention_heads=2,
                                   num_key_value_heads=2, num_hidden_layers=1, vocab_size=32,
                                   attn_implementation="eager")
    torch.manual_seed(0)
    layer = LlamaDecoderLayer(cfg, 0).train()
    rotary = LlamaRotaryEmbedding(cfg)
    x = torch.randn(2, 12, 16)
    pos = torch.arange(12)[None]
    cos, sin = rotary(x, pos)
    causal = torch.full((12, 12), float("-inf")).triu(1)[None, None]

    def full(m, h):
        return m(h, attention_mask=causal, position_ids=pos, position_embeddings=(cos, sin))

    def part(m, h, i, k):  # the kept tokens keep their own positions and causal order
        return m(h, attention_mask=causal[..., k, :][..., k], position_ids=pos[:, k],
                 position_embeddings=(cos[:, k], sin[:, k]))

    check_routed(layer, x, lambda m, h: full(m, h), part)


def test_eval_and_long_enough_schedules_leave_the_layer_alone():
    torch.manual_seed(0)
    layer = PreLNBlock(16, 2).train()
    x = torch.randn(2, 12, 16)
    want = layer(x)
    for keep, training in ((5, False), (12, True), (20, True)):
        router = TokenRouter(FixedSeq(keep), 0)
        routed = RoutedLayer(router, 0, "mask")
        routed.attach(layer)
        layer.train(training)
        assert torch.equal(layer(x), want)
        routed.detach(layer)
        assert routed.open == []


def test_activation_checkpointing_recomputes_the_same_tokens():
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    layer = PreLNBlock(16, 2).train()
    router = TokenRouter(FixedSeq(5), 3)
    RoutedLayer(router, 1, "mask").attach(layer)
    x = torch.randn(3, 12, 16)
    grads = []
    for run in (lambda h: layer(h), lambda h: checkpoint(layer, h, use_reentrant=False)):
        h = x.clone().requires_grad_()
        out = run(h)  # the recomputation in backward draws the kept tokens again: the same ones
        grads.append((out, *torch.autograd.grad(out.square().sum(), [h, *layer.parameters()])))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_mask_that_cannot_follow_the_tokens_is_one_line():
    from zerotrain.errors import ModelInterfaceError

    layer = PreLNBlock(16, 2).train()
    routed = RoutedLayer(TokenRouter(FixedSeq(5), 0), 0, "mask")
    routed.attach(layer)
    for mask, says in ((torch.ones(2, 12, 7, dtype=torch.bool), "has shape (2, 12, 7), which is neither"),
                       ("block-mask", "is a str, not a tensor")):
        with pytest.raises(ModelInterfaceError) as err:
            layer(torch.randn(2, 12, 16), mask)
        assert says in str(err.value) and "\n" not in str(err.value)
        assert routed.open == []  # the failed call left nothing behind for the next one

