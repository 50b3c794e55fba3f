"""The logger scripts write to, and DeepSpeed's `log_dist` (log on chosen ranks).

`logger` logs at INFO on every rank, prefixed `[zerotrain]`; it is a child of the engine's
"zerotrain" logger, so one handler (and one place to silence it) serves both.
"""

from __future__ import annotations

import logging
import sys

from ..comm import facade


def _logger() -> logging.Logger:
    parent = logging.getLogger("zerotrain")
    if not parent.handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("[zerotrain] %(message)s"))
        parent.addHandler(handler)
        parent.propagate = False
    child = logging.getLogger("zerotrain.script")
    child.setLevel(logging.INFO)
    return child


logger = _logger()


def log_dist(message: str, ranks: list[int] | None = None, level: int = logging.INFO) -> None:
    """Log `message` prefixed with this rank on the ranks listed (`[-1]`: every rank). Without
    a process group it is always logged; with one and no `ranks`, nowhere (as DeepSpeed)."""
    if facade.is_initialized():
        ranks = list(ranks or [])
        me = facade.get_rank()
        if not (ranks and ranks[0] == -1) and me not in ranks:
            return
    else:
        me = -1
    logger.log(level, f"[Rank {me}] {message}")
