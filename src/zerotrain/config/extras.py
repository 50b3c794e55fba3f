"""Top-level DeepSpeed keys for what zerotrain does not build: each accepted with no effect
(named in the notice at initialize) or refused by name with the reason. A feature block that
says `"enabled": false` is accepted whatever it is: the feature is off, as in DeepSpeed.

Also here: keys DeepSpeed itself ignores that real configs carry (`cuda_visible_devices`,
`disable_allgather`, `comms_config`; `monitor_config` beside the monitor blocks), so that they are not mistaken for
typos of the keys they resemble. Keys starting with "_" are comments (the loader strips them).
"""

from __future__ import annotations

from typing import Any

from .base import Block, Float, Int, acts, no_effect, refused
from .monitor import MonitorBlocks


def is_off(value: Any) -> bool:
    """A feature block that is switched off: `"enabled": false` at its top, or every
    `enabled` inside it false (compression_training nests them per technique)."""
    if value is None:
        return True
    if not isinstance(value, dict):
        return False
    if "enabled" in value:
        return value["enabled"] is False
    switches = list(_switches(value))
    return bool(switches) and not any(switches)


def _switches(node: Any):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "enabled":
                yield v is not False
            else:
                yield from _switches(v)


_IGNORED = "DeepSpeed ignores it too"
_OFF = " or set \"enabled\": false"


_NOT_SPLIT = "no model-parallel ranks split the saved inputs; they stay where the block computes"


class ActivationCheckpointingConfig(Block):
    """Settings for zerotrain.checkpointing.checkpoint (helpers/activation_checkpointing.py)."""

    partition_activations: bool = no_effect(False, _NOT_SPLIT)
    cpu_checkpointing: bool = acts(False, "Keep each checkpointed block's inputs in pinned host memory until its "
                                          "backward (inputs already in host memory stay: no change on a CPU).")
    contiguous_memory_optimization: bool = no_effect(False, "torch.utils.checkpoint keeps no buffers of its own")
    number_checkpoints: Int | None = no_effect(None, "torch.utils.checkpoint keeps no buffers of its own")
    synchronize_checkpoint_boundary: bool = acts(False, "Synchronize the accelerator around each checkpointed "
                                                        "forward.")
    profile: bool = acts(False, "Log the time of each checkpointed forward.")


class FlopsProfilerConfig(Block):
    """The profile of one training forward on rank 0 (features/flops_profile.py)."""

    enabled: bool = acts(False, "Profile one training forward: parameters, MACs and FLOPs per module, latency.")
    recompute_fwd_factor: Float = no_effect(0.0, "the counted forward is reported as it ran")
    profile_step: Int = acts(1, "The optimizer step (global_steps) whose first forward is profiled.", ge=0)
    module_depth: Int = acts(-1, "Module depth shown in the profile; -1 shows every depth.", ge=-1)
    top_modules: Int = acts(1, "Modules shown at each depth, the heaviest first.", ge=1)
    detailed: bool = acts(True, "Show the per-module lines, not only the totals.")
    output_file: str | None = acts(None, "Write the profile to this file instead of the log.")


class DeepSpeedExtras(MonitorBlocks):
    # ---- acts through zerotrain.checkpointing, configured by initialize
    activation_checkpointing: ActivationCheckpointingConfig | None = acts(
        None, "Settings of zerotrain.checkpointing.checkpoint (DeepSpeed's activation checkpointing API); "
              "initialize configures it from this block.")
    flops_profiler: FlopsProfilerConfig | None = acts(None, "Profile one training forward on rank 0 (FLOPs, MACs, "
                                                            "latency per module).")
    # ---- accepted, no effect
    aio: Any = no_effect(None, "the NVMe swap does its I/O with its own threads")
    autotuning: Any = no_effect(None, "autotuning is a DeepSpeed launcher feature")
    datastates_ckpt: Any = no_effect(None, "checkpoints are zerotrain's own (manifest, checksums, any world size)")
    nebula: Any = no_effect(None, "checkpoints are zerotrain's own (manifest, checksums, any world size)")
    comms_logger: Any = no_effect(None, "collectives are not logged")
    comms_config: Any = no_effect(None, f"collectives are not logged ({_IGNORED})")
    timers: Any = no_effect(None, "wall_clock_breakdown times the steps")
    memory_breakdown: Any = no_effect(None, "use engine.memory_breakdown() or zerotrain estimate")
    dump_state: Any = no_effect(None, "the engine's state is not dumped at initialize")
    log_level: Any = no_effect(None, "zerotrain logs through the 'zerotrain' logger")
    disable_python_gc: Any = no_effect(None, "Python's garbage collector is left as it is")
    disable_allgather: Any = no_effect(None, _IGNORED)
    cuda_visible_devices: Any = no_effect(None, f"{_IGNORED}; set CUDA_VISIBLE_DEVICES in the environment")
    fp32_allreduce: Any = no_effect(None, f"{_IGNORED} since 0.3")
    vocabulary_size: Any = no_effect(None, "DeepSpeed only warns about it")
    seq_parallel_communication_data_type: Any = no_effect(None, "the sequence all-to-all runs in the training dtype")
    use_data_before_expert_parallelism: Any = no_effect(None, "there are no expert (MoE) layers")
    expert_parallel: Any = no_effect(None, "there are no expert (MoE) layers")
    # ---- refused unless off
    amp: Any = refused(None, "apex AMP is not built; use the fp16 or bf16 block", ok=is_off, fix=_OFF)
    torch_autocast: Any = refused(None, "torch autocast around fp32 weights is not built; use the fp16 or bf16 "
                                        "block", ok=is_off, fix=_OFF)
    compile: Any = refused(None, "torch.compile of the engine (and DeepCompile) is not built; compile the model "
                                 "yourself before initialize", ok=is_off, fix=_OFF)
    sparse_attention: Any = refused(None, "sparse attention changes the model and is not built (DeepSpeed 0.19.8 "
                                          "removed it too)", ok=is_off, fix=_OFF)
    compression_training: Any = refused(None, "compression training (quantization, pruning, layer reduction) "
                                              "changes what is trained and is not built",
                                        ok=is_off, fix=" or switch every technique off")
    quantize_training: Any = refused(None, "quantized training (MoQ) is not built (DeepSpeed 0.19.8 removed it "
                                           "too)", ok=is_off, fix=_OFF)
    weight_quantization: Any = refused(None, "weight quantization is an inference feature and is not built",
                                       ok=is_off)
    eigenvalue: Any = refused(None, "eigenvalue-based quantization is not built (DeepSpeed 0.19.8 removed it "
                                    "too)", ok=is_off, fix=_OFF)
    elasticity: Any = refused(None, "elastic batch sizes are not built (DeepSpeed 0.19.8 removed them too); set "
                                    "the batch sizes directly", ok=is_off, fix=_OFF)
    hybrid_engine: Any = refused(None, "the RLHF hybrid (generation) engine is not built", ok=is_off, fix=_OFF)
    graph_harvesting: Any = refused(None, "graph harvesting is not built (DeepSpeed 0.19.8 removed it too)",
                                    ok=lambda v: v in (None, False))
    sparse_gradients: Any = refused(None, "sparse gradients are not built: the engine's gradients are dense",
                                    ok=lambda v: v in (None, False))
    managed_gradient_accumulation: Any = refused(None, "the engine always divides the loss by "
                                                       "gradient_accumulation_steps", ok=lambda v: v in (None, True))
    communication_data_type: Any = refused(None, "gradients are reduced in the training dtype; a different "
                                                 "communication dtype is not built", ok=lambda v: True)
