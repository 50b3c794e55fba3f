"""The run folder: refusing to overwrite, resuming, and keeping only save_total_limit checkpoints.

    output_dir/
        checkpoint-<step>/   engine checkpoint (model_states.pt, optim_rank*.pt, rng_rank*.pt)
                             + model weights or adapter + tokenizer, all in its manifest.json
        latest               the newest complete checkpoint's folder name
        metrics.jsonl        one record per logging / eval step
        tensorboard/         the same numbers as TensorBoard scalars
        trainer_state.json   best checkpoint, final metrics
        <final model>        weights (or the LoRA adapter) + tokenizer, loadable as a model folder
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from ...checkpoint.universal import LATEST_UNIVERSAL
from ...errors import CheckpointError, ConfigError

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
# What a run writes at the top of output_dir; --overwrite_output_dir clears only these.
RUN_FILES = ("latest", "metrics.jsonl", "tensorboard", "trainer_state.json", "plot.png", "model.safetensors",
             "zerotrain_model.json", "config.json", "generation_config.json", "adapter_config.json",
             "adapter_model.safetensors", "zerotrain_adapter.json", "tokenizer.json", "tokenizer_config.json",
             "special_tokens_map.json", "chat_template.jinja", "predictions.jsonl")


def checkpoints(output_dir: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every checkpoint-<step> folder, oldest first."""
    if not output_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in output_dir.iterdir() if p.is_dir() and (m := _CHECKPOINT.match(p.name))]
    return sorted(found)


def check_output_dir(output_dir: Path, overwrite: bool, resuming: bool) -> None:
    """Every rank calls this before any rank writes (then a barrier)."""
    if output_dir.exists() and not output_dir.is_dir():
        raise ConfigError(f"output_dir {output_dir}: exists and is not a folder")
    if resuming or overwrite or not output_dir.is_dir():
        return
    entries = sorted(p.name for p in output_dir.iterdir())
    if entries:
        shown = ", ".join(entries[:4]) + (", ..." if len(entries) > 4 else "")
        raise ConfigError(f"output_dir {output_dir} is not empty ({shown}); pass --overwrite_output_dir to "
                          "write into it, or --resume_from_checkpoint latest to continue its run")


def clear_previous_run(output_dir: Path) -> None:
    """--overwrite_output_dir without resuming: remove the old run's checkpoints and logs so
    they cannot mix with the new ones (other files are left alone)."""
    for _, folder in checkpoints(output_dir):
        shutil.rmtree(folder)
    for name in RUN_FILES:
        path = output_dir / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def resolve_resume(value: str, output_dir: Path) -> tuple[Path, str | None]:
    """--resume_from_checkpoint -> (save_dir, tag) for engine.load_checkpoint."""
    if value.lower() in ("latest", "last", "true"):
        if not (output_dir / "latest").is_file():
            raise CheckpointError(f"--resume_from_checkpoint {value}: no checkpoint in {output_dir} "
                                  "(no 'latest' file); start without it")
        return output_dir, None
    path = Path(value).expanduser()
    if not path.is_dir():
        raise CheckpointError(f"--resume_from_checkpoint {value}: no such checkpoint folder")
    if (path / "latest").is_file() and not (path / "manifest.json").is_file():
        return path, None  # a run folder: its newest checkpoint
    if (path / LATEST_UNIVERSAL).is_file():  # DeepSpeed universal checkpoints: the newest one
        return path, (path / LATEST_UNIVERSAL).read_text(errors="replace").strip()
    return path.parent, path.name


def rotate(output_dir: Path, limit: int | None, keep: Path | None) -> list[Path]:
    """Delete the oldest checkpoints beyond `limit`, never `keep` (the best one) nor the newest."""
    if limit is None:
        return []
    found = [folder for _, folder in checkpoints(output_dir)]
    survivors = set(found[-limit:])
    if keep is not None and keep in found:
        survivors.add(keep)
        if len(survivors) > limit and limit > 1:  # the best one takes an old checkpoint's place
            survivors.discard(next(f for f in found[-limit:] if f != keep))
    removed = [f for f in found if f not in survivors]
    for folder in removed:
        shutil.rmtree(folder, ignore_errors=True)
    return removed


def check_storage(comm, output_dir: Path, node_local: bool) -> None:
    """With several nodes: output_dir is shared by all of them, or (node-local storage) by none.
    Local rank 0 of each node leaves a marker and every node says whose markers it sees; a
    mismatch with checkpoint.use_node_local_storage would crash the first save, or let two
    nodes overwrite each other's files."""
    node_of = comm.all_gather_object(comm.state.node)
    nodes = max(node_of) + 1
    if nodes == 1:
        return
    marker = output_dir / f".zerotrain-node{comm.state.node}"
    if comm.state.local_rank == 0:
        marker.touch()
    comm.barrier()
    seen = comm.all_gather_object(sorted(n for n in range(nodes) if (output_dir / f".zerotrain-node{n}").exists()))
    comm.barrier()
    if comm.state.local_rank == 0:
        marker.unlink(missing_ok=True)
    everyone = list(range(nodes))
    if node_local and any(len(s) > 1 for s in seen):
        rank = next(r for r, s in enumerate(seen) if len(s) > 1)
        raise ConfigError(f"checkpoint.use_node_local_storage is set, but output_dir {output_dir} is shared: node "
                          f"{node_of[rank]} sees the files of nodes {', '.join(map(str, seen[rank]))}, so their "
                          "checkpoint writers would overwrite each other; drop use_node_local_storage, or give each "
                          "node a folder of its own")
    if not node_local and any(s != everyone for s in seen):
        rank = next(r for r, s in enumerate(seen) if s != everyone)
        missing = sorted(set(everyone) - set(seen[rank]))
        raise ConfigError(f"output_dir {output_dir} is not shared between the nodes: node {node_of[rank]} does not see "
                          f"the files of node {missing[0]}; set \"checkpoint\": {{\"use_node_local_storage\": true}} "
                          "in the DeepSpeed config (each node keeps its own ranks' checkpoint files), or use a "
                          "folder every node mounts")
