"""`zerotrain config CONFIG.json [--world_size N]`: the resolved config, one line per key.

    key                                   value        source
    zero_optimization.overlap_comm        true         zerotrain default: overlap at every stage ...
    zero_optimization.contiguous_gradients true        user, no effect: gradients always live in ...
    optimizer.params.lr                   5e-05        auto: the trainer fills it from learning_rate

"auto" values the trainer fills are shown with `zerotrain train`'s defaults; stage 3's two
model-derived values are measured at initialize. Keys refused by name are listed with the
reason, and the command then exits 2 with the first one; any other mistakes in the file are
reported together, one line each, and exit 2. The batch triad is resolved from the file alone
for --world_size data-parallel ranks, by DeepSpeed's rules (config/batch.py): no trainer
option is assumed where the file gives its numbers.
"""

from __future__ import annotations

import copy
import sys

from ..config import TRAINER_FILLS, load_config, read_config
from ..config.base import REFUSED, field_class
from ..config.loader import _model_at, problems_of, spellings
from ..config.report import notice, rows
from ..errors import ConfigError


def add_arguments(parser) -> None:
    parser.add_argument("config", help="DeepSpeed JSON (or hjson) config file")
    parser.add_argument("--world_size", "--world-size", type=int, default=1,
                        help="data-parallel ranks the batch sizes are resolved for (default 1)")


def _trainer_values(raw: dict, world_size: int) -> dict:
    """What `zerotrain train` would write over this file's "auto" values at its defaults. The
    batch numbers the file gives are never overridden: the trainer resolves the triad by
    DeepSpeed's rules from them (config/batch.py), so the file is checked for `world_size`
    processes as it stands. A file the trainer refuses fills nothing: load_config then names
    its problems."""
    from ..trainer.args import TrainingArguments
    from ..trainer.ds_config import build_deepspeed_config

    args = TrainingArguments(output_dir=".", deepspeed=copy.deepcopy(raw))
    try:
        built = build_deepspeed_config(args, set(), world_size, None, 1024).config  # block_size: its usual default
    except ConfigError:
        return {}
    values = {}
    for path in _autos(raw):
        value = _get(built, path)
        # scheduler step counts stay "auto" (only the run knows them; the block is not typed);
        # the hidden-size ones are left to the default the config gives "auto" there
        if path in TRAINER_FILLS and (value != "auto" or path.startswith("scheduler.")):
            values[path] = value
    return values


def _autos(node, path: str = "") -> list[str]:
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in _autos(v, f"{path}.{k}" if path else str(k))]
    return [path] if node == "auto" else []


def _get(node, path: str):
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _refused_key(message: str) -> str | None:
    """The dotted key of a refusal message, if the key is one that is refused by name."""
    key = message.split(":", 1)[0]
    parts = key.split(".")
    model = _model_at(tuple(parts[:-1]))
    if model is None:
        return None
    name = next((n for n in model.model_fields if parts[-1] in spellings(n, model)), None)
    if name is None or field_class(model.model_fields[name]).get("effect") != REFUSED:
        return None
    return key


def _drop(node: dict, key: str):
    parts = key.split(".")
    for part in parts[:-1]:
        node = node[part]
    for spelling in list(node):
        if spelling == parts[-1] or spelling == f"stage3_{parts[-1]}":
            return node.pop(spelling)
    return None


def resolve(path: str, world_size: int) -> tuple[list[tuple[str, str, str]], list[str], str | None]:
    """(rows, refusals as "key: reason", notice line) for the config file at `path`."""
    raw = read_config(path)
    data, refusals = copy.deepcopy(raw), []
    for _ in range(64):  # each pass sets the refused keys it met aside
        try:
            cfg = load_config(data, world_size=world_size, auto_values=_trainer_values(data, world_size))
            break
        except ConfigError as err:
            problems = problems_of(err)
            refused = [p for p in problems if _refused_key(p) is not None]
            if len(refused) < len(problems) or not all(_drop(data, _refused_key(p)) is not None for p in refused):
                raise
            refusals += refused
    else:  # pragma: no cover - a config with more than 64 refused keys
        raise ConfigError(f"{path}: too many refused keys")
    table = [(k, v, s) for k, v, s in rows(cfg)] + [(r.split(":", 1)[0], "", "refused:" + r.split(":", 1)[1])
                                                   for r in refusals]
    return table, refusals, notice(cfg)


def run(args) -> int:
    if args.world_size < 1:
        raise ConfigError(f"--world_size should be a positive integer, got {args.world_size}")
    table, refusals, line = resolve(args.config, args.world_size)
    width = max(len(k) for k, _, _ in table)
    vwidth = min(24, max(len(v) for _, v, _ in table))
    print(f"{args.config} for {args.world_size} rank{'s' if args.world_size > 1 else ''}: each key, the value "
          "in force and where it came from")
    for key, value, source in table:
        print(f"  {key.ljust(width)}  {value.ljust(vwidth)}  {source}")
    if line:
        print(line)
    if refusals:
        print(f"zerotrain: error: {refusals[0]}", file=sys.stderr)
        return 2
    return 0
