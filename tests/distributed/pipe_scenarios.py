"""Pipeline runs for the distributed tests, and their one-process reference.

The model is a small GPT written as pipeline layers:

    0 TiedLayerSpec("embed", TokenEmbed)      token embedding (tied with the last layer)
    1 LayerSpec(AddPositions)                 learned positions
    2 .. 2+L-1 LayerSpec(PreLNBlock)          the blocks (progressive layer drop skips these)
    L+2 LayerSpec(FinalNorm)
    L+3 TiedLayerSpec("embed", forward_fn=logits)

`reference_model` builds the same layers with the same seeds as one plain module (the blocks a
LayerDrop list, the head reusing the embedding) for zerotrain's ordinary engine on one
process; `pipeline_run` trains the PipelineModule on every rank of a world. Module-level so
spawned ranks can unpickle them.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

SEQ, VOCAB, EMBD, LAYERS = 16, 64, 32, 4
BASE_SEED = 1234


class TokenEmbed(nn.Embedding):
    pass


class AddPositions(nn.Module):
    def __init__(self, n_positions: int, dim: int):
        super().__init__()
        self.pos = nn.Embedding(n_positions, dim)

    def forward(self, x):
        return x + self.pos(torch.arange(x.shape[1], device=x.device))


class FinalNorm(nn.LayerNorm):
    pass


class Poison(nn.Module):
    """Identity, except on rank POISON_RANK at optimizer step POISON_STEP: its backward then
    turns the gradient into inf (set through the environment of that rank)."""

    step = -1

    def forward(self, x):
        if os.environ.get("POISON_STEP") == str(Poison.step) and os.environ.get("POISON_RANK") == os.environ.get("RANK", "0"):
            if x.requires_grad:
                x.register_hook(lambda g: g * float("inf"))
        return x


def logits(embed: nn.Embedding, x):
    return x @ embed.weight.t()


def gpt_loss(out, labels):
    targets = F.pad(labels[:, 1:], (0, 1), value=-100)
    return F.cross_entropy(out.flatten(0, 1).float(), targets.flatten())


def layer_specs(poison: bool = False, vocab: int = VOCAB, seq: int = SEQ, embd: int = EMBD, layers: int = LAYERS):
    """(Other sizes: the DeepSpeed-written pipeline fixture's model, tests/fixtures/deepspeed_pipe2_zero1.)"""
    from zerotrain.models.block import PreLNBlock
    from zerotrain.pipe import LayerSpec, TiedLayerSpec

    return ([TiedLayerSpec("embed", TokenEmbed, vocab, embd), LayerSpec(AddPositions, seq, embd)]
            + ([LayerSpec(Poison)] if poison else [])
            + [LayerSpec(PreLNBlock, embd, 2, 0.0, False) for _ in range(layers)]
            + [LayerSpec(FinalNorm, embd, bias=False), TiedLayerSpec("embed", TokenEmbed, vocab, embd, forward_fn=logits)])


class Reference(nn.Module):
    """The same layers, seeded as PipelineModule(seed_layers=True) seeds them, as one model."""

    def __init__(self, **sizes):
        super().__init__()
        from zerotrain.features.layer_drop import LayerDrop

        specs = layer_specs(**sizes)
        built = []
        for idx, spec in enumerate(specs[:-1]):
            torch.manual_seed(BASE_SEED + idx)
            built.append(spec.build())
        self.embed, self.pos = built[0], built[1]
        self.blocks = LayerDrop(built[2:-1])
        self.norm = built[-1]

    def forward(self, input_ids, labels=None, progressive_layer_drop=False, pld_theta=None):
        x = self.pos(self.embed(input_ids))
        with self.blocks.dropping(pld_theta if progressive_layer_drop and self.training else None):
            for block in self.blocks:
                x = block(x)
        return gpt_loss(logits(self.embed, self.norm(x)), labels)


def to_reference_names(state: dict) -> dict:
    """PipelineModule state-dict keys -> the Reference's."""
    out = {}
    for key, value in state.items():
        head, _, rest = key.partition(".")
        if head == "tied_modules":
            out["embed." + rest.partition(".")[2]] = value
        elif head == "1":
            out["pos." + rest] = value
        elif int(head) == LAYERS + 2:
            out["norm." + rest] = value
        else:
            out[f"blocks.{int(head) - 2}.{rest}"] = value
    return out


def global_batch(step: int, size: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randint(0, VOCAB, (size, SEQ), generator=g)


def config(global_size: int, micro: int, stage: int = 0, curriculum: bool = True, pld: bool = True,
           **extra) -> dict:
    cfg = {"train_batch_size": global_size, "train_micro_batch_size_per_gpu": micro, "gradient_clipping": 1.0,
           "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}},
           "zero_optimization": {"stage": stage}, "token_budget": {"enabled": True}}
    if curriculum:  # lengths 4, 6, 8, ..., 16 (a new one every step), then 16
        cfg["curriculum_learning"] = {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": 4,
                                      "max_difficulty": SEQ, "schedule_type": "fixed_linear",
                                      "schedule_config": {"total_curriculum_step": 7, "difficulty_step": 2}}
    if pld:
        cfg["progressive_layer_drop"] = {"enabled": True, "theta": 0.3, "gamma": 0.3}
    cfg.update(extra)
    return cfg


def reference_run(cfg: dict, steps: int, load: str | None = None) -> dict:
    """`load`: a checkpoint to continue from (a pipeline's too: read in layer order)."""
    import zerotrain
    from zerotrain.features.engine_methods import tokens_consumed

    engine, *_ = zerotrain.initialize(model=Reference(), config=cfg)
    if load is not None:
        engine.load_checkpoint(load)
    micro, ga = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    losses, norms, tokens = [], [], []
    for step in range(engine.global_steps, steps):
        batch = global_batch(step, micro * ga)
        total = 0.0
        for m in range(ga):
            x = batch[m * micro:(m + 1) * micro]
            loss = engine(x, labels=x)
            engine.backward(loss)
            engine.step()
            total += loss.item() / ga
        losses.append(total)
        norms.append(engine.get_global_grad_norm())
        tokens.append(tokens_consumed(engine))
    state = {k: v.detach().clone() for k, v in engine.module.state_dict().items()}
    return {"losses": losses, "norms": norms, "params": state, "tokens": tokens}


def pipeline_run(cfg: dict, steps: int, num_stages: int = 2, save: tuple | None = None, load: str | None = None,
                 poison: bool = False, loader: bool = False, **module_kwargs) -> dict:
    """Train `steps` optimizer steps (continuing from `load`); save = (dir, after_step);
    loader: every step's pairs handed over once with set_dataloader, train_batch() reads them."""
    import zerotrain
    from zerotrain.features.engine_methods import curriculum_seqlen, tokens_consumed
    from zerotrain.pipe import PipelineModule

    net = PipelineModule(layer_specs(poison), num_stages=num_stages, loss_fn=gpt_loss, seed_layers=True,
                         base_seed=BASE_SEED, partition_method="type:PreLNBlock",
                         droppable_layers="type:PreLNBlock", **module_kwargs)
    engine, *_ = zerotrain.initialize(model=net, config=cfg)
    if load is not None:
        engine.load_checkpoint(load)
    dp, d = engine.grid.get_data_parallel_world_size(), engine.grid.get_data_parallel_rank()
    micro, ga = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    losses, norms, skipped, seqlens, tokens, armed = [], [], [], [], [], []

    def pairs(step: int) -> list:
        mine = global_batch(step, micro * ga * dp)[d * micro * ga:(d + 1) * micro * ga]
        return [(mine[m * micro:(m + 1) * micro], mine[m * micro:(m + 1) * micro]) for m in range(ga)]

    if loader:
        engine.set_dataloader([pair for step in range(engine.global_steps, steps) for pair in pairs(step)])
    while engine.global_steps < steps:
        step = engine.global_steps
        Poison.step = step
        losses.append((engine.train_batch() if loader else engine.train_batch(iter(pairs(step)))).item())
        norms.append(engine.get_global_grad_norm())
        skipped.append(engine.skipped_steps)
        seqlens.append(curriculum_seqlen(engine))
        tokens.append(tokens_consumed(engine))
        armed.append(engine._armed)  # buckets went out during the last micro-batch's backward
        if save is not None and engine.global_steps == save[1]:
            engine.save_checkpoint(save[0])
            saved = {k: v.detach().clone() for k, v in engine.module_state_dict().items()}  # tensor pieces gathered
    state = {k: v.detach().clone() for k, v in engine.module.state_dict().items()}
    return {"losses": losses, "norms": norms, "params": state, "skipped": skipped, "seqlens": seqlens, "tokens": tokens,
            "saved": saved if save is not None else None, "armed": armed,
            "stage": engine.grid.get_stage_id(), "data": d, "built": engine._stages.built,
            "first": engine.is_first_stage(), "last": engine.is_last_stage()}


def _eval_batch() -> list:
    x = global_batch(99, 8)
    return [(x[2 * m:2 * m + 2], x[2 * m:2 * m + 2]) for m in range(4)]


def evaluate(cfg: dict) -> float:
    """Train 2 steps, then the mean loss of eval_batch over 4 micro-batches."""
    import zerotrain
    from zerotrain.pipe import PipelineModule

    net = PipelineModule(layer_specs(), num_stages=2, loss_fn=gpt_loss, seed_layers=True, base_seed=BASE_SEED,
                         partition_method="type:PreLNBlock", droppable_layers="type:PreLNBlock")
    engine, *_ = zerotrain.initialize(model=net, config=cfg)
    for step in range(2):
        x = global_batch(step, 8)
        engine.train_batch(iter([(x[2 * m:2 * m + 2], x[2 * m:2 * m + 2]) for m in range(4)]))
    return engine.eval_batch(iter(_eval_batch()), num_micro_batches=4).item()


def reference_eval() -> float:
    import zerotrain

    engine, *_ = zerotrain.initialize(model=Reference(), config=config(8, 2, 0))
    for step in range(2):
        batch = global_batch(step, 8)
        for m in range(4):
            x = batch[2 * m:2 * m + 2]
            engine.backward(engine(x, labels=x))
            engine.step()
    engine.eval()
    with torch.no_grad():
        return sum(engine(x, labels=y).item() for x, y in _eval_batch()) / 4


def bad_input(case: str) -> None:
    import zerotrain
    from zerotrain.pipe import PipelineModule

    if case == "few_layers":
        PipelineModule(layer_specs()[:3], num_stages=2, virtual_stages=2, loss_fn=gpt_loss)
    elif case == "indivisible":
        PipelineModule(layer_specs(), num_stages=3, loss_fn=gpt_loss)
    elif case == "dry":
        net = PipelineModule(layer_specs(), num_stages=2, loss_fn=gpt_loss)
        engine, *_ = zerotrain.initialize(model=net, config=config(8, 2, 0))
        x = global_batch(0, 2)
        engine.train_batch(iter([(x, x)]))  # one pair; the step needs 4


class TwoByTwoMpu:
    """A Megatron-style mpu over 4 ranks: model-parallel pairs {0,1}, {2,3} (both hold the whole
    model, as replicas, so every weight is one that tensor rank 1 must not count again), data
    parallel {0,2}, {1,3}."""

    def __init__(self):
        import torch.distributed as dist

        rank = dist.get_rank()
        for ranks in ([0, 1], [2, 3]):
            g = dist.new_group(ranks)
            if rank in ranks:
                self.model = g
        for ranks in ([0, 2], [1, 3]):
            g = dist.new_group(ranks)
            if rank in ranks:
                self.data = g
        self.tensor_rank = rank % 2

    def get_data_parallel_group(self):
        return self.data

    def get_model_parallel_group(self):
        return self.model

    def get_tensor_model_parallel_rank(self):
        return self.tensor_rank


def mpu_run(steps: int) -> dict:
    """The Reference model under initialize(mpu=...): data index = rank // 2."""
    import zerotrain

    engine, *_ = zerotrain.initialize(model=Reference(), config=config(8, 2, 1, curriculum=False, pld=False),
                                      mpu=TwoByTwoMpu())
    d = int(os.environ["RANK"]) // 2
    micro, ga = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    losses, norms = [], []
    for step in range(steps):
        mine = global_batch(step, 8)[d * micro * ga:(d + 1) * micro * ga]
        for m in range(ga):
            x = mine[m * micro:(m + 1) * micro]
            engine.backward(engine(x, labels=x))
            engine.step()
        norms.append(engine.get_global_grad_norm())
    return {"norms": norms, "ga": ga, "data_world": engine.strategy.comm.world_size}
