"""The `"tensor_parallel"` block: DeepSpeed's AutoTP training keys.

DeepSpeed 0.19 splits an HF model's linear layers across `autotp_size` ranks (AutoTP) at
ZeRO 0-2. zerotrain does the same on torch's DTensor (parallel/tensor/plan.py): the model's
own `base_model_tp_plan` (or zerotrain's for its GPT and BERT) says which projections are
split colwise and which rowwise. The other keys either do nothing here (named in the notice)
or would change the split in a way that is not built (refused by name).
`vocab_parallel_lm_head` acts: zerotrain splits the embedding and head by the vocabulary
wherever it divides (DeepSpeed only for a tied head), true requires it, false turns it off.
"""

from __future__ import annotations

from typing import Any

from pydantic import AliasChoices

from ...config.base import Block, Int, acts, no_effect, refused

NO_EFFECT = {
    "dtype": "the fp16/bf16 blocks set the training dtype",
    "tp_overlap_comm": "DTensor's collectives run where each split layer needs them",
    "tensor_parallel": "inference settings (deepspeed.init_inference); autotp_size sets the training split",
    "keep_module_on_host": "the model is split where it was built, then moved to the device",
    "preset_model": "the split is read from the model itself (its base_model_tp_plan, or zerotrain's plan for its "
                    "GPT and BERT); a preset names the same split",
}


class TensorParallelConfig(Block):
    enabled: bool = acts(True, "false: the block is off (as any DeepSpeed block that says only \"enabled\": false)",
                         ours="true (zerotrain's own key)")
    autotp_size: Int = acts(0, "Tensor-parallel ranks the model's projections are split across; 0 or 1: no split.",
                            ge=0)
    dtype: Any = no_effect(None, NO_EFFECT["dtype"])
    tp_overlap_comm: bool = no_effect(False, NO_EFFECT["tp_overlap_comm"])
    tensor_parallel: Any = no_effect(None, NO_EFFECT["tensor_parallel"],
                                     validation_alias=AliasChoices("tensor_parallel", "tp"))
    keep_module_on_host: bool = no_effect(False, NO_EFFECT["keep_module_on_host"])
    vocab_parallel_ce_backend: Any = refused("torch", "the vocabulary-split loss is torch's loss_parallel; the liger "
                                                      "backend is not built", ok=lambda v: v in (None, "torch"),
                                             fix=" or set it to \"torch\"")
    preset_model: Any = no_effect(None, NO_EFFECT["preset_model"])
    vocab_parallel_lm_head: bool | None = acts(
        None, "Split the token embedding and LM head by the vocabulary (the loss on sharded logits, never gathered): "
              "null splits them where the vocabulary divides by autotp_size, true requires it, false keeps them "
              "whole.", ours="null: split wherever it divides (DeepSpeed: only a tied head with HF's "
                             "embedding_rowwise plan)")
    injection_policy_tuple: Any = refused(None, "custom injection policies are not built: the model's "
                                                "base_model_tp_plan (or zerotrain's own plan) decides the split")
    partition_config: Any = refused(None, "custom partition rules are not built: the model's base_model_tp_plan "
                                          "(or zerotrain's own plan) decides the split")
    replace_with_kernel_inject: bool = refused(False, "kernel injection is an inference feature and is not built",
                                               validation_alias=AliasChoices("replace_with_kernel_inject",
                                                                             "kernel_inject"))

    @property
    def size(self) -> int:
        """The tensor-parallel size in force (1 when off)."""
        return max(1, self.autotp_size) if self.enabled else 1
