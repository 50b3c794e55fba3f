"""The DeepSpeed config a training run uses, built from TrainingArguments as HF does.

    --deepspeed ds.json  (or none: an empty config; read by config.read_config, the reader
                          zerotrain.initialize uses too)
        key absent        -> the option's value is written in
        key "auto"        -> the option's value, through config.fill_auto (the one filler)
        key = value       -> must agree with the option if the user set that option,
                             otherwise the DeepSpeed value wins and the run uses it:
                             returned in BuiltConfig.adopted, never written into the options

The values only the model and the data know (the hidden size behind HF's "auto" bucket sizes,
the curriculum's "auto" maximum) are filled here when given, or later by `fill_model_sizes`.

The batch triad is resolved by DeepSpeed's rules (config/batch.py, the resolver
zerotrain.initialize and `zerotrain config` use): the file's numbers and the options the user
set are the givens, and an option left at its HF default fills in only when the file gives
neither train_batch_size nor the micro batch. So {"train_batch_size": 16,
"gradient_accumulation_steps": 1} runs a micro batch of 16 on one process, 4 on four.

Every disagreement is listed in one ConfigError line, with the file's unknown keys and bad
values beside it. The scheduler block, if present,
replaces lr_scheduler_type (HF does the same), with its "auto" warmup / total filled in
(a warmup of 0 means no warmup). "auto" left inside fp16, bf16 and zero_optimization means
the default, as in DeepSpeed.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field

from ..config import autos_left, fill_auto, read_config
from ..config.auto import unfilled_message
from ..config.batch import TRIAD, derive_batch_sizes, resolve_batch_sizes
from ..config.loader import check_keys, collected, file_problems
from ..errors import ConfigError
from .token_options import merge_token_budget

_OPTIM_TYPES = {"adamw": "AdamW", "adam": "Adam", "sgd": "SGD", "momentum": "momentum"}
_ADAM = ("adamw", "adam")


def read_deepspeed(value) -> dict:
    return {} if value is None else read_config(value)


@dataclass(frozen=True)
class BuiltConfig:
    """What `build_deepspeed_config` made: the config for zerotrain.initialize, whether it sets
    the LR itself (a scheduler block, or token-based decay: token_options.py), and the option values the config decided (option name ->
    value, for options the user left at their defaults). The options themselves are not
    written to: the run plan holds a copy with `adopted` applied."""

    config: dict
    uses_ds_scheduler: bool
    adopted: dict = field(default_factory=dict)


def model_hidden_size(model) -> int | None:
    """The hidden size HF's "auto" bucket sizes are computed from (the largest of
    `hidden_sizes` for models that have several), read from the model's config."""
    for config in (getattr(model, "config", None), getattr(model, "cfg", None)):
        for name in ("hidden_size", "n_embd", "d_model"):
            value = getattr(config, name, None)
            if isinstance(value, int) and value > 0:
                return value
        sizes = getattr(config, "hidden_sizes", None)
        if isinstance(sizes, (list, tuple)) and sizes and all(isinstance(v, int) for v in sizes):
            return max(sizes)
    return None


def sample_length(dataset) -> int:
    """Tokens in the first training sample: the curriculum's "auto" maximum for a dataset
    of fixed-length blocks handed to zerotrain.Trainer directly."""
    try:
        return len(dataset[0]["input_ids"])
    except (IndexError, KeyError, TypeError):
        return 0


def _same(a, b) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, str) or isinstance(b, str):
        return str(a).lower() == str(b).lower()
    try:
        return abs(float(a) - float(b)) <= 1e-12 * max(1.0, abs(float(a)))
    except (TypeError, ValueError):
        return a == b


class _Filler:
    def __init__(self, args, explicit: set[str], adopt):
        self.args, self.explicit, self.adopt = args, explicit, adopt
        self.conflicts: list[str] = []  # the file against options the user set
        self.problems: list[str] = []  # the file against itself (its batch numbers)

        self.autos: dict[str, object] = {}  # dotted key -> option value, for fill_auto

    def match(self, block: dict, key: str, dotted: str, option: str, value, adopt=None):
        """Fill block[key] from the option, or check it against the option."""
        if key not in block:
            block[key] = value
            return value
        if block[key] == "auto":
            self.autos[dotted] = value
            return value
        given = block[key]
        if _same(given, value):
            return given
        if option in self.explicit:
            self.conflicts.append(f"{dotted}={json.dumps(given)} vs --{option} {value}")
        elif adopt is not None:
            adopt(given)
        return given


def _config_size(given, option: str, key: str, args, explicit: set[str]) -> int:
    """The parallel size in force: the config's integer `given` (None: not given) checked
    against --`option` when the user set it (one line when they differ), else the option's."""
    if isinstance(given, int) and not isinstance(given, bool):
        size = max(1, given)
        if option in explicit and size != getattr(args, option):
            raise ConfigError(f"the DeepSpeed config disagrees with the options: {key}={given} vs --{option} "
                              f"{getattr(args, option)}. Make them equal, set the DeepSpeed value to \"auto\", "
                              "or drop the option")
        return size
    return getattr(args, option)


