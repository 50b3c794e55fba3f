"""ALST's tiled pieces (parallel/sequence/tiled.py): over tiles of the sequence the values and
gradients are the whole computation's (within 1e-6), each parameter receives its gradient
once per call (ZeRO's hooks count on it; a tied weight too), and bad inputs are one line."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from zerotrain.errors import ConfigError
from zerotrain.models.gpt import GPT, GPTConfig
from zerotrain.parallel.sequence.tiled import (TiledFusedLogitsLoss, TiledMLP, sequence_tiled_compute,
                                               tile_model)


def _close(got, want, rel=1e-6):
    scale = want.abs().max().item() or 1.0
    assert (got - want).abs().max().item() <= rel * scale


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(8, 24), torch.nn.Linear(24, 8)

    def forward(self, x):
        return self.down(F.silu(self.up(x)))


def _grads(params, x):
    return [p.grad.clone() for p in params] + [x.grad.clone()]


def _counting(params):
    """How many times each parameter's gradient was accumulated."""
    counts = [0] * len(params)
    for i, p in enumerate(params):
        p.register_post_accumulate_grad_hook(lambda _, i=i: counts.__setitem__(i, counts[i] + 1))
    return counts


def test_tiled_mlp_matches_the_whole_sequence_and_recomputes_each_tile():
    torch.manual_seed(0)
    mlp = MLP()
    x = torch.randn(2, 13, 8, requires_grad=True)  # 13 positions over 4 tiles: the last one shorter
    mlp(x).pow(2).sum().backward()
    want = _grads(list(mlp.parameters()), x)
    mlp.zero_grad(); x.grad = None
    counts, calls = _counting(list(mlp.parameters())), []
    mlp.up.register_forward_hook(lambda m, i, o: calls.append(i[0].shape[1]))
    out = TiledMLP.apply(MLP.forward, mlp, x, 4, None)  # compute_params None: the module's own
    assert calls == [4, 4, 4, 1]  # forward: one tile at a time
    out.pow(2).sum().backward()
    assert calls == [4, 4, 4, 1] * 2  # backward runs each tile again
    assert counts == [1, 1, 1, 1]
    for got, w in zip(_grads(list(mlp.parameters()), x), want):
        _close(got, w)


def test_sequence_tiled_compute_joins_or_reduces_the_tiles():
    torch.manual_seed(0)
    w = torch.randn(8, 8, requires_grad=True)
    x = torch.randn(2, 11, 8, requires_grad=True)
    positions = torch.arange(11).expand(2, -1)

    def fn(h, pos, scale):
        return (h @ w).tanh() * scale + pos.unsqueeze(-1)

    for dim, reduction in ((1, None), (1, "mean"), (1, "sum"), (0, "sum")):
        if dim == 0:  # a scalar per tile (a loss): summed over the tiles
            tiled = sequence_tiled_compute(lambda **k: fn(**k).pow(2).sum(), 11, 3, {"h": x, "pos": positions},
                                           {"scale": 2.0}, "h", [w], 0, reduction)
            whole = fn(x, positions, 2.0).pow(2).sum()
        else:
            tiled = sequence_tiled_compute(fn, 11, 3, {"h": x, "pos": positions}, {"scale": 2.0}, "h", [w], dim,
                                           reduction)
            whole = fn(x, positions, 2.0)
            whole = whole if reduction is None else whole.mean() if reduction == "mean" else whole.sum()
        _close(tiled.detach(), whole.detach())
        got = torch.autograd.grad(tiled.pow(2).sum(), [x, w])
        want = torch.autograd.grad(whole.pow(2).sum(), [x, w])
        for g, v in zip(got, want):
            _close(g, v)


def test_tiled_fused_logits_loss_never_makes_the_whole_logits():
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 32, bias=False)
    x = torch.randn(2, 9, 8, requires_grad=True)
    y = torch.randint(0, 32, (2, 9))
    y[1, 5:] = -100
    mask = (y != -100)
    sizes = []

    def loss(h, xs, ys, ms):
        logits = h(xs)
        sizes.append(logits.shape[0])
        return F.cross_entropy(logits, ys.masked_fill(~ms, -100), ignore_index=-100, reduction="sum")

    whole = F.cross_entropy(head(x).flatten(0, 1), y.flatten(), ignore_index=-100, reduction="sum")
    whole.backward()
    want = _grads([head.weight], x)
    head.zero_grad(); x.grad = None
    counts = _counting([head.weight])
    total = TiledFusedLogitsLoss.apply(loss, head, x, y, mask, 4, [head.weight], "sum")
    total.backward()
    assert max(sizes) == 5 and len(sizes) == 8  # 18 positions in tiles of 5: forward and backward
    assert counts == [1]
    _close(total.detach(), whole.detach())
    for got, w in zip(_grads([head.weight], x), want):
        _close(got, w)
    # "mean": the mean of the tiles' losses
    mean = TiledFusedLogitsLoss.apply(loss, head, x, y, mask, 3, [head.weight], "mean")
    tiles = [loss(head, a, b, c) for a, b, c in zip(x.flatten(0, 1).chunk(3), y.flatten().chunk(3),
                                                    mask.flatten().chunk(3))]
    whole_mean = torch.stack(tiles).mean()
    _close(mean.detach(), whole_mean.detach())
    got, want = torch.autograd.grad(mean, [x, head.weight]), torch.autograd.grad(whole_mean, [x, head.weight])
    for g, w in zip(got, want):
        _close(g, w)


