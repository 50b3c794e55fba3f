"""The rules a curriculum schedule meets, in one place.

The typed config runs them on the `curriculum_learning` block (and on a data_efficiency seqlen
metric); `CurriculumScheduler`, which DeepSpeed scripts also build from a plain dict, runs the
same function, so a block is judged by one set of rules and one set of messages wherever it
comes from. Each rule raises `FieldProblem(key, reason)`, the key relative to the block, and
the caller names the block.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import did_you_mean
from .base import FieldProblem

SCHEDULE_TYPES = ("fixed_linear", "fixed_root", "fixed_discrete", "custom")
SCHEDULE_NEEDS = {"fixed_linear": ("total_curriculum_step", "difficulty_step"),
                  "fixed_root": ("total_curriculum_step", "difficulty_step", "root_degree"),
                  "fixed_discrete": ("difficulty", "max_step"), "custom": ()}
SCHEDULE_KEYS = ("min_difficulty", "max_difficulty", "schedule_type", "schedule_config")
SEQLEN_METRICS = ("seqlen", "seqlen_truncate")  # the data_efficiency metrics zerotrain acts on
BLOCK_KEYS = ("enabled", "curriculum_type", "min_difficulty", "max_difficulty", "schedule_type", "schedule_config")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_schedule(block: Mapping) -> None:
    """Raise FieldProblem for the first rule `block` (the curriculum's keys, a plain mapping:
    pass a pydantic block through `model_dump(exclude_none=True)`) breaks."""
    for key in block:
        if key not in BLOCK_KEYS:
            raise FieldProblem(key, f"unknown key{did_you_mean(key, BLOCK_KEYS)}")
    for key in ("min_difficulty", "max_difficulty", "schedule_type"):
        if block.get(key) is None:
            raise FieldProblem(key, "is missing: needed when curriculum learning is enabled")
    kind = block["schedule_type"]
    if kind not in SCHEDULE_TYPES:
        raise FieldProblem("schedule_type", f"should be one of {', '.join(SCHEDULE_TYPES)}, got {kind!r}"
                                            f"{did_you_mean(str(kind), SCHEDULE_TYPES)}")
    lo, hi = block["min_difficulty"], block["max_difficulty"]
    for key, value in (("min_difficulty", lo), ("max_difficulty", hi)):
        if not _is_int(value):
            raise FieldProblem(key, f"should be an integer, got {value!r}")
    schedule = block.get("schedule_config") or {}
    needs = SCHEDULE_NEEDS[kind]
    for key in schedule:
        if key not in needs:
            hint = did_you_mean(key, needs) if needs else f" (schedule_type {kind} takes no schedule_config)"
            raise FieldProblem(f"schedule_config.{key}", f"unknown key for schedule_type {kind}{hint}")
    for key in needs:
        if key not in schedule:
            raise FieldProblem(f"schedule_config.{key}", f"is missing: schedule_type {kind} needs {', '.join(needs)}")
    if kind == "fixed_discrete":
        levels, bounds = schedule["difficulty"], schedule["max_step"]
        for key, values in (("difficulty", levels), ("max_step", bounds)):
            if not isinstance(values, list) or not values or not all(_is_int(v) for v in values):
                raise FieldProblem(f"schedule_config.{key}", f"should be a non-empty list of integers, got {values!r}")
        if len(levels) != len(bounds) + 1:
            raise FieldProblem("schedule_config.max_step",
                               f"needs one entry fewer than difficulty ({len(levels)} levels need "
                               f"{len(levels) - 1} boundaries), got {len(bounds)}")
        if any(b >= c for b, c in zip(bounds, bounds[1:])):
            raise FieldProblem("schedule_config.max_step", f"should be strictly increasing, got {bounds}")
    elif kind in ("fixed_linear", "fixed_root"):
        for key in needs:
            if not _is_int(schedule[key]) or schedule[key] <= 0:
                raise FieldProblem(f"schedule_config.{key}", f"should be a positive integer, got {schedule[key]!r}")
        if lo > hi:
            raise FieldProblem("min_difficulty", f"{lo} is above max_difficulty {hi}")


def located(name: str, problem: FieldProblem) -> str:
    """The one-line message for a problem of the block called `name`, as the config loader
    words every other problem."""
    path = f"{name}.{problem.key}" if problem.key else name
    reason = str(problem)
    return f"{path} {reason}" if reason.startswith("is ") else f"{path}: {reason}"
