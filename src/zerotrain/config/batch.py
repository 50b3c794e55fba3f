"""The batch triad, resolved one way for every door (zerotrain.initialize, `zerotrain config`,
`zerotrain train` / zerotrain.Trainer), by DeepSpeed's rules:

    train_batch_size = micro batch x gradient_accumulation_steps x data-parallel world

    given                      derived
    all three                  nothing: they must agree
    train, micro               accumulation = train // micro // world
    train, accumulation        micro        = train // world // accumulation
    micro, accumulation        train        = micro x accumulation x world
    train only                 accumulation 1, micro = train // world
    micro only                 accumulation 1, train = micro x world
    accumulation only, none    an error: train_batch_size or the micro batch is needed

Integer division, as DeepSpeed's: a derived value that comes out 0 is an error, and so is a
product that misses train_batch_size. The trainer feeds the rules what the DeepSpeed file and
the options the user set say (trainer/ds_config.py); an option left at its HF default only
fills in when neither train_batch_size nor the micro batch is given.
"""

from __future__ import annotations

from ..errors import ConfigError

TRIAD = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


def derive_batch_sizes(tb: int | None, mb: int | None, ga: int | None, world_size: int) -> tuple[int, int, int]:
    """The missing numbers by the table above; each one positive, not yet checked to agree."""
    for name, value in zip(TRIAD, (tb, mb, ga)):
        if value is not None and value <= 0:
            raise ConfigError(f"{name}: should be a positive integer, got {value}")
    ws = world_size
    if tb is None and mb is None:
        raise ConfigError("train_batch_size or train_micro_batch_size_per_gpu is needed; give one of them")
    if tb is not None and mb is not None and ga is None:
        ga = tb // mb // ws
    elif tb is not None and ga is not None and mb is None:
        mb = tb // ws // ga
    elif mb is not None and ga is not None and tb is None:
        tb = mb * ga * ws
    elif mb is None:
        ga, mb = 1, tb // ws
    elif tb is None:
        tb, ga = mb * ws, 1
    if mb <= 0 or ga <= 0:
        name, value = ("train_micro_batch_size_per_gpu", mb) if mb <= 0 else ("gradient_accumulation_steps", ga)
        raise ConfigError(
            f"{name} works out to {value} from train_batch_size {tb}, world size {ws}"
            f" and the other batch settings; raise train_batch_size or set {name} yourself")
    return tb, mb, ga


def resolve_batch_sizes(tb: int | None, mb: int | None, ga: int | None, world_size: int) -> tuple[int, int, int]:
    """(train_batch_size, micro batch, accumulation) for `world_size` data-parallel ranks:
    derived by the table above and checked to agree."""
    tb, mb, ga = derive_batch_sizes(tb, mb, ga, world_size)
    if tb != mb * ga * world_size:
        raise ConfigError(
            f"batch sizes disagree: train_batch_size {tb} != train_micro_batch_size_per_gpu {mb}"
            f" x gradient_accumulation_steps {ga} x world size {world_size} = {mb * ga * world_size}")
    return tb, mb, ga
