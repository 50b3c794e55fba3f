"""parallel/sequence/batch.py: the cut of a batch by sequence and the loss put back together,
in one process (the ranks are simulated by their index)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from zerotrain.parallel.sequence import batch as B


def test_pieces_pad_shift_and_positions_rebuild_the_whole_sequence():
    labels = torch.arange(10).view(2, 5)
    pieces = [B.shard(B.shift_labels(labels), r, 2, B.IGNORE) for r in range(2)]
    assert torch.equal(torch.cat(pieces, dim=1), torch.tensor([[1, 2, 3, 4, -100, -100], [6, 7, 8, 9, -100, -100]]))
    assert [B.positions(5, r, 2).tolist() for r in range(2)] == [[0, 1, 2], [3, 4, 5]]
    assert B.padded_length(5, 4) == 8 and B.padded_length(8, 4) == 8


def test_group_mean_has_the_unsplit_value_and_gradient():
    torch.manual_seed(0)
    logits = torch.randn(2, 8, 5, requires_grad=True)
    targets = torch.randint(0, 5, (2, 8)).masked_fill(torch.tensor([[0] * 7 + [1], [0] * 2 + [1] * 6]).bool(), -100)
    whole = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
    (want,) = torch.autograd.grad(whole, logits)
    sums = [B.local_loss_sum(logits[:, r * 4:(r + 1) * 4], targets[:, r * 4:(r + 1) * 4]) for r in range(2)]
    total, count = sum(s.detach() for s, _ in sums), sum(c for _, c in sums)
    losses = [B.group_mean(s, total, count, 2) for s, _ in sums]
    assert all(loss.item() == losses[0].item() for loss in losses)  # the same value on every rank
    assert torch.allclose(losses[0], whole)
    (got,) = torch.autograd.grad(sum(losses) / 2, logits)  # the sequence ranks' gradient mean
    assert torch.allclose(got, want, atol=1e-7)