def test_gpt_switches_tile_its_feed_forward_and_loss():
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=4, dropout=0.0)
    plain = GPT(cfg)
    tiled = GPT(GPTConfig(**{**cfg.__dict__, "mlp_tiles": 3, "loss_tiles": 4}))
    tiled.load_state_dict(plain.state_dict())
    ids = torch.randint(0, 64, (2, 29))
    labels = ids.clone()
    labels[0, 20:] = -100
    want_loss = plain(ids, labels=labels)
    want_loss.backward()
    counts = _counting([tiled.wte.weight])  # the tied head: one gradient, embedding's and head's summed
    widths = []
    tiled.blocks[0].fc.register_forward_hook(lambda m, i, o: widths.append(i[0].shape[1]))
    loss = tiled(ids, labels=labels)
    loss.backward()
    assert counts == [1] and widths == [10, 10, 9] * 2  # 29 positions in 3 tiles, again in backward
    _close(loss.detach(), want_loss.detach())
    for (name, p), q in zip(plain.named_parameters(), tiled.parameters()):
        _close(q.grad, p.grad)
    assert tiled(ids).shape == (2, 29, 64)  # without labels: the logits, untiled
    # checkpoint_blocks: each block run again in backward, the same gradients
    checkpointed = GPT(GPTConfig(**{**cfg.__dict__, "checkpoint_blocks": True}))
    checkpointed.load_state_dict(plain.state_dict())
    runs = []
    checkpointed.blocks[0].register_forward_pre_hook(lambda *a: runs.append(1))
    checkpointed(ids, labels=labels).backward()
    assert len(runs) == 2
    for p, q in zip(plain.parameters(), checkpointed.parameters()):
        _close(q.grad, p.grad)


def test_hf_decoder_tiled_in_place():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    plain = LlamaForCausalLM(cfg)
    tiled = tile_model(copy.deepcopy(plain), mlp_tiles=3, loss_tiles=5)
    ids = torch.randint(0, 64, (2, 21))
    want = plain(input_ids=ids, labels=ids).loss
    want.backward()
    out = tiled(input_ids=ids, labels=ids)
    out.loss.backward()
    assert out.logits is None and tiled.scores_shift_labels
    _close(out.loss.detach(), want.detach())
    for p, q in zip(plain.parameters(), tiled.parameters()):
        _close(q.grad, p.grad)


def test_deepspeed_import_path():
    from zerotrain.runtime.sequence_parallel import ulysses_sp

    assert (ulysses_sp.TiledMLP, ulysses_sp.sequence_tiled_compute, ulysses_sp.TiledFusedLogitsLoss) == \
        (TiledMLP, sequence_tiled_compute, TiledFusedLogitsLoss)


def test_bad_inputs_are_one_line():
    mlp = MLP()
    x = torch.randn(1, 4, 8)
    cases = {
        "shards": lambda: TiledMLP.apply(MLP.forward, mlp, x, 0, None),
        "reduction": lambda: sequence_tiled_compute(lambda h: h, 4, 2, {"h": x}, {}, "h", None, 1, "max"),
        "key": lambda: sequence_tiled_compute(lambda h: h, 4, 2, {"h": x}, {}, "x", None, 1, "sum"),
        "seqlen": lambda: sequence_tiled_compute(lambda h: h, 5, 2, {"h": x}, {}, "h", None, 1, "sum"),
        "shapes": lambda: TiledFusedLogitsLoss.apply(None, mlp, x, torch.zeros(1, 3), None, 2, [], "sum"),
        "gpt": lambda: GPT(GPTConfig(mlp_tiles=0)),
        "no_mlp": lambda: tile_model(torch.nn.Linear(2, 2), mlp_tiles=2),
    }
    messages = {}
    for name, case in cases.items():
        with pytest.raises(ConfigError) as e:
            case()
        messages[name] = str(e.value)
    assert messages["shards"] == "TiledMLP: shards 0 should be a positive integer"
    assert "output_reduction 'max'" in messages["reduction"]
    assert "grad_requiring_tensor_key 'x'" in messages["key"]
    assert "h has 4 positions on dim 1, seqlen is 5" in messages["seqlen"]
    assert messages["gpt"].startswith("GPTConfig.mlp_tiles 0: should be a positive integer")
    assert "has no module whose class name ends in 'MLP'" in messages["no_mlp"]
    assert all("\n" not in m for m in messages.values())
