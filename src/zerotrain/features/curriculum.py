"""Sequence-length curriculum: short sequences first, the full length later.

    difficulty(step)  pure, one function per schedule (fixed_root; fixed_linear is root 1;
                      fixed_discrete; custom is the user's function)
    CurriculumScheduler   DeepSpeed's stateful wrapper: update_difficulty() follows the
                      schedule until the difficulty reaches max, then freezes
    CurriculumFeature the engine side: before each training forward it updates with
                      global_steps + 1, then passes `curriculum_seqlen` to a model that
                      declares it or cuts the batch itself (see features/batch.py)
    applied_length    the length a forward runs at: under sequence parallelism (S ranks
                      share each sequence) a difficulty below max_difficulty is rounded down
                      to a multiple of S, never below S, so no piece is padding

The numbers follow DeepSpeed 0.19.7 exactly (spec section 1); the errors are ConfigErrors
that name the key instead of asserts.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Callable, Mapping

from ..engine.hooks import EngineFeature
from ..config.base import FieldProblem
from ..config.curriculum import SCHEDULE_KEYS, SEQLEN_METRICS, check_schedule, located
from ..errors import ConfigError, DataError
from .batch import cut_sequences, find_sequence
from .model_api import forward_accepts, is_hf_model

log = logging.getLogger("zerotrain")


# ---- the pure schedules ---------------------------------------------------------------------
def fixed_root_difficulty(step: int, min_difficulty: int, max_difficulty: int, total_curriculum_step: int,
                          difficulty_step: int, root_degree: int = 1) -> int:
    """(step / T) ** (1 / r) of the way from min to max, rounded down to a multiple of
    difficulty_step, never below min rounded up to one, capped at exactly max.

    The float expression keeps DeepSpeed's operation order so roundings agree. Negative steps
    count as 0 (same result for linear; a root of a negative number would be complex).
    """
    frac = (max(step, 0) / total_curriculum_step) ** (1.0 / root_degree)
    d = math.floor(frac * (max_difficulty - min_difficulty) + min_difficulty)
    d -= d % difficulty_step
    d = max(d, -(-min_difficulty // difficulty_step) * difficulty_step)
    return min(d, max_difficulty)


def fixed_discrete_difficulty(step: int, difficulty: list[int], max_step: list[int]) -> int:
    """difficulty[i] for the first i with step <= max_step[i] (inclusive); the last entry after."""
    for d, last in zip(difficulty, max_step):
        if step <= last:
            return d
    return difficulty[-1]


def applied_length(difficulty: int, max_difficulty: int, multiple: int) -> int:
    """The sequence length a difficulty trains at when lengths must be multiples of `multiple`:
    rounded down (the schedule's length is a ceiling), never below `multiple`; max_difficulty
    stays whole (the full sequence, padded by the sequence-parallel cut like any batch)."""
    if multiple <= 1 or difficulty >= max_difficulty:
        return difficulty
    return max(multiple, difficulty - difficulty % multiple)


# ---- the scheduler --------------------------------------------------------------------------
def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class CurriculumScheduler:
    """`CurriculumScheduler(block)` where block is the `curriculum_learning` JSON object
    (`enabled` and `curriculum_type` may be left out)."""

    def __init__(self, config, name: str = "curriculum_learning"):
        if hasattr(config, "model_dump"):  # the validated pydantic block
            config = config.model_dump(exclude_none=True)
        if not isinstance(config, Mapping):
            raise ConfigError(f"{name}: should be a JSON object, got {type(config).__name__}")
        try:
            check_schedule(config)  # the typed config's rules, so a block passes or fails alike
        except FieldProblem as problem:
            raise ConfigError(located(name, problem)) from None
        lo, hi, kind = config["min_difficulty"], config["max_difficulty"], config["schedule_type"]
        schedule = dict(config.get("schedule_config") or {})
        if kind in ("fixed_linear", "fixed_root") and schedule["difficulty_step"] % 8 != 0:
            log.warning("%s.schedule_config.difficulty_step %d is not a multiple of 8: tensor cores prefer "
                        "multiples of 8", name, schedule["difficulty_step"])
        self.state = {"min_difficulty": lo, "max_difficulty": hi, "current_difficulty": lo,
                      "schedule_type": kind, "schedule_config": schedule}
        self.custom_get_difficulty: Callable[[int], int] | None = None

    # ---- DeepSpeed's API ----------------------------------------------------------------
    def get_current_difficulty(self) -> int:
        return self.state["current_difficulty"]

    def set_current_difficulty(self, difficulty: int) -> None:
        self.state["current_difficulty"] = difficulty

    def set_custom_get_difficulty(self, fn: Callable[[int], int]) -> None:
        self.custom_get_difficulty = fn

    def get_state(self) -> dict:
        return self.state

    def set_state(self, state: dict) -> None:
        self.state = state

    def get_difficulty(self, global_steps: int) -> int:
        """The schedule at `global_steps`; changes nothing."""
        s, kind = self.state, self.state["schedule_type"]
        c = s["schedule_config"]
        if kind == "fixed_discrete":
            return fixed_discrete_difficulty(global_steps, c["difficulty"], c["max_step"])
        if kind == "custom":
            if self.custom_get_difficulty is None:
                raise ConfigError("curriculum_learning: schedule_type custom needs a function; call "
                                  "engine.set_custom_curriculum_learning_schedule(fn) or "
                                  "scheduler.set_custom_get_difficulty(fn) first")
            return self.custom_get_difficulty(global_steps)
        return fixed_root_difficulty(global_steps, s["min_difficulty"], s["max_difficulty"],
                                     c["total_curriculum_step"], c["difficulty_step"], c.get("root_degree", 1))

    def update_difficulty(self, global_steps: int) -> int:
        """Follow the schedule until the difficulty reaches max; from then on it is frozen."""
        if self.state["current_difficulty"] < self.state["max_difficulty"]:
            self.state["current_difficulty"] = self.get_difficulty(global_steps)
        return self.state["current_difficulty"]

    # ---- checkpoints (zerotrain's addition) ---------------------------------------------
    def state_dict(self) -> dict:
        return copy.deepcopy(self.state)

    def load_state_dict(self, state: dict) -> None:
        """Restore the progress only: the schedule itself comes from the current config, as an
        LR scheduler restores its step count and not its settings."""
        self.state["current_difficulty"] = state["current_difficulty"]


# ---- the engine feature ---------------------------------------------------------------------
def _declares(module, name: str) -> tuple[bool, bool]:
    """(names `name` explicitly, takes **kwargs) for module.forward; an unreadable forward is
    taken to accept keywords."""
    accepts = forward_accepts(module)
    return name in accepts.names, accepts.any_keyword or not accepts.readable


class CurriculumFeature(EngineFeature):
    """Seqlen curriculum in the engine.

    A model that names `curriculum_seqlen` in forward gets the kwarg (DeepSpeed's contract;
    so does a non-HF model taking **kwargs). Anything else, including every HF model (their
    **kwargs silently swallow unknown keys, so the kwarg would do nothing), gets its batch
    cut: each tensor whose dim 1 is the full sequence length is sliced to the difficulty.
    """

    name = "curriculum_learning"

    def __init__(self, scheduler: CurriculumScheduler, curriculum_type: str = "seqlen"):
        self.scheduler = scheduler
        self.pass_kwarg = False
        self.multiple = 1  # the engine's sequence_multiple (sequence parallelism: S)
        # DeepSpeed (spec 1.1): any other type still moves the schedule, but nothing is injected
        self.seqlen = curriculum_type == "seqlen"
        self.curriculum_type = curriculum_type

    def on_train_start(self, engine) -> None:
        named, var_kw = _declares(engine.module, "curriculum_seqlen")
        self.pass_kwarg = named or (var_kw and not is_hf_model(engine.module))
        self.multiple = getattr(engine, "sequence_multiple", 1) if self.seqlen else 1  # a stand-in engine: 1
        how = "passing curriculum_seqlen to the model" if self.pass_kwarg else "cutting the batch"
        if self.multiple > 1:
            how += f", lengths below the maximum rounded down to a multiple of {self.multiple}"
        if not self.seqlen:
            how = f"curriculum_type {self.curriculum_type!r}: the schedule moves, nothing is passed or cut"
        if engine.comm.rank == 0:
            log.info("curriculum learning on (%s, difficulty %d -> %d), %s", self.scheduler.state["schedule_type"],
                     self.scheduler.state["min_difficulty"], self.scheduler.state["max_difficulty"], how)

    def before_forward(self, engine, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        difficulty = self.scheduler.update_difficulty(engine.global_steps + 1)
        if not _is_int(difficulty) or difficulty <= 0:
            raise ConfigError(f"curriculum_learning: the schedule gave sequence length {difficulty!r}; "
                              "it must be a positive integer")
        if not self.seqlen:
            return args, kwargs
        difficulty = self.current_seqlen()
        if self.pass_kwarg:
            return args, {**kwargs, "curriculum_seqlen": difficulty}
        seq = find_sequence(args, kwargs)
        if seq is None:
            raise DataError("curriculum_learning: no (batch, sequence) tensor in the forward inputs to cut; "
                            "pass input_ids (or a 2-D token tensor first)")
        return cut_sequences(args, kwargs, seq.shape[1], difficulty)

    def current_seqlen(self) -> int | None:
        """The sequence length of the current step (rounded as `applied_length` says); None for
        another curriculum_type."""
        if not self.seqlen:
            return None
        return applied_length(self.scheduler.get_current_difficulty(), self.scheduler.state["max_difficulty"],
                              self.multiple)

    def log_fields(self, engine) -> dict:
        if self.seqlen:
            return {"seqlen": self.current_seqlen()}
        return {"difficulty": self.scheduler.get_current_difficulty()}

    def state_dict(self) -> dict:
        return self.scheduler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.scheduler.load_state_dict(state)


# ---- the data_efficiency form ---------------------------------------------------------------


def scheduler_from_data_efficiency(block) -> CurriculumScheduler:
    """`data_efficiency.data_sampling.curriculum_learning` with one seqlen metric and no training
    data -> the same scheduler (the sampler's curriculum_step also starts at 1 for the first
    batch). With training data the curriculum sampler draws by every metric instead."""
    where = "data_efficiency.data_sampling.curriculum_learning.curriculum_metrics"
    metrics = block.curriculum_metrics or {}
    for metric in metrics:
        if metric not in SEQLEN_METRICS:
            raise ConfigError(f"{where}.{metric}: a curriculum by this metric draws the training samples: pass "
                              f"initialize(training_data=...); without it only a sequence-length metric "
                              f"({' or '.join(SEQLEN_METRICS)}) acts, by cutting each batch")
    if len(metrics) != 1:
        raise ConfigError(f"{where}: give exactly one of {', '.join(SEQLEN_METRICS)}")
    metric, spec = next(iter(metrics.items()))
    if spec.difficulty_type == "percentile":
        raise ConfigError(f"{where}.{metric}.difficulty_type: percentile is not supported for a sequence-length "
                          "curriculum; use value")
    legacy = {k: v for k, v in spec.model_dump(exclude_none=True).items() if k in SCHEDULE_KEYS}
    return CurriculumScheduler(legacy, name=f"{where}.{metric}")
