"""The training engine: forward, backward, step, with DeepSpeed's loop and counters.

    loss = engine(batch)          features may add kwargs or cut the batch (training only)
    engine.backward(loss)         loss x scale / accumulation; buckets reduce during backward
    engine.step()                 at the accumulation boundary: norm, overflow check, clip,
                                  optimizer step, LR schedule, counters

What is sharded and how gradients travel is the strategy's business (zero/strategy.py holds
the contract every stage meets); the engine only sequences it. Features attach through the events of
hooks.py, so this file never names one.
"""

from __future__ import annotations

import logging
import math
import time

import torch

from ..errors import NonFiniteStepsError
from .hooks import EngineFeature
from .timers import Timers

log = logging.getLogger("zerotrain")


class Engine(torch.nn.Module):
    # ranks that hold different parameters (pipeline stages) name their checkpoint files apart
    checkpoint_prefix = ""
    # True on a rank whose batches are copies of another rank's (tensor-parallel ranks > 0):
    # what is counted per batch (tokens) is counted there, not again here
    input_replica = False
    # the Comm over the ranks that read different batches (set by initialize): sequence ranks,
    # like tensor ranks, share their data index's batches, so an evaluation splits its samples
    # over these ranks, not over ZeRO's
    batch_comm = None
    # every sequence length a forward runs at is padded to a multiple of this (sequence
    # parallelism: S); a feature that picks lengths (the seqlen curriculum) rounds to it
    sequence_multiple = 1
    # how the loader deals a step's global batch to the data-parallel ranks ("interleaved": rank r
    # gets samples r, r + N, ...; "blocked": each global micro-batch in rank-sized blocks), for
    # whatever must name a sample the same way at any world size (a per-sample random key)
    sample_dealing = "interleaved"

    def __init__(self, module: torch.nn.Module, config, comm, strategy, optimizer, lr_scheduler,
                 loss_scaler, compute_dtype: torch.dtype, features: list[EngineFeature] = (),
                 training_dataloader=None):
        super().__init__()
        self.module = module
        self.config = config
        self.comm = comm
        self.strategy = strategy
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.loss_scaler = loss_scaler
        self.compute_dtype = compute_dtype
        self.features = list(features)
        # callables (args, kwargs) shown each training forward's inputs as the model trains on
        # them (after the features, before any sequence-parallel cut): the trainer counts tokens
        self.input_observers: list = []
        self.training_dataloader = training_dataloader
        self.global_steps = 0
        self.global_samples = 0
        self.skipped_steps = 0
        self.micro_steps = 0
        self._grad_norm: float | None = None
        self._timers = Timers(config.wall_clock_breakdown, comm.state.device)
        self._skip_nonfinite = not (config.bf16.enabled and not config.bf16.check_grad_overflow)
        # The summed loss since the last progress line stays on the loss's device, so a
        # micro-step never waits for the device; the host reads it only when it logs.
        self._window_loss = torch.zeros((), dtype=torch.float64)
        self._window_micro = 0
        self._window_start = time.perf_counter()
        self._window_samples = 0
        self._window_overflows = 0
        self._last_overflow_log = -(10**9)
        self._consecutive_skips = 0
        # calls that cannot run now, each with the one line that says why and how to go on (set
        # by whatever takes states off their device: engine.offload_states); empty while training
        # can run, so forward, backward and step pay one truth test
        self.blocked_calls: dict[str, str] = {}

    # ---- DeepSpeed-style accessors -------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.comm.state.device

    @property
    def local_rank(self) -> int:
        return self.comm.state.local_rank

    @property
    def global_rank(self) -> int:
        return self.comm.rank

    @property
    def world_size(self) -> int:
        return self.comm.world_size

    def train_batch_size(self) -> int:
        return self.config.train_batch_size

    def train_micro_batch_size_per_gpu(self) -> int:
        return self.config.train_micro_batch_size_per_gpu

    def gradient_accumulation_steps(self) -> int:
        return self.config.gradient_accumulation_steps

    def is_gradient_accumulation_boundary(self) -> bool:
        return (self.micro_steps + 1) % self.gradient_accumulation_steps() == 0

    def get_lr(self) -> list[float]:
        return [float(g["lr"]) for g in self.optimizer.param_groups] if self.optimizer else []

    def get_global_grad_norm(self) -> float | None:
        return self._grad_norm

    @property
    def loss_scale(self) -> float:
        return self.loss_scaler.loss_scale if self.loss_scaler else 1.0

    def __getattr__(self, name: str):
        """What the engine lacks, the wrapped model may have: `engine.generate(...)`, custom
        methods and attributes (as DeepSpeed's engine, and HF/accelerate through it, expect)."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            module = self.__dict__.get("_modules", {}).get("module")
            if module is None or name.startswith("__"):
                raise
        try:
            return getattr(module, name)
        except AttributeError:
            raise AttributeError(f"neither the engine nor its {type(module).__name__} has an attribute "
                                 f"{name!r}") from None

    def train(self, mode: bool = True):
        self.module.train(mode)
        return self

    def eval(self):
        return self.train(False)

    # ---- the features (found by their type, so this file names none) ---------------------
    def feature(self, kind: type):
        """The engine's feature that is a `kind` (an EngineFeature subclass), else None."""
        return next((f for f in self.features if isinstance(f, kind)), None)

    def should_stop(self) -> bool:
        """True once any feature says training is done (a budget is spent, say)."""
        return any(feature.should_stop(self) for feature in self.features)

    # ---- the loop ------------------------------------------------------------------------
    def check_runnable(self, call: str) -> None:
        """Raise the line blocked_calls holds for `call`, if any."""
        if call in self.blocked_calls:
            raise RuntimeError(self.blocked_calls[call])

    def forward(self, *args, **kwargs):
        if self.blocked_calls:
            self.check_runnable("forward")
        if self.module.training:
            for feature in self.features:
                args, kwargs = feature.before_forward(self, args, kwargs)
            for observe in self.input_observers:
                observe(args, kwargs)
        self.strategy.check_attached()
        self.strategy.begin_forward()
        with self._timers("forward"):
            return self.call_module(*args, **kwargs)

    def call_module(self, *args, **kwargs):
        """The model on this rank's inputs (a sequence-parallel engine cuts them first)."""
        return self.module(*args, **kwargs)

    def backward(self, loss: torch.Tensor, retain_graph: bool = False) -> torch.Tensor:
        if not torch.is_tensor(loss) or loss.numel() != 1:
            raise TypeError("engine.backward expects the scalar loss tensor returned by the model")
        if self.blocked_calls:
            self.check_runnable("backward")
        self.strategy.begin_backward(self.is_gradient_accumulation_boundary())
        scale = self.loss_scale / self.gradient_accumulation_steps() * self.strategy.averaging.in_loss
        with self._timers("backward"):
            (loss * scale if scale != 1.0 else loss).backward(retain_graph=retain_graph)
            self.strategy.end_backward()
        self._add_to_window(loss.detach())
        self._window_micro += 1
        for feature in self.features:
            feature.after_backward(self, loss.detach())
        return loss

    def step(self, lr_kwargs: dict | None = None) -> None:
        if self.blocked_calls:
            self.check_runnable("step")
        boundary = self.is_gradient_accumulation_boundary()
        if boundary:
            if self.optimizer is None:
                raise RuntimeError("engine.step() needs an optimizer: add an \"optimizer\" block to "
                                   "the config or pass optimizer= to zerotrain.initialize")
            with self._timers("step"):
                self._boundary_step(lr_kwargs or {})
        self.micro_steps += 1
        if boundary:
            self._check_skip_limit()  # after the counters, so a checkpoint saved now resumes cleanly

    def _add_to_window(self, loss: torch.Tensor) -> None:
        window = self._window_loss
        if window.device != loss.device:  # the first loss after construction: adopt its device
            dtype = torch.float32 if loss.device.type == "mps" else torch.float64  # MPS has no float64
            window = self._window_loss = window.to(loss.device, dtype)
        window += loss.to(window.dtype)

    def _boundary_step(self, lr_kwargs: dict) -> None:
        for feature in self.features:
            feature.on_boundary(self)
        scale = self.loss_scale
        norm = self.strategy.grad_norm(scale)
        overflow = not math.isfinite(norm) and self._skip_nonfinite
        if self.loss_scaler is not None:
            self.loss_scaler.update_scale(overflow)
        self._grad_norm = norm
        if overflow:
            self.skipped_steps += 1
            self._consecutive_skips += 1
            self.strategy.zero_grad()
            self._note_overflow(scale)
        else:
            self._consecutive_skips = 0
            coef = 1.0 / scale
            clip = self.config.gradient_clipping
            if clip > 0 and norm > clip:
                coef *= clip / (norm + 1e-6)
            self._step_optimizer(coef)
            self.strategy.after_step()
            if self.lr_scheduler is not None:
                self.lr_scheduler.step(**lr_kwargs)
        self._window_samples += self.train_batch_size()
        self.global_steps += 1
        self.global_samples += self.train_batch_size()
        for feature in self.features:
            feature.after_step(self)
        spp = self.config.steps_per_print
        if spp and self.global_steps % spp == 0:  # after the features: their counts include this step
            self._print_progress()

    def _step_optimizer(self, coef: float) -> None:
        """Step with every gradient multiplied by coef (unscale x clip). torch's fused kernels
        take the factor as `grad_scale` (the hook GradScaler uses) and apply it while they read
        each gradient anyway, which saves a pass over all of them."""
        fold = (coef != 1.0 and getattr(self.optimizer, "_step_supports_amp_scaling", False)
                and type(self.optimizer).__module__.startswith("torch.optim."))  # torch's own protocol
        self.strategy.prepare_step(1.0 if fold else coef)
        if not fold:
            self.optimizer.step()
            return
        device = next(p.device for g in self.optimizer.param_groups for p in g["params"])
        self.optimizer.grad_scale = torch.tensor(1.0 / coef, dtype=torch.float32, device=device)
        try:
            self.optimizer.step()
        finally:
            del self.optimizer.grad_scale

    # ---- logging -------------------------------------------------------------------------
    def _note_overflow(self, scale: float) -> None:
        """One line per window of steps, not one per skipped step."""
        self._window_overflows += 1
        every = self.config.steps_per_print or 100
        if self.global_steps - self._last_overflow_log >= every and self.comm.rank == 0:
            what = "loss scale overflow" if self.loss_scaler else "non-finite gradient"
            log.warning("step %d: %s, skipped the step (%d skipped so far; loss scale %g -> %g)",
                        self.global_steps + 1, what, self.skipped_steps, scale, self.loss_scale)
            self._last_overflow_log = self.global_steps

    def _check_skip_limit(self) -> None:
        """Every rank takes the same decision (the norm is global), so all raise together."""
        limit = self.config.max_consecutive_skipped_steps
        if limit and self._consecutive_skips >= limit:
            last_good = self.global_steps - self._consecutive_skips
            raise NonFiniteStepsError(
                f"step {self.global_steps}: {limit} optimizer steps in a row had non-finite gradients "
                f"(max_consecutive_skipped_steps={limit}); the parameters and optimizer state are still those "
                f"after step {last_good}: lower the learning rate, check the data, or raise the limit",
                last_good_step=last_good)

    def _print_progress(self) -> None:
        """Rank 0 prints the mean loss over all ranks since the last line (all ranks join)."""
        stats = torch.tensor([float(self._window_loss), float(self._window_micro)], dtype=torch.float64)
        self.comm.all_reduce(stats)
        elapsed = max(time.perf_counter() - self._window_start, 1e-9)
        if self.comm.rank == 0:
            loss = stats[0].item() / max(stats[1].item(), 1.0)
            fields = {"step": self.global_steps, "loss": f"{loss:.4f}",
                      "lr": ",".join(f"{lr:.3e}" for lr in self.get_lr()),
                      "samples/s": f"{self._window_samples / elapsed:.1f}"}
            if self.skipped_steps:
                fields["skipped"] = self.skipped_steps
            if self.loss_scaler is not None:
                fields["loss_scale"] = f"{self.loss_scale:g}"
            for feature in self.features:
                fields.update({k: f"{v:.4f}" if isinstance(v, float) else v
                               for k, v in feature.log_fields(self).items()})
            line = " ".join(f"{k}={v}" for k, v in fields.items())
            if self.config.wall_clock_breakdown:
                line += " | " + self._timers.summary_and_reset()
            log.info(line)
        self._window_loss.zero_()
        self._window_micro = 0
        self._window_samples = 0
        self._window_start = time.perf_counter()

    def memory_breakdown(self) -> dict[str, dict[str, int]]:
        """Bytes this rank holds for model states, {category: {place: bytes}}, counted from the
        live tensors (each storage once, so aliases such as fp32 masters that are the model's
        own buffer count zero) and from files for what lives on NVMe."""
        out = {c: {"device": 0, "host": 0, "nvme": 0} for c in ("params", "grads", "master_params", "optimizer_states")}
        entries = list(self.strategy.memory_tensors())
        place = self.strategy.optimizer_state_place
        if self.optimizer is not None:
            entries += [("optimizer_states", place, t) for state in self.optimizer.state.values()
                        for t in state.values() if torch.is_tensor(t) and t.numel() > 1]
        seen = set()
        for category, place, tensor in entries:
            if isinstance(tensor, int):  # bytes the strategy counted itself
                out[category][place] += tensor
                continue
            storage = tensor.untyped_storage()
            key = (storage.data_ptr(), tensor.device)
            if key in seen or storage.nbytes() == 0:
                continue
            seen.add(key)
            out[category][place] += storage.nbytes()
        for category, nbytes in self.strategy.nvme_bytes().items():
            out[category]["nvme"] += nbytes
        return out

    def destroy(self) -> None:
        """Release what the engine attached: gradient hooks, module hooks, NVMe swap files, and
        what its features opened."""
        self.strategy.close()
        for feature in self.features:
            feature.on_close(self)

    def module_state_dict(self) -> dict:
        """The full module state dict, whole parameters at every ZeRO stage (a collective under
        stage 3: every rank must call it)."""
        return self.strategy.full_state_dict(self.module)

    def module_state_entries(self) -> list:
        """The full module state dict as (name, shape, dtype, fetch) entries, each tensor made
        whole only by its fetch (checkpoint/safetensors_out.write_safetensors streams them). Under
        stage 3 every fetch is a collective: every rank calls all of them, in order."""
        return self.strategy.state_entries(self.module)

    @property
    def parameters_partitioned(self) -> bool:
        """True where no rank holds the whole model (ZeRO stage 3)."""
        return bool(self.strategy.sharded_param_ids())

    def train_batch(self, data_iter=None):
        raise TypeError("engine.train_batch runs a pipeline: build the model as zerotrain.pipe.PipelineModule("
                        "layers, num_stages=...); for this model use engine(batch), engine.backward(loss), engine.step()")

    def empty_partition_cache(self) -> None:
        """Release every ZeRO-3 parameter kept whole, the persistent small ones too (after
        evaluation, say); the next forward gathers what it needs. Stages 0-2 keep parameters
        whole anyway: nothing to do."""
        self.strategy.release_gathered()

    def save_16bit_model(self, save_dir, save_filename: str = "pytorch_model.bin",
                         exclude_frozen_parameters: bool = False) -> bool:
        """The whole module weights in one file (export.py); every rank must call."""
        from .export import save_16bit_model

        return save_16bit_model(self, save_dir, save_filename, exclude_frozen_parameters)

    # ---- checkpoints (checkpointing.py does the work) ------------------------------------
    def checkpoint_extras(self) -> dict:
        """What a subclass adds to its model_states file (a pipeline: which layers each stage holds)."""
        return {}

    def save_checkpoint(self, save_dir, tag=None, client_state=None, save_latest: bool = True,
                        exclude_frozen_parameters: bool = False, extra_files=None):
        """exclude_frozen_parameters: leave parameters that do not train out of the module
        state (a LoRA run's base model); loading keeps the model's own values for them.
        extra_files(folder): called on every rank once the engine's files are written, with
        the checkpoint's folder before it is published; what it writes there is published with
        the checkpoint and covered by its manifest (a kill before then leaves no checkpoint)."""
        from .checkpointing import save_checkpoint

        return save_checkpoint(self, save_dir, tag, client_state or {}, save_latest, extra_files,
                               exclude_frozen_parameters)

    def load_checkpoint(self, load_dir, tag=None, load_module_strict: bool = True,
                        load_optimizer_states: bool = True, load_lr_scheduler_states: bool = True,
                        load_module_only: bool = False, fallback_to_complete: bool = False):
        """Returns (path, client_state), or (None, None) when load_dir has no checkpoint.
        fallback_to_complete: if the newest checkpoint fails its manifest check, load the
        newest one that passes instead of raising."""
        from .checkpointing import load_checkpoint

        return load_checkpoint(self, load_dir, tag, load_module_strict, load_optimizer_states,
                               load_lr_scheduler_states, load_module_only, fallback_to_complete)
