"""`zerotrain train`'s token options and the DeepSpeed config's `token_budget` block: one budget.

    --train_tokens, --lr_decay_tokens,      ->  token_budget.<same name>   (a key the config
    --lr_warmup_tokens, --min_lr,                                           gives must agree with
    --lr_decay_style                                                        an option the user set)
    --warmup_steps N (with token decay)     ->  token_budget.warmup_steps

With `lr_decay_tokens` (from either source) the engine's token-budget feature sets the LR
(features/token_budget.py) and the trainer builds no LR scheduler: one LR, never two. What
does not fit a token schedule is one line naming what does: `--warmup_ratio` and a fractional
`--warmup_steps` (fractions of max_steps, which is only a cap then) and an explicit
`--lr_scheduler_type`.
"""

from __future__ import annotations

from ..errors import ConfigError

OPTIONS = ("train_tokens", "lr_decay_tokens", "lr_warmup_tokens", "min_lr", "lr_decay_style")
_NEED_DECAY = ("lr_warmup_tokens", "min_lr", "lr_decay_style")
_STYLES = "--lr_decay_style (linear, cosine, constant, inverse-square-root)"


def _same(a, b) -> bool:
    if isinstance(a, str) or isinstance(b, str):
        return str(a) == str(b)
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return False


def merge_token_budget(ds: dict, args, explicit: set[str], conflicts: list[str]) -> bool:
    """Write the token options into `ds["token_budget"]` (in place) and check them against the
    LR options; True when token decay drives the LR. Disagreements go to `conflicts`."""
    given = {name: getattr(args, name) for name in OPTIONS if getattr(args, name, None) is not None}
    block = ds.get("token_budget")
    if given and block is None:
        block = ds["token_budget"] = {}
    if not isinstance(block, dict):
        return False  # absent, or a wrong type that load_config names
    if given and block.get("enabled", True) is False:
        conflicts.append(f"token_budget.enabled=false vs --{next(iter(given))} {next(iter(given.values()))}")
        return False
    for name, value in given.items():
        if block.get(name, "auto") == "auto":
            block[name] = value
        elif not _same(block[name], value):
            conflicts.append(f"token_budget.{name}={block[name]} vs --{name} {value}")
    decays = block.get("enabled", True) is not False and block.get("lr_decay_tokens") is not None
    if not decays:
        for name in _NEED_DECAY:
            if name in given:
                raise ConfigError(f"{name} is for the token-based LR: add --lr_decay_tokens N (an HF schedule "
                                  "takes its floor as lr_scheduler_kwargs {\"min_lr\": ...})" if name == "min_lr"
                                  else f"{name} is for the token-based LR: add --lr_decay_tokens N")
        return False
    check_lr_options(args, explicit)
    if block.get("warmup_steps") == "auto":
        block["warmup_steps"] = int(args.warmup_steps)  # "auto": the option's, 0 when not given
    elif args.warmup_steps >= 1:
        steps = int(args.warmup_steps)
        if "warmup_steps" not in block:
            block["warmup_steps"] = steps
        elif not _same(block["warmup_steps"], steps) and "warmup_steps" in explicit:
            conflicts.append(f"token_budget.warmup_steps={block['warmup_steps']} vs --warmup_steps {steps}")
    return True


def check_lr_options(args, explicit: set[str]) -> None:
    """The HF LR options that cannot describe a token schedule, each refused in one line."""
    if "lr_scheduler_type" in explicit:
        raise ConfigError(f"lr_scheduler_type {args.lr_scheduler_type} and lr_decay_tokens both choose the LR "
                          f"schedule; with token-based decay give its shape as {_STYLES}")
    if args.warmup_ratio > 0:
        raise ConfigError(f"warmup_ratio {args.warmup_ratio:g} is a fraction of max_steps, which with "
                          "lr_decay_tokens is only a cap; give the warmup in steps (--warmup_steps N) or in tokens "
                          "(--lr_warmup_tokens N)")
    if 0 < args.warmup_steps < 1:
        raise ConfigError(f"warmup_steps {args.warmup_steps:g} is a fraction of max_steps, which with "
                          "lr_decay_tokens is only a cap; give the warmup in steps (--warmup_steps N) or in tokens "
                          "(--lr_warmup_tokens N)")
    if args.warmup_steps != int(args.warmup_steps):
        raise ConfigError(f"warmup_steps {args.warmup_steps:g}: with lr_decay_tokens give a whole number of steps")