def tensor_parallel_option(args, explicit: set[str], raw: dict | None = None) -> int:
    """--tensor_parallel_size and the config's tensor_parallel.autotp_size agree (either may
    give it); the size in force. Read before the batch sizes: the processes they count are
    the data-parallel ones. `raw`: the config already read (else read from args.deepspeed)."""
    raw = read_deepspeed(args.deepspeed) if raw is None else raw
    block = raw.get("tensor_parallel")
    given = block.get("autotp_size") if isinstance(block, dict) and block.get("enabled", True) is not False else None
    return _config_size(given, "tensor_parallel_size", "tensor_parallel.autotp_size", args, explicit)


def sequence_parallel_option(args, explicit: set[str], raw: dict | None = None) -> int:
    """--sequence_parallel_size and the config's sequence_parallel_size agree (either may give
    it); the size in force."""
    raw = read_deepspeed(args.deepspeed) if raw is None else raw
    return _config_size(raw.get("sequence_parallel_size"), "sequence_parallel_size", "sequence_parallel_size",
                        args, explicit)


def data_parallel_size(args, explicit: set[str], world_size: int, raw: dict | None = None) -> int:
    """The data-parallel ranks among `world_size` processes once they are split into pipeline
    stages, sequence ranks and tensor ranks (the mesh's pipe x data x sequence x tensor); one
    line when they do not divide or do not combine."""
    stages, tensor = args.pipeline_parallel_size, tensor_parallel_option(args, explicit, raw)
    sequence = sequence_parallel_option(args, explicit, raw)
    if sequence > 1 and (stages > 1 or tensor > 1):
        other = f"--pipeline_parallel_size {stages}" if stages > 1 else f"--tensor_parallel_size {tensor}"
        raise ConfigError(f"--sequence_parallel_size {sequence} with {other}: sequence parallelism is not combined "
                          "with pipeline or tensor parallelism here; keep one of them above 1")
    model = stages * tensor * sequence
    if world_size % model:
        what = " with ".join(f"--{name}_parallel_size {size}" for name, size in (
            ("pipeline", stages), ("sequence", sequence), ("tensor", tensor)) if size > 1)
        kinds = "sequence" if sequence > 1 else "pipeline x tensor"
        raise ConfigError(f"{what}: the {world_size} processes are not a multiple of {model}; launch a "
                          f"multiple of {model} (data parallel x {kinds})")
    return world_size // model


def model_autos(ds: dict, hidden_size: int | None, block_size) -> dict[str, object]:
    """The "auto" values only the model and the data give: HF's bucket sizes from the hidden
    size, and the curriculum's maximum from the block size (an int, or a callable asked only
    when the curriculum needs it). Dotted key -> value, for fill_auto."""
    autos: dict[str, object] = {}
    if hidden_size:  # else "auto" in zero_optimization means zerotrain's default
        for key, value in (("reduce_bucket_size", hidden_size * hidden_size),
                           ("stage3_prefetch_bucket_size", int(0.9 * hidden_size * hidden_size)),
                           ("prefetch_bucket_size", int(0.9 * hidden_size * hidden_size)),
                           ("stage3_param_persistence_threshold", 10 * hidden_size),
                           ("param_persistence_threshold", 10 * hidden_size)):
            autos[f"zero_optimization.{key}"] = value
    curriculum = ds.get("curriculum_learning")
    if isinstance(curriculum, dict) and curriculum.get("max_difficulty") == "auto":
        length = block_size() if callable(block_size) else block_size  # a callable reads the data only now
        if length:
            autos["curriculum_learning.max_difficulty"] = length
    return autos


def fill_model_sizes(ds: dict, hidden_size: int | None, block_size) -> dict:
    """Write `model_autos` into `ds` (in place); "auto" stays where they say nothing."""
    filled = fill_auto(ds, model_autos(ds, hidden_size, block_size), keep_unfilled=True)
    ds.clear()
    ds.update(filled)
    return ds


