"""The pipeline engine: DeepSpeed's `train_batch` / `eval_batch` over torch's schedules.

    train_batch(data_iter)
      read      the ranks of the first and last stage read gradient_accumulation_steps pairs
      features  each micro-batch goes through the features' before_forward (the first stage
                with its inputs, so tokens are counted once; every rank gets the same
                kwargs: curriculum_seqlen, pld_theta), then set_step gives them to the stages
      agree     one all-gather: problems raise everywhere, shapes pick the cached stages
      schedule  torch runs every micro-batch's forward and backward; the loss it
                back-propagates is loss x scale / accumulation x (1 / data-parallel size),
                as Engine.backward scales it
      reduce    the ZeRO strategy reduces over the data dimension and tied weights are summed
                over their stages; at ZeRO 0 under 1F1B or GPipe the buckets go out during the
                last micro-batch's backward, as its gradients become final
      step      Engine.step: the norm over every stage (parallel/norm.py), overflow skip,
                clipping, optimizer, LR schedule, counters, features' events

Only the schedule replaces Engine.forward/backward; the step is the engine's own.
"""

from __future__ import annotations

import time

import torch

from ...features.engine_methods import TrainingEngine, curriculum_seqlen
from ...errors import ConfigError
from ..topology import Grid
from .data import RepeatingLoader, StepData, agree, read_pairs, stack_step
from .stages import StageCache
from .ties import holder_of


