"""Tensor-parallel runs for the distributed tests, and their one-process reference.

The model is zerotrain's GPT (tied embedding, biases, 4 heads) or an HF LLaMA built from a
config (grouped key/value heads, no biases). Every rank of a data index trains on the same
micro-batches; `reference_run` trains the same model, same seed, on one process with the whole
global batch (accumulated), so each step's loss and norm and the final weights must agree.
Module-level so spawned ranks can unpickle them.
"""

from __future__ import annotations

import os

import torch

SEQ, VOCAB = 16, 64


def gpt():
    from zerotrain.models.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=4, bias=False))


def llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ)
    return LlamaForCausalLM(cfg)


class LossOf(torch.nn.Module):
    """An HF causal LM as (input_ids, labels) -> loss, the form the engine loop here uses."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, labels=None):
        return self.model(input_ids=input_ids, labels=labels).loss


MODELS = {"gpt": gpt, "llama": lambda: LossOf(llama()), "hf": llama}  # "hf": the HF model itself, its own names


def config(global_size: int, micro: int, stage: int = 0, tensor: int = 1, curriculum: bool = True,
           **extra) -> dict:
    cfg = {"train_batch_size": global_size, "train_micro_batch_size_per_gpu": micro, "gradient_clipping": 1.0,
           "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}},
           "zero_optimization": {"stage": stage}, "token_budget": {"enabled": True}}
    if tensor > 1:
        cfg["tensor_parallel"] = {"autotp_size": tensor}
    if curriculum:  # lengths 4, 6, ..., 16 (a new one every step), then 16
        cfg["curriculum_learning"] = {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": 4,
                                      "max_difficulty": SEQ, "schedule_type": "fixed_linear",
                                      "schedule_config": {"total_curriculum_step": 7, "difficulty_step": 2}}
    cfg.update(extra)
    return cfg


def global_batch(step: int, size: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randint(0, VOCAB, (size, SEQ), generator=g)


def train(cfg: dict, steps: int, model: str = "gpt", save: tuple | None = None, load: str | None = None,
          poison: tuple | None = None) -> dict:
    """Train to `steps` optimizer steps on this world (one process: the reference); save =
    (dir, after_step); poison = (rank, step): that rank's loss is multiplied by inf there."""
    import zerotrain
    from zerotrain.features.engine_methods import curriculum_seqlen, tokens_consumed

    net = MODELS[model]()
    engine, *_ = zerotrain.initialize(model=net, config=cfg)
    if load is not None:
        engine.load_checkpoint(load)
    data = engine.strategy.comm
    micro, ga = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    rank = int(os.environ.get("RANK", "0"))
    losses, norms, tokens, skipped = [], [], [], []
    while engine.global_steps < steps:
        step = engine.global_steps
        mine = global_batch(step, micro * ga * data.world_size)[data.rank * micro * ga:(data.rank + 1) * micro * ga]
        total = 0.0
        for m in range(ga):
            x = mine[m * micro:(m + 1) * micro]
            loss = engine(x, labels=x)
            loss = loss.loss if model == "hf" else loss
            if poison is not None and poison == (rank, step):
                loss = loss * float("inf")
            engine.backward(loss)
            engine.step()
            total += loss.item() / ga
        losses.append(total)
        norms.append(engine.get_global_grad_norm())
        tokens.append(tokens_consumed(engine))
        skipped.append(engine.skipped_steps)
        if save is not None and engine.global_steps == save[1]:
            engine.save_checkpoint(save[0])
            saved = {k: v.detach().clone() for k, v in engine.module_state_dict().items()}  # gathered whole
    whole = {k: v.detach().clone() for k, v in engine.module_state_dict().items()}
    from zerotrain.parallel.tensor.dtensor import local

    lm = net if model == "gpt" else net.model if model == "llama" else net
    embedding, head = lm.get_input_embeddings() if model != "gpt" else lm.wte, lm.lm_head
    with torch.no_grad():  # the logits a rank holds: its share of the vocabulary
        logits = local(lm(mine[:1]) if model == "gpt" else lm(input_ids=mine[:1]).logits)
    vocab = {"embedding_rows": local(embedding.weight).shape[0], "head_rows": local(head.weight).shape[0],
             "logits": logits.shape[-1], "tied": embedding.weight is head.weight}
    if model == "gpt":  # in eval mode the engine gives the logits whole (what an evaluation reads)
        engine.eval()
        with torch.no_grad():
            evaluated = engine(mine[:1])
        vocab["eval_logits"] = (type(evaluated).__name__, evaluated.shape[-1])
        engine.train()
    probe = None
    if model == "hf":  # the trained model's whole logits (eval mode gathers them)
        engine.eval()
        with torch.no_grad():
            probe = engine(input_ids=global_batch(99, 2)).logits
    return {"losses": losses, "norms": norms, "tokens": tokens, "skipped": skipped, "params": whole, "vocab": vocab,
            "saved": saved if save is not None else None, "probe_logits": probe,
            "seqlen": curriculum_seqlen(engine), "data": data.rank, "data_world": data.world_size}


def bad_input(case: str) -> None:
    import zerotrain
    from zerotrain.models.gpt import GPT, GPTConfig

    if case == "heads":
        net = GPT(GPTConfig(vocab_size=VOCAB, n_positions=SEQ, n_embd=36, n_layer=1, n_head=3))
        zerotrain.initialize(model=net, config=config(8, 2, 0, tensor=2))
    elif case == "no_plan":
        net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
        zerotrain.initialize(model=net, config=config(8, 2, 0, tensor=2, curriculum=False))
    elif case == "stage3":
        zerotrain.initialize(model=gpt(), config=config(8, 2, 3, tensor=2))
    elif case == "vocab":  # 63 tokens do not split in two
        net = GPT(GPTConfig(vocab_size=VOCAB - 1, n_positions=SEQ, n_embd=32, n_layer=1, n_head=4))
        zerotrain.initialize(model=net, config=config(8, 2, 0, tensor=2, curriculum=False,
                                                      tensor_parallel={"autotp_size": 2, "vocab_parallel_lm_head": True}))
