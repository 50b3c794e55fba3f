"""Loading a checkpoint into a different world size.

Each rank's optimizer file holds per-element state (fp32 masters, Adam moments, stage-3
parameter shards) laid out for the world that wrote it. Here every such tensor is put back
together per parameter from all the old ranks' files (consolidate.py's fills, driven by the
saved layout) and cut again with this run's layout for this rank. Scalars (step counts) and
hyperparameters are taken from rank 0's file.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import CheckpointError
from ..zero.layout import GroupLayout, fill_from_piece, piece_from
from .consolidate import group_layouts
from .store import load_file


def _old_ranks(layout: dict) -> list[int]:
    return list(range(int(layout["world_size"]) if int(layout["stage"]) > 0 else 1))


def _whole(old: GroupLayout, ranks: list[int], pieces: list[torch.Tensor]) -> list[torch.Tensor]:
    """Per-parameter flat tensors of one group from the pieces every old rank saved."""
    whole = [torch.zeros(n, dtype=pieces[0].dtype) for n in old.full_numels]
    for rank, piece in zip(ranks, pieces):
        fill_from_piece(whole, old.spans(rank), piece.reshape(-1))
    return whole


def _piece_numel(layout: GroupLayout, rank: int) -> int:
    lo, hi = layout.piece_range(rank)
    return hi - lo


def reshard_rank_state(path: Path, old: dict, new: dict, rank: int, prefix: str = "") -> dict:
    """This rank's {"optimizer", "strategy"} state for layout `new`, from the files of a
    checkpoint written with layout `old` (same model, same param groups); `prefix` names the
    files of one pipeline stage or model-parallel slice."""
    ws = old["world_size"]
    if not isinstance(ws, int) or ws < 1 or (int(old["stage"]) > 0 and not (path / f"{prefix}optim_rank{ws - 1}.pt").is_file()):
        raise CheckpointError(f"{path}/{prefix}model_states.pt: world size {ws!r} does not match its rank files; "
                              "the checkpoint is incomplete or corrupted")
    files = [load_file(path, f"{prefix}optim_rank{r}.pt") for r in _old_ranks(old)]
    if [g["names"] for g in old["groups"]] != [g["names"] for g in new["groups"]]:
        raise CheckpointError(f"{path}: its parameter groups differ from this model's; a checkpoint "
                              "can change world size, not the model or its param groups")
    old_layouts, new_layouts = group_layouts(path, old), group_layouts(path, new)
    old_sizes = [_piece_numel(g, 0) for g in old_layouts]
    new_sizes = [_piece_numel(g, rank) for g in new_layouts]
    ranks = _old_ranks(old)

    def convert(gi: int, pieces: list) -> torch.Tensor | None:
        if all(piece is None for piece in pieces):  # a group without this kind of state (frozen: no masters)
            return None
        if not all(torch.is_tensor(p) and p.numel() == old_sizes[gi] for p in pieces):
            raise CheckpointError(f"{path}: a per-rank state of group {gi} does not have the "
                                  f"{old_sizes[gi]} elements its layout says; the checkpoint is corrupted")
        whole = _whole(old_layouts[gi], ranks, pieces)
        piece = torch.zeros(new_sizes[gi], dtype=whole[0].dtype)
        return piece_from(whole, new_layouts[gi].spans(rank), piece)

    strategy = {key: [convert(gi, [f["strategy"][key][gi] for f in files]) for gi in range(len(old_sizes))]
                for key in files[0]["strategy"]}
    optimizer = files[0]["optimizer"]
    if optimizer is not None:
        state = {}
        for index, entry in optimizer["state"].items():
            gi = int(index)  # one flat master per group: parameter index == group index
            state[index] = {k: convert(gi, [f["optimizer"]["state"][index][k] for f in files])
                            if torch.is_tensor(v) and v.numel() == old_sizes[gi] else v
                            for k, v in entry.items()}
        optimizer = dict(optimizer, state=state)
    return {"optimizer": optimizer, "strategy": strategy}