class PipelineEngine(TrainingEngine):
    def __init__(self, module, config, comm, strategy, optimizer, lr_scheduler, loss_scaler, compute_dtype,
                 features=(), training_dataloader=None, *, ties, pipe_config):
        super().__init__(module, config, comm, strategy, optimizer, lr_scheduler, loss_scaler, compute_dtype,
                         features=features, training_dataloader=training_dataloader)
        self.mesh = module.mesh
        self.grid = Grid(self.mesh)
        self.ties = ties
        self.pipe_config = pipe_config
        self.num_stages = module.num_stages
        self.stage_id = self.mesh.coord("pipe")
        total = module.num_stages * module.virtual_stages
        self._last_holder = holder_of(total - 1, module.num_stages, module.placement)
        self._holds_first = 0 in module.stage_ids
        self._holds_last = total - 1 in module.stage_ids
        self.checkpoint_prefix = f"pipe_{self.stage_id:02d}-"
        self._raw_losses: list[torch.Tensor] = []
        self._loss_factor = 1.0
        self._armed = False  # the reducer was armed during this step's schedule (_arm)
        self._stages = StageCache(module, pipe_config.schedule, self.mesh.group("pipe"), self.device,
                                  self._pipe_loss, pipe_config.max_cached_shapes)
        self.data_iterator = None
        self._batch_fn = None
        self.stage_busy_s = 0.0  # this rank's compute seconds in the last schedule run,
        self.stage_run_s = 0.0  # of the run's wall seconds: the rest is this stage's bubble

    # ---- DeepSpeed's pipeline-engine API -----------------------------------------------------
    def is_first_stage(self) -> bool:
        return self._holds_first

    def is_last_stage(self) -> bool:
        return self._holds_last

    @property
    def micro_batches(self) -> int:
        return self.gradient_accumulation_steps()

    def set_dataiterator(self, iterator) -> None:
        self.data_iterator = iterator

    def set_dataloader(self, loader) -> None:
        """DeepSpeed's: train_batch() without an iterator reads `loader`, once through."""
        self.training_dataloader = loader
        self.data_iterator = iter(loader)

    def set_batch_fn(self, fn) -> None:
        """fn(item) -> (inputs, labels), applied to each item the data iterator yields."""
        self._batch_fn = fn

    def reset_activation_shape(self) -> None:
        """DeepSpeed scripts call this when the sequence length changes; shapes are handled
        here (stages.py), so there is nothing to reset."""

    def forward(self, *args, **kwargs):
        raise TypeError("a pipeline engine runs whole batches: call engine.train_batch(data_iter) or "
                        "engine.eval_batch(data_iter), not engine(batch)")

    def backward(self, *args, **kwargs):
        raise TypeError("a pipeline engine runs its own backward: call engine.train_batch(data_iter)")

    def step(self, *args, **kwargs):
        raise TypeError("a pipeline engine steps inside engine.train_batch(data_iter)")

    def checkpoint_extras(self) -> dict:
        m = self.module
        return {"pipeline": {"stage_ids": list(m.stage_ids), "num_stages": m.num_stages,
                             "virtual_stages": m.virtual_stages, "placement": m.placement, "parts": list(m.parts),
                             "tied_layers": m.tied_layers()}}

    # ---- the batch ---------------------------------------------------------------------------
    def train_batch(self, data_iter=None) -> torch.Tensor:
        """One optimizer step over gradient_accumulation_steps micro-batches; the mean loss of
        the whole global batch, on every rank."""
        if not torch.is_grad_enabled():
            raise RuntimeError("train_batch() needs gradients enabled; use eval_batch() under torch.no_grad()")
        if self.blocked_calls:
            self.check_runnable("train_batch")
        self.module.train()
        count = self.gradient_accumulation_steps()
        self._armed = False
        losses = self._run(data_iter, count, train=True)
        with self._timers("reduce"):
            # At stage 0 the reducer was armed before the last micro-batch's backward when the
            # schedule allows (_arm), else nothing was reduced during the schedule and begin +
            # end launches every bucket now; end waits for them. At stage 0 the tied copies are
            # summed after that (sums of all-reduced means are the same sums), so a stage that
            # finishes its schedule early reduces at once instead of first waiting for the other
            # holder of a tied layer; at stage 1 only a bucket's owner holds its sum, so ties go first.
            if self.strategy.stage > 0:
                self.ties.reduce_grads()
            if not self._armed:
                self.strategy.begin_backward(True)
            self.strategy.end_backward()
            if self.strategy.stage == 0:
                self.ties.reduce_grads()
        total = float(sum(loss.double() for loss in losses)) if losses else 0.0
        for loss in losses:  # Engine.backward's event, where the losses are known (the last stage)
            for feature in self.features:
                feature.after_backward(self, loss.detach())
        if losses:
            self._window_loss += total
            self._window_micro += count
        self.micro_steps += count - 1
        TrainingEngine.step(self)  # the boundary: norm, overflow, clip, optimizer, schedule, counters
        return self._mean(total, count)

    def eval_batch(self, data_iter, return_logits: bool = False, compute_loss: bool = True,
                   reduce_output: str | None = "avg", bcast_loss: bool = True, num_micro_batches: int | None = None):
        """The mean loss over the micro-batches of every data-parallel rank, on every rank."""
        if return_logits or not compute_loss or reduce_output != "avg" or not bcast_loss:
            raise ConfigError("eval_batch: zerotrain returns the mean loss on every rank; return_logits, "
                              "compute_loss=False, reduce_output other than 'avg' and bcast_loss=False are not supported")
        if self.blocked_calls:
            self.check_runnable("eval_batch")
        count = num_micro_batches or self.gradient_accumulation_steps()
        was_training = self.module.training
        self.module.eval()
        try:
            with torch.no_grad():
                losses = self._run(data_iter, count, train=False)
        finally:
            self.module.train(was_training)
        return self._mean(float(sum(loss.double() for loss in losses)) if losses else 0.0, count)

    def _mean(self, total: float, count: int) -> torch.Tensor:
        summed = torch.tensor([total], dtype=torch.float64)
        self.comm.all_reduce(summed)  # only last-stage ranks hold losses, each tensor rank the same
        return (summed / (count * self.mesh.size("data") * self.mesh.size("tensor"))).float().reshape(())

    def _iterator(self, data_iter):
        if data_iter is not None:
            self.data_iterator = data_iter
        if self.data_iterator is None and self.training_dataloader is not None:
            self.data_iterator = iter(RepeatingLoader(self.training_dataloader))
        it = self.data_iterator
        if it is not None and self._batch_fn is not None:
            fn, source = self._batch_fn, it
            it = (fn(item) for item in source)
        return it

    def _run(self, data_iter, count: int, train: bool) -> list[torch.Tensor]:
        reads = self._holds_first or self._holds_last
        pairs, problem = read_pairs(self._iterator(data_iter), count) if reads else ([], None)
        kwargs: dict = {}
        if train:  # as Engine.forward: features act on training forwards only
            for k in range(count):
                args = pairs[k][0] if self._holds_first and k < len(pairs) else ()
                kw: dict = {}
                for feature in self.features:
                    args, kw = feature.before_forward(self, args, kw)
                kwargs = kw
        cut_to = curriculum_seqlen(self) if train and self.module.cuts_batch else None  # eval: whole
        data = StepData(problem=problem)
        if reads and problem is None:
            data = stack_step(pairs, cut_to, self._holds_first, self._holds_last)
            if self._holds_last and data.problem is None and data.labels is None and self.module.loss_fn is not None:
                data.problem = "the labels are None but the PipelineModule has a loss_fn; yield (inputs, labels)"
        key = agree(self.comm, data, self.mesh, 0, self._last_holder)
        pipeline = self._stages.get(key, count, train)
        self.module.set_step(kwargs, key=self.global_steps)
        self._raw_losses.clear()
        self._loss_factor = self.loss_scale / count * self.strategy.averaging.in_loss if train else 1.0
        target = None
        if self._holds_last:
            target = data.labels if data.labels is not None else torch.zeros(count, device=self.device)
        early = train and self.strategy.stage == 0 and pipeline.last_backward_is_last
        pipeline.before_last_backward(self._arm if early else None)
        busy, start = pipeline.busy_s, time.perf_counter()
        with self._timers("pipeline"):
            pipeline.run(data.inputs, target)
        self.stage_run_s = time.perf_counter() - start
        self.stage_busy_s = pipeline.busy_s - busy
        return self._raw_losses[-count:] if self._holds_last else []

    def _arm(self) -> None:
        """Before this rank's last backward of the step: each bucket is reduced as it completes."""
        self._armed = True
        self.strategy.begin_backward(True)

    def _pipe_loss(self, output, target):
        """The loss torch's schedule back-propagates; the unscaled value is kept for reporting
        (the schedule also calls this once on placeholders when it learns new shapes, which is
        why only the last `count` values are read)."""
        fn = self.module.loss_fn
        loss = output if fn is None else fn(output, target)
        if not torch.is_tensor(loss) or loss.numel() != 1:
            raise TypeError("the last stage must give a scalar loss: pass PipelineModule(loss_fn=...) or end with "
                            "a layer that returns the loss")
        self._raw_losses.append(loss.detach())
        return loss * self._loss_factor if self._loss_factor != 1.0 else loss