def build_deepspeed_config(args, explicit: set[str], world_size: int, hidden_size: int | None,
                           block_size, raw: dict | None = None) -> BuiltConfig:
    """The config for zerotrain.initialize from the options, for `world_size` data-parallel
    ranks. The scheduler's step counts stay "auto" here; `fill_schedule` sets them once known.
    `hidden_size` and `block_size` (int, or a callable asked only when the curriculum needs it)
    fill the "auto"s of `model_autos`; None leaves them for `fill_model_sizes`. `raw`: the
    config already read (else read from args.deepspeed). `args` is read, never written."""
    ds = copy.deepcopy(raw) if raw is not None else read_deepspeed(args.deepspeed)
    args = copy.copy(args)  # the values the config decides go into this copy and `adopted`
    adopted: dict[str, object] = {}

    def adopt(name: str, value) -> None:
        setattr(args, name, value)
        adopted[name] = value

    tensor = tensor_parallel_option(args, explicit, ds)
    if tensor != args.tensor_parallel_size:
        adopt("tensor_parallel_size", tensor)
    sequence = sequence_parallel_option(args, explicit, ds)
    if sequence != args.sequence_parallel_size:
        adopt("sequence_parallel_size", sequence)
    f = _Filler(args, explicit, adopt)
    setter = lambda name: (lambda v: _adopt_as(adopt, name, type(getattr(args, name)), v))  # noqa: E731
    _batch_triad(ds, args, explicit, world_size, f, adopt)
    block = ds.get("tensor_parallel")
    if args.tensor_parallel_size > 1 or isinstance(block, dict) and block.get("autotp_size") == "auto":
        f.match(ds.setdefault("tensor_parallel", {}), "autotp_size", "tensor_parallel.autotp_size",
                "tensor_parallel_size", args.tensor_parallel_size)
    if args.sequence_parallel_size > 1 or ds.get("sequence_parallel_size") == "auto":
        f.match(ds, "sequence_parallel_size", "sequence_parallel_size", "sequence_parallel_size",
                args.sequence_parallel_size)
    if not _clipping_left_to_the_config(ds, explicit):
        f.match(ds, "gradient_clipping", "gradient_clipping", "max_grad_norm", args.max_grad_norm,
                setter("max_grad_norm"))
    for name in ("fp16", "bf16"):
        key = "bfloat16" if name == "bf16" and "bfloat16" in ds else name
        block = ds.setdefault(key, {})
        if isinstance(block, dict):
            f.match(block, "enabled", f"{key}.enabled", name, getattr(args, name), setter(name))
    if isinstance(ds.get("amp"), dict) and ds["amp"].get("enabled") == "auto":
        f.autos["amp.enabled"] = False  # HF's apex switch; zerotrain has no apex
    _optimizer(ds, args, f)
    token_decay = merge_token_budget(ds, args, explicit, f.conflicts)  # the config then sets the LR itself
    uses_ds_scheduler = isinstance(ds.get("scheduler"), dict) or token_decay
    if isinstance(ds.get("scheduler"), dict) and "lr_scheduler_type" in explicit:
        f.conflicts.append(f"scheduler.type={ds['scheduler'].get('type')} vs --lr_scheduler_type "
                           f"{args.lr_scheduler_type} (both choose the schedule; keep one)")
    if isinstance(ds.get("scheduler"), dict):
        ds["scheduler"].setdefault("params", {})
        for key, value in (("warmup_min_lr", 0.0), ("warmup_max_lr", args.learning_rate)):
            f.autos[f"scheduler.params.{key}"] = value
    f.autos.update(model_autos(ds, hidden_size, block_size))
    if f.conflicts or f.problems:  # with every unknown key and bad value of the file: one run names them all
        conflicts = ["the DeepSpeed config disagrees with the options: " + "; ".join(f.conflicts)
                     + ". Make them equal, set the DeepSpeed value to \"auto\", or drop the option"]
        raise collected(conflicts[:bool(f.conflicts)] + f.problems + file_problems(ds))
    ds.setdefault("steps_per_print", None)
    if ds["steps_per_print"] is None:
        del ds["steps_per_print"]
    return BuiltConfig(fill_auto(ds, f.autos, keep_unfilled=True), uses_ds_scheduler, adopted)


def _clipping_left_to_the_config(ds: dict, explicit: set[str]) -> bool:
    """A config whose optimizer params carry max_grad_norm and that has no gradient_clipping is
    refused by load_config, with the fix; the default --max_grad_norm is not written in to hide
    that, so `zerotrain train` answers as `zerotrain config` and initialize do."""
    params = ds.get("optimizer", {}).get("params") if isinstance(ds.get("optimizer"), dict) else None
    return isinstance(params, dict) and "max_grad_norm" in params and "gradient_clipping" not in ds \
        and "max_grad_norm" not in explicit


def _adopt_as(adopt, name: str, kind: type, value) -> None:
    """Adopt the file's value as the option's type; a value of another type is left for
    load_config to name with the file's other problems."""
    try:
        adopt(name, kind(value))
    except (TypeError, ValueError):
        pass


_OPTION_OF = {"train_micro_batch_size_per_gpu": "per_device_train_batch_size",
              "gradient_accumulation_steps": "gradient_accumulation_steps"}


