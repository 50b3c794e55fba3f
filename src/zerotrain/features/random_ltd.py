"""Random-LTD in the engine: the schedule moved each training forward, the layers routed, the
counters kept and saved (data_efficiency/random_ltd.py has the maths, routing.py the hooks).

    initialize   routes the layers named by random_ltd_layer_id: those of the class given to
                 convert_to_random_ltd(model, LayerClass) before initialize, else zerotrain's
                 GPT / BERT blocks or an HF model's block list, found by themselves; other
                 models call convert_to_random_ltd(engine, LayerClass) after initialize
    forward      update_seq(global_steps) as DeepSpeed's engine does (training forwards only),
                 then tells the routed layers the step and the micro-batch within it; counts
                 this micro-batch's `layer_tokens` (batch x Megatron-DeepSpeed's layer-averaged
                 length), summed over the data-parallel ranks at the step
    checkpoint   the scheduler's state (DeepSpeed's `random_ltd` entry: consumed_layer_tokens,
                 current value and step) and layer_tokens

Through the pipeline engine every stage routes the layers it holds, counting ids over the
whole pipeline (PipelineModule.layers_of_class), and keys the kept tokens by the micro-batch
its torch schedule is running (module.micro_batch), so 2 stages keep what 1 process keeps
with no message between them. Evaluation forwards (module.eval()) see every token. Layers
keep their tokens by a key of the batch-reading rank (engine.batch_comm), not the global one:
tensor ranks that share a batch keep the same.
"""

from __future__ import annotations

import logging

import torch

from ..data_efficiency.random_ltd import RandomLTDScheduler, layer_averaged_length
from ..data_efficiency.routing import (WHERE, TokenRouter, check_ids, hf_blocks, layers_of_class, route, routed,
                                       zerotrain_blocks)
from ..engine.hooks import EngineFeature
from ..errors import ConfigError, ModelInterfaceError
from .batch import find_sequence

log = logging.getLogger("zerotrain")


