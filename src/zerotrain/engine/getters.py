"""DeepSpeed's engine getters over the typed config, for scripts that branch on them
(`if engine.bfloat16_enabled(): inputs = inputs.to(torch.bfloat16)`, as DeepSpeedExamples'
CIFAR script does). Each reads the config value in force; none changes anything."""

from __future__ import annotations


class ConfigGetters:
    """Mixed into the engine `initialize` returns; `self.config` is the validated config."""

    def fp16_enabled(self) -> bool:
        return bool(self.config.fp16.enabled)

    def bfloat16_enabled(self) -> bool:
        return bool(self.config.bf16.enabled)

    def zero_optimization(self) -> bool:
        return self.zero_optimization_stage() > 0

    def zero_optimization_stage(self) -> int:
        return int(self.config.zero_optimization.stage)

    def zero_offload_optimizer(self):
        """The offload_optimizer block (None when the config has none)."""
        return self.config.zero_optimization.offload_optimizer

    def zero_offload_param(self):
        """The offload_param block (None when the config has none)."""
        return self.config.zero_optimization.offload_param

    def zero_use_cpu_optimizer(self) -> bool:
        """True when the optimizer steps in host memory (offload_optimizer device cpu or nvme)."""
        block = self.zero_offload_optimizer()
        return block is not None and block.device in ("cpu", "nvme")

    def gradient_clipping(self) -> float:
        return float(self.config.gradient_clipping)