def _batch_triad(ds: dict, args, explicit: set[str], world_size: int, f: _Filler, adopt) -> None:
    """The three batch numbers by DeepSpeed's rules (config/batch.py, the one resolver), fed
    with what the file gives and the options the user set: a number in the file wins over an
    option left at its HF default; "auto" or absent means the option's value if the user set
    it, else the rules derive it. The HF default micro batch fills in only when neither
    train_batch_size nor the micro batch is given. All three are written into `ds`."""
    given: dict[str, int | None] = {}
    source = {key: key for key in TRIAD}  # where each number came from, for the mismatch line
    for key in TRIAD:
        value = ds.get(key, "auto")
        option = _OPTION_OF.get(key)
        if value != "auto":
            if option in explicit and not _same(value, getattr(args, option)):
                f.conflicts.append(f"{key}={json.dumps(value)} vs --{option} {getattr(args, option)}")
            given[key] = value
        elif option in explicit:
            given[key], source[key] = getattr(args, option), option
        else:
            given[key] = None
    tb, mb, ga = (given[key] for key in TRIAD)
    if tb is None and mb is None:
        mb, source[TRIAD[1]] = args.per_device_train_batch_size, "per_device_train_batch_size"
    if f.conflicts or not all(v is None or isinstance(v, int) and not isinstance(v, bool) for v in (tb, mb, ga)):
        return  # named above, or by load_config (the file's value stays)
    try:
        if set(source.values()) == set(TRIAD):  # the file's numbers alone: the resolver's own line
            tb, mb, ga = resolve_batch_sizes(tb, mb, ga, world_size)
        tb, mb, ga = derive_batch_sizes(tb, mb, ga, world_size)
    except ConfigError as err:
        f.problems.append(str(err))
        return
    if tb != mb * ga * world_size:
        f.conflicts.append(f"train_batch_size={tb} vs {source[TRIAD[1]]} {mb} x {source[TRIAD[2]]} {ga} x "
                           f"{world_size} processes = {mb * ga * world_size}")
        return
    for key, value in zip(TRIAD, (tb, mb, ga)):
        ds[key] = value
        option = _OPTION_OF.get(key)
        if option and value != getattr(args, option):
            adopt(option, value)


def _optimizer(ds: dict, args, f: _Filler) -> None:
    block = ds.get("optimizer")
    if block is None:
        params = {"lr": args.learning_rate, "weight_decay": args.weight_decay}
        if args.optim in _ADAM:
            params.update(betas=[args.adam_beta1, args.adam_beta2], eps=args.adam_epsilon)
        if args.optim == "adam":
            params["adam_w_mode"] = False  # plain Adam: weight decay as an L2 term
        ds["optimizer"] = {"type": _OPTIM_TYPES[args.optim], "params": params}
        return
    if not isinstance(block, dict):
        return  # load_config reports the type error
    kind = str(block.get("type", ""))
    if "optim" in f.explicit and kind.lower() != args.optim:
        f.conflicts.append(f"optimizer.type={kind} vs --optim {args.optim}")
    params = block.setdefault("params", {})
    setter = lambda name: (lambda v: _adopt_as(f.adopt, name, float, v))  # noqa: E731
    f.match(params, "lr", "optimizer.params.lr", "learning_rate", args.learning_rate, setter("learning_rate"))
    f.match(params, "weight_decay", "optimizer.params.weight_decay", "weight_decay", args.weight_decay,
            setter("weight_decay"))
    if kind.lower() in _ADAM or "betas" in params or "eps" in params:
        betas = params.get("betas", "auto")
        if betas == "auto":
            f.autos["optimizer.params.betas"] = [args.adam_beta1, args.adam_beta2]
            params.setdefault("betas", "auto")
        elif isinstance(betas, list) and len(betas) == 2:
            for i, name in enumerate(("adam_beta1", "adam_beta2")):
                sub = {"b": betas[i]}
                f.match(sub, "b", f"optimizer.params.betas[{i}]", name, getattr(args, name), setter(name))
                betas[i] = sub["b"] if sub["b"] != "auto" else getattr(args, name)
        f.match(params, "eps", "optimizer.params.eps", "adam_epsilon", args.adam_epsilon, setter("adam_epsilon"))


def fill_schedule(ds: dict, warmup_steps: int, total_steps: int) -> dict:
    """Write the step counts into the scheduler block where it says "auto" (in place). A
    warmup of 0 stays 0: the DeepSpeed schedule then has no warmup."""
    filled = fill_auto(ds, {"scheduler.params.warmup_num_steps": warmup_steps,
                            "scheduler.params.total_num_steps": total_steps}, keep_unfilled=True)
    ds.clear()
    ds.update(filled)
    return ds


def check_no_auto_left(node) -> None:
    check_keys(node)  # a misspelt key is named as one, whatever its value
    left = autos_left(node)
    if left:
        raise ConfigError(f"deepspeed: {unfilled_message(left[0])}")