class RandomLTDFeature(EngineFeature):
    name = "random_ltd"

    def __init__(self, block, seed: int, global_batch_size: int, micro_batch_size: int):
        self.block = block
        self.scheduler = RandomLTDScheduler({**block.model_dump(), "global_batch_size": global_batch_size,
                                             "micro_batch_size": micro_batch_size})
        self.router = TokenRouter(self.scheduler, seed, block.hidden_state_order == "batch_seq_dim")
        self.ids = sorted(block.random_ltd_layer_id)
        self.layers: list[str] = []  # this rank's routed layers
        self.pipeline = False  # routed through the pipeline engine (_route_pipeline)
        self.layer_tokens = 0  # all ranks, all steps so far
        self._pending = 0  # this rank, since the last step

    def describe(self) -> str:
        s = self.scheduler.state
        return (f"random-LTD ({len(self.ids)} of {self.scheduler.model_layer_num} layers keep {s['min_value']} -> "
                f"{s['max_value']} tokens over {s['schedule_config']['require_steps']} steps)")

    # ---- the layers -----------------------------------------------------------------------------
    def on_train_start(self, engine) -> None:
        from ..parallel.pipeline.module import PipelineModule
        from ..parallel.sequence.setup import SequenceParallelEngine

        if isinstance(engine, SequenceParallelEngine):
            raise ConfigError(f"{WHERE}.enabled: random-LTD drops tokens of whole sequences and does not run with "
                              "sequence parallelism; set it false or train without sequence_parallel_size")
        data = engine.batch_comm or engine.comm  # the ranks that read different batches
        self.router.rank, self.router.world = data.rank, data.world_size
        module = engine.module
        cls = module.__dict__.get("_random_ltd_class")
        if isinstance(module, PipelineModule):
            self._route_pipeline(module, cls)
        elif cls is not None:
            self.convert(module, cls)
        elif blocks := zerotrain_blocks(module):
            self._check_known(blocks)
            self._route(module, blocks, "zerotrain blocks", mask_name="mask")
        elif blocks := hf_blocks(module):
            self._check_known(blocks)
            self._route(module, blocks, "blocks", mask_name="attention_mask")
        if engine.comm.rank == 0:
            where = ", ".join(self.layers) if self.layers else "no layer yet: call convert_to_random_ltd(engine, " \
                                                                "LayerClass)"
            log.info("%s on %s", self.describe(), where)

    def _route_pipeline(self, module, cls) -> None:
        """Every stage lists the layers of the whole pipeline (ids count over all its stages)
        and routes those it holds; a stage draws the kept tokens of its layers by itself, from
        the same key as one process would, with the micro-batch its schedule runs."""
        from ..models.block import PreLNBlock

        candidates = module.layers_of_class(cls or PreLNBlock)
        if cls is None and not candidates:
            raise ModelInterfaceError(
                f"{WHERE}: the PipelineModule has no zerotrain blocks (PreLNBlock) to route; call "
                "zerotrain.data_efficiency.convert_to_random_ltd(pipeline_module, LayerClass) before initialize with "
                "the class of its transformer layers")
        held = [(n, m) for n, m in candidates if m is not None]
        if cls is None and held:
            self._check_known(held)
        self.pipeline = True
        self.router.micro_source = module
        self._route(module, candidates, f"{(cls or PreLNBlock).__name__} layers",
                    mask_name=self.block.model_mask_name if cls is not None else "mask")

    def convert(self, module, layer_class) -> None:
        self._route(module, layers_of_class(module, layer_class), f"{layer_class.__name__} layers",
                    mask_name=self.block.model_mask_name)

    def _route(self, module, candidates, what: str, mask_name: str | None) -> None:
        check_ids(module, candidates, self.ids, what)
        if len(candidates) != self.scheduler.model_layer_num:
            raise ModelInterfaceError(
                f"{WHERE}.total_layer_num: {self.scheduler.model_layer_num}, but {type(module).__name__} has "
                f"{len(candidates)} {what}; set it to {len(candidates)} (it weighs consumed_layer_tokens)")
        self.layers = route(module, candidates, self.ids, self.router, mask_name, what)

    def _check_known(self, blocks) -> None:
        """Layers found by themselves take [batch, seq, hidden]; zerotrain's say if they are causal."""
        if self.block.hidden_state_order != "batch_seq_dim":
            raise ConfigError(f"{WHERE}.hidden_state_order: {self.block.hidden_state_order!r}, but the layers of "
                              f"{type(blocks[0][1]).__name__} take [batch, seq, hidden]; set batch_seq_dim")
        if not all(hasattr(m, "causal") for _, m in blocks):
            return
        causal = {bool(m.causal) for _, m in blocks}
        want = {"decoder": True, "encoder": False}[self.block.model_type]
        if causal != {want}:
            kind = "causal (decoder)" if True in causal else "bidirectional (encoder)"
            raise ConfigError(f"{WHERE}.model_type: {self.block.model_type!r}, but the model's blocks are {kind}; "
                              f"set it to {'decoder' if True in causal else 'encoder'}")

    # ---- the step -------------------------------------------------------------------------------
    def before_forward(self, engine, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if not self.layers and not self.pipeline:  # a pipeline stage may hold no routed layer
            self.layers = [n for n, _ in routed(engine.module)]
            if not self.layers:
                raise ModelInterfaceError(
                    f"random-LTD is enabled but no layer of {type(engine.module).__name__} is routed: call "
                    "zerotrain.data_efficiency.convert_to_random_ltd(engine, LayerClass) with the class of its "
                    "transformer layers, or disable data_routing.random_ltd")
        self.scheduler.update_seq(engine.global_steps)
        router = self.router
        router.step = engine.global_steps
        router.micro_in_step = engine.micro_steps % engine.gradient_accumulation_steps()
        router.dealing = engine.sample_dealing
        seq = find_sequence(args, kwargs)
        if seq is not None and seq.dim() >= 2 and not engine.input_replica:
            length = seq.shape[1]
            cut = kwargs.get("curriculum_seqlen")
            length = min(length, cut) if isinstance(cut, int) else length
            self._pending += int(seq.shape[0]) * layer_averaged_length(
                length, self.scheduler.get_current_seq(), len(self.ids), self.scheduler.model_layer_num)
        return args, kwargs

    def after_step(self, engine) -> None:
        total = torch.tensor([float(self._pending)], dtype=torch.float64)
        engine.comm.all_reduce(total)
        self._pending = 0
        self.layer_tokens += int(total.item())

    def log_fields(self, engine) -> dict:
        return {"layer_tokens": self.layer_tokens, "ltd_seq": self.scheduler.get_current_seq()}

    def state_dict(self) -> dict:
        return {**self.scheduler.state_dict(), "layer_tokens": self.layer_tokens}

    def load_state_dict(self, state: dict) -> None:
        self.scheduler.load_state_dict(state)
        self.layer_tokens = state.get("layer_tokens", 0)
