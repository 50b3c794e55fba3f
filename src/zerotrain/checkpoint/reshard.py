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
from .consolidate import _fill_chunked, _fill_flat
from .store import load_file


def _old_ranks(layout: dict) -> list[int]:
    return list(range(int(layout["world_size"]) if int(layout["stage"]) > 0 else 1))


def _whole(layout: dict, group: dict, pieces: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per-parameter flat tensors of one group from the pieces every old rank saved."""
    ws, stage = int(layout["world_size"]), int(layout["stage"])
    numels = group.get("full_numels", group["numels"])
    out = {n: torch.zeros(int(k), dtype=pieces[0].dtype) for n, k in zip(group["names"], numels)}
    for rank, piece in zip(_old_ranks(layout), pieces):
        piece = piece.reshape(-1)
        if layout["scheme"] == "flat":
            _fill_flat(out, group, piece, 0 if stage == 0 else rank * group["shard_numel"])
        else:
            _fill_chunked(out, group, piece, rank)
    return out


def _cut(layout: dict, group: dict, whole: dict[str, torch.Tensor], rank: int, numel: int) -> torch.Tensor:
    """This rank's piece of one group in the new layout (numel: the piece's length)."""
    piece = torch.zeros(numel, dtype=next(iter(whole.values())).dtype)
    if layout["scheme"] == "flat":
        start = 0 if int(layout["stage"]) == 0 else rank * group["shard_numel"]
        for name, o, n in zip(group["names"], group["offsets"], group["numels"]):
            lo, hi = max(o, start), min(o + n, start + numel)
            if lo < hi:
                piece[lo - start : hi - start] = whole[name][lo - o : hi - o]
    else:
        for name, o, c, n in zip(group["names"], group["offsets"], group["numels"], group["full_numels"]):
            take = min(c, n - rank * c)
            if take > 0:
                piece[o : o + take] = whole[name][rank * c : rank * c + take]
    return piece


def _piece_numel(layout: dict, group: dict) -> int:
    flat_stage0 = layout["scheme"] == "flat" and int(layout["stage"]) == 0
    return group["shard_numel"] * (int(layout["world_size"]) if flat_stage0 else 1)


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
    old_sizes = [_piece_numel(old, g) for g in old["groups"]]
    new_sizes = [_piece_numel(new, g) for g in new["groups"]]

    def convert(gi: int, pieces: list) -> torch.Tensor:
        if not all(torch.is_tensor(p) and p.numel() == old_sizes[gi] for p in pieces):
            raise CheckpointError(f"{path}: a per-rank state of group {gi} does not have the "
                                  f"{old_sizes[gi]} elements its layout says; the checkpoint is corrupted")
        whole = _whole(old, old["groups"][gi], pieces)
        return _cut(new, new["groups"][gi], whole, rank, new_sizes[gi])

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
