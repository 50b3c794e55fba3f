"""The banner rank 0 prints once the engine is built: what is about to run, in a few lines.

    zerotrain: LlamaForCausalLM, 1.23M parameters (1,792 trained), task sft
      2 processes on 2 nodes | ZeRO stage 3 | offload: optimizer cpu, parameters none | bf16
      batch: 4 per process x 2 accumulation x 2 processes = 16 per step | 300 steps
      model states per process: estimated 1.92 MiB after a step; measured 981.50 KiB (device
        981.50 KiB) now (optimizer state comes with the first step)

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
    return "\n".join(lines)
