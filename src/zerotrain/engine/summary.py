"""What is about to run, in a few lines: what initialize logs on rank 0 and the trainer's banner
prints (with the task and step count it knows).

    zerotrain: LlamaForCausalLM, 1.23M parameters (1,792 trained), task sft
      2 processes on 2 nodes | ZeRO stage 3 | offload: optimizer cpu, parameters none | bf16
        (| sequence parallel 2 (Ulysses: ...), when sequence_parallel_size is above 1)
      batch: 4 per process x 2 accumulation x 2 processes = 16 per step | 300 steps
      optimizer AdamW (lr 0.0001) | schedule WarmupLR | gradient clipping 1.0
      features: none
      model states per process: estimated 1.92 MiB after a step; measured 981.50 KiB (device
        981.50 KiB) now (optimizer state comes with the first step)
        (trained weights, their gradients, fp32 masters and optimizer state; not activations, nor
        the 2.46 MiB of frozen weights)
      config keys accepted with no effect in zerotrain (...): comms_logger

The estimate is zerotrain.estimate_memory for the trained parameters (what `zerotrain
estimate` prints before a job is launched), with the fp32 gradient accumulator the engine keeps
when fp16/bf16 micro-steps accumulate; the measurement is engine.memory_breakdown(). Both
count what the ZeRO strategy holds for the trained parameters; frozen weights (a LoRA base
model) are said beside them.
"""

from __future__ import annotations

import contextlib

import torch

from ..config.report import notice
from ..zero.estimate import OPTIMIZER_BYTES, estimate_memory, human_bytes, total_bytes

_told_elsewhere = False


@contextlib.contextmanager
def told_elsewhere():
    """Inside: initialize logs no summary (a caller that prints its own, the trainer's banner)."""
    global _told_elsewhere
    before, _told_elsewhere = _told_elsewhere, True
    try:
        yield
    finally:
        _told_elsewhere = before


def should_log() -> bool:
    return not _told_elsewhere


def _precision(cfg) -> str:
    return "fp16" if cfg.fp16.enabled else "bf16" if cfg.bf16.enabled else "fp32"


def _offload(zero) -> tuple[str, str]:
    def where(block):
        return getattr(block, "device", "none") if block is not None else "none"

    return where(zero.offload_optimizer), where(zero.offload_param)


def _plural(n: int, word: str, suffix: str = "s") -> str:
    return f"{n} {word}{suffix if n != 1 else ''}"


def _accumulation(engine) -> str:
    """"fp32" where micro-steps accumulate in a wider copy than the compute dtype, as initialize
    built the strategy (data_types.grad_accum_dtype, fp32 unless set, once there is more than
    one micro-step a step; never under a pipeline, whose schedule accumulates in .grad)."""
    strategy = engine.strategy
    wide = strategy.accumulation_dtype == torch.float32 and strategy.compute_dtype != torch.float32
    return "fp32" if wide else "compute"


def _estimate(engine, cfg, trained: int, world: int, opt_off: str, param_off: str) -> str:
    optimizer = str(cfg.optimizer.type).lower() if cfg.optimizer is not None else ""
    if optimizer not in OPTIMIZER_BYTES:
        return "n/a (no estimate for this optimizer)"
    try:
        return human_bytes(total_bytes(estimate_memory(
            trained, world, cfg.zero_optimization.stage, dtype=_precision(cfg), optimizer=optimizer,
            offload_optimizer=opt_off, offload_param=param_off, compute_on_host=engine.device.type == "cpu",
            accumulation=_accumulation(engine))))
    except ValueError:
        return "n/a (no estimate for this optimizer)"


def _training(engine, cfg) -> str:
    opt, sched = engine.optimizer, engine.lr_scheduler
    # the LR the schedule rises to or starts from (DeepSpeed's schedules: max_lrs / org_lrs;
    # torch's: base_lrs), not where a warmup begins
    # dynamic batching wraps the schedule and scales each step's LR by its size: the configured
    # LR is the wrapped schedule's, or the unscaled one the wrapper keeps
    base = getattr(sched, "base_lr_scheduler", sched)
    peak = next((getattr(base, name) for name in ("max_lrs", "org_lrs", "base_lrs")
                 if isinstance(getattr(base, name, None), list)), None) or getattr(sched, "unscaled", None)
    lrs = sorted(set(map(float, peak))) if peak else sorted({float(g["lr"]) for g in opt.param_groups}) if opt else []
    lr = f" (lr {', '.join(f'{x:g}' for x in lrs)})" if lrs else ""
    optimizer = f"optimizer {type(opt).__name__}{lr}" if opt is not None else "no optimizer"
    schedule = f"schedule {type(sched).__name__}" if sched is not None else "constant LR"
    return f"  {optimizer} | {schedule} | gradient clipping {cfg.gradient_clipping:g}"


def render(engine, model=None, task: str | None = None, total_steps: int | None = None,
           nodes: int | None = None, notices: bool = True) -> str:
    """The lines for `engine`; `notices` adds the config keys that have no effect (a caller
    that has shown them already leaves them out)."""
    cfg, comm = engine.config, engine.comm
    model = engine.module if model is None else model
    seen, total, trained, frozen_bytes = set(), 0, 0, 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
            trained += p.numel() if p.requires_grad else 0
            frozen_bytes += 0 if p.requires_grad else p.numel() * p.element_size()
    world = comm.world_size
    if nodes is None:
        nodes = max(1, world // (comm.state.local_world_size or world))
    opt_off, param_off = _offload(cfg.zero_optimization)
    measured = engine.memory_breakdown()
    places = ", ".join(f"{place} {human_bytes(total_bytes(measured, place))}" for place in ("device", "host", "nvme")
                       if total_bytes(measured, place))
    micro, accumulation = cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps
    data = cfg.train_batch_size // (micro * accumulation)  # pipeline stages and tensor ranks share a batch
    readers = _plural(world, "process", "es") if data == world else _plural(data, "data-parallel rank")
    features = ", ".join(f.describe() if hasattr(f, "describe") else getattr(f, "name", type(f).__name__)
                         for f in engine.features) or "none"
    sequence = engine.sequence_multiple
    split = (f" | sequence parallel {sequence} (Ulysses: each rank 1/{sequence} of every sequence, padded to a "
             f"multiple of {sequence})") if sequence > 1 else ""
    lines = [
        f"zerotrain: {type(model).__name__}, {total / 1e6:.2f}M parameters ({trained:,} trained)"
        + (f", task {task}" if task else ""),
        f"  {_plural(world, 'process', 'es')} on {_plural(nodes, 'node')} | ZeRO stage {cfg.zero_optimization.stage}"
        f" | offload: optimizer {opt_off}, parameters {param_off} | {_precision(cfg)}{split}",
        f"  batch: {micro} per process x {accumulation} accumulation x {readers} = {cfg.train_batch_size} per step"
        + (f" | {total_steps} steps" if total_steps is not None else ""),
        _training(engine, cfg),
        f"  features: {features}",
        f"  model states per process: estimated {_estimate(engine, cfg, trained, world, opt_off, param_off)} after a "
        f"step; measured {human_bytes(total_bytes(measured))}{f' ({places})' if places else ''} now (optimizer state "
        "comes with the first step)",
        "    (trained weights, their gradients, fp32 masters and optimizer state; not activations"
        + (f", nor the {human_bytes(frozen_bytes)} of frozen weights)" if frozen_bytes else ")"),
    ]
    if notices and (line := notice(cfg)):
        lines.append(f"  {line}")
    return "\n".join(lines)
