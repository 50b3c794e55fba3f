"""The banner rank 0 prints once the engine is built: what is about to run, in a few lines.

    zerotrain: LlamaForCausalLM, 1.23M parameters (1,792 trained), task sft
      2 processes on 2 nodes | ZeRO stage 3 | offload: optimizer cpu, parameters none | bf16
      batch: 4 per process x 2 accumulation x 2 processes = 16 per step | 300 steps
      model states per process: estimated 1.92 MiB after a step; measured 981.50 KiB (device
        981.50 KiB) now (optimizer state comes with the first step)
      token budget: train_tokens 2,000,000 ends the run; max_steps 3000 is only a cap
      LR by tokens: 5-step warmup, then cosine decay to min_lr 1e-05 over the tokens from the warmup's
        end to lr_decay_tokens 1,800,000

The estimate is zerotrain.estimate_memory for the trained parameters (what `zerotrain
estimate` prints before a job is launched); the measurement is engine.memory_breakdown().
"""

from __future__ import annotations

from ...zero.estimate import OPTIMIZER_BYTES, estimate_memory, human_bytes, total_bytes


def _precision(cfg) -> str:
    return "fp16" if cfg.fp16.enabled else "bf16" if cfg.bf16.enabled else "fp32"


def _offload(zero) -> tuple[str, str]:
    def where(block):
        return getattr(block, "device", "none") if block is not None else "none"

    return where(zero.offload_optimizer), where(zero.offload_param)


def banner(engine, model, task: str, total_steps: int, nodes: int) -> str:
    cfg, comm = engine.config, engine.comm
    seen, total, trained = set(), 0, 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
            trained += p.numel() if p.requires_grad else 0
    stage = cfg.zero_optimization.stage
    opt_off, param_off = _offload(cfg.zero_optimization)
    world = comm.world_size
    measured = engine.memory_breakdown()
    optimizer = str(cfg.optimizer.type).lower() if cfg.optimizer is not None else ""
    try:
        if optimizer not in OPTIMIZER_BYTES:
            raise ValueError(optimizer)
        est = human_bytes(total_bytes(estimate_memory(
            trained, world, stage, dtype=_precision(cfg), optimizer=optimizer, offload_optimizer=opt_off,
            offload_param=param_off, compute_on_host=engine.device.type == "cpu")))
    except ValueError:
        est = "n/a (no estimate for this optimizer)"
    places = ", ".join(f"{place} {human_bytes(total_bytes(measured, place))}" for place in ("device", "host", "nvme")
                       if total_bytes(measured, place))
    procs = f"{world} process{'es' if world > 1 else ''} on {nodes} node{'s' if nodes > 1 else ''}"
    micro, accumulation = cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps
    data = cfg.train_batch_size // (micro * accumulation)  # pipeline stages and tensor ranks share a batch
    readers = f"{world} process{'es' if world > 1 else ''}" if data == world else \
        f"{data} data-parallel rank{'s' if data > 1 else ''}"
    lines = [
        f"zerotrain: {type(model).__name__}, {total / 1e6:.2f}M parameters ({trained:,} trained), task {task}",
        f"  {procs} | ZeRO stage {stage} | offload: optimizer {opt_off}, parameters {param_off} | {_precision(cfg)}",
        f"  batch: {micro} per process x {accumulation} accumulation x {readers} = {cfg.train_batch_size} per step"
        f" | {total_steps} steps",
        f"  model states per process: estimated {est} after a step; measured "
        f"{human_bytes(total_bytes(measured))}{f' ({places})' if places else ''} now (optimizer state comes "
        "with the first step)",
    ]
    lines += token_budget_lines(cfg.token_budget, total_steps)
    return "\n".join(lines)


def token_budget_lines(budget, total_steps: int) -> list[str]:
    """What a token budget changes: the run's end and the LR (none without a budget)."""
    if budget is None or not budget.enabled or (budget.train_tokens is None and budget.lr_decay_tokens is None):
        return []
    lines = []
    if budget.train_tokens is not None:
        lines.append(f"  token budget: train_tokens {budget.train_tokens:,} ends the run; max_steps {total_steps} is "
                     "only a cap")
    if budget.lr_decay_tokens is None:
        lines.append(f"  LR by steps, planned for max_steps {total_steps}: the budget may end the run early in "
                     "the schedule; --lr_decay_tokens sets the LR by tokens")
    else:
        warmup = (f"a warmup over {budget.lr_warmup_tokens:,} tokens" if budget.lr_warmup_tokens
                  else f"a {budget.warmup_steps}-step warmup" if budget.warmup_steps else "no warmup")
        if budget.lr_decay_style == "constant":
            lines.append(f"  LR by tokens: {warmup}, then constant (lr_decay_tokens {budget.lr_decay_tokens:,})")
        else:
            lines.append(f"  LR by tokens: {warmup}, then {budget.lr_decay_style} decay to min_lr {budget.min_lr:g} "
                         f"over the tokens from the warmup's end to lr_decay_tokens {budget.lr_decay_tokens:,}")
    return lines


def stop_line(tokens: int, budget, step: int, max_steps: int) -> str | None:
    """Which of the two ends stopped a run with a token budget: the budget or the step cap."""
    if budget is None or budget.train_tokens is None:
        return None
    if tokens >= budget.train_tokens:
        return (f"zerotrain: stopped at step {step}: the token budget is spent ({tokens:,} tokens trained, "
                f"train_tokens {budget.train_tokens:,}), before max_steps {max_steps}")
    return (f"zerotrain: stopped at step {step}: max_steps {max_steps} reached with {tokens:,} of train_tokens "
            f"{budget.train_tokens:,} trained; raise --max_steps (or num_train_epochs) to train the whole budget")
