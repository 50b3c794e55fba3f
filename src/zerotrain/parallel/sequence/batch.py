"""How a batch is cut by sequence, and the loss put back together: pure functions.

    input_ids  (batch, T)  -> padded to T' = S x ceil(T / S), cut into S pieces of T'/S
    labels     (batch, T)  -> shifted first (position t predicts label t+1, the last -100),
                              padded with -100, cut alike: a piece's last position needs the
                              next piece's first label, so the shift cannot happen per piece
    positions              -> each piece's global positions, t' = r x T'/S ... (r+1) x T'/S - 1

The loss is the mean over the real (not -100) labels of the whole sequence group:

    loss = sum_r sum_r' / N            N = sum_r n_r, n_r: rank r's real labels

Each rank differentiates only its own sum, scaled by S / N: the data x sequence gradient mean
divides by S again, so the gradient is the unsplit model's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE = -100


def padded_length(length: int, size: int) -> int:
    return -(-length // size) * size


def shift_labels(labels: torch.Tensor) -> torch.Tensor:
    """(batch, T) labels -> the targets of each position: the next label, -100 at the end."""
    return F.pad(labels[:, 1:], (0, 1), value=IGNORE)


def shard(tensor: torch.Tensor, rank: int, size: int, fill: int) -> torch.Tensor:
    """Rank `rank`'s piece of (batch, T, ...) along T, after padding T to a multiple of `size`
    with `fill`."""
    length = tensor.shape[1]
    padded = padded_length(length, size)
    if padded != length:
        pad = tensor.new_full((tensor.shape[0], padded - length, *tensor.shape[2:]), fill)
        tensor = torch.cat((tensor, pad), dim=1)
    piece = padded // size
    return tensor[:, rank * piece:(rank + 1) * piece]


def positions(length: int, rank: int, size: int, device=None) -> torch.Tensor:
    """The global positions of rank `rank`'s piece of a sequence of `length` (padded)."""
    piece = padded_length(length, size) // size
    return torch.arange(rank * piece, (rank + 1) * piece, device=device)


def local_loss_sum(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of the cross-entropy over this piece's real labels in fp32, their count)."""
    loss = F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten(), ignore_index=IGNORE, reduction="sum")
    return loss, (targets != IGNORE).sum()


def group_mean(local_sum: torch.Tensor, total_sum: torch.Tensor, count: torch.Tensor, size: int) -> torch.Tensor:
    """The group's mean loss as the value, with the gradient of size x local_sum / count: the
    sequence ranks' gradient mean then yields the gradient of the group mean."""
    count = count.clamp(min=1).to(local_sum.dtype)
    mine = local_sum * (size / count)
    return (total_sum / count).detach() + (mine - mine.detach())  # the value exactly the same on every rank
