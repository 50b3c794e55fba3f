"""Sequence-parallel runs for the distributed tests, and their one-process reference.

zerotrain's GPT (4 heads, no biases) or an HF LLaMA (4 heads, 2 or 1 key/value heads) trains on sequences of 15 tokens (so S = 2 and 4 both
pad) whose labels end in -100 at a different place in each row: the ranks of a sequence
group hold different counts of real labels, some none. Every rank of a data index reads the
same micro-batches; the reference trains the same model on one process with the whole global
batch (accumulated), so each step's loss and norm and the final weights must agree.
Module-level so spawned ranks can unpickle them.
"""

from __future__ import annotations

import torch

SEQ, VOCAB = 15, 64


def gpt(heads: int = 4, mlp_tiles: int = 1, loss_tiles: int = 1):
    from zerotrain.models.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=VOCAB, n_positions=16, n_embd=8 * heads, n_layer=2, n_head=heads, bias=False,
                         mlp_tiles=mlp_tiles, loss_tiles=loss_tiles))


def config(global_size: int, micro: int, stage: int = 0, sequence: int = 1, curriculum: bool = False) -> dict:
    cfg = {"train_batch_size": global_size, "train_micro_batch_size_per_gpu": micro, "gradient_clipping": 1.0,
           "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01, "eps": 1e-4}},
           "zero_optimization": {"stage": stage}, "token_budget": {"enabled": True}}
    if sequence > 1:
        cfg["sequence_parallel_size"] = sequence
    if curriculum:  # lengths 5, 7, 9, 11, then 15
        cfg["curriculum_learning"] = {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": 5,
                                      "max_difficulty": SEQ, "schedule_type": "fixed_linear",
                                      "schedule_config": {"total_curriculum_step": 5, "difficulty_step": 2}}
    return cfg


def global_batch(step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, labels): each row's labels are -100 from a random point on (2 to 15 real)."""
    g = torch.Generator().manual_seed(1000 + step)
    ids = torch.randint(0, VOCAB, (size, SEQ), generator=g)
    real = torch.randint(2, SEQ + 1, (size, 1), generator=g)
    labels = ids.masked_fill(torch.arange(SEQ) >= real, -100)
    return ids, labels


def llama(kv_heads: int, core: str, kind: str = "llama", heads: int = 4, **extra):
    """An HF decoder of `kind` (llama, qwen2: biases on q, k, v; mistral: `sliding_window` in
    `extra`), 2 layers, `heads` query and `kv_heads` key/value heads."""
    import transformers

    name = {"llama": "Llama", "qwen2": "Qwen2", "mistral": "Mistral"}[kind]
    torch.manual_seed(0)
    cfg = getattr(transformers, f"{name}Config")(
        vocab_size=VOCAB, hidden_size=8 * heads, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=16,
        initializer_range=0.2, **extra)  # attention far from uniform: positions matter
    cfg._attn_implementation = core
    return getattr(transformers, f"{name}ForCausalLM")(cfg)


def train(cfg: dict, steps: int, heads: int = 4, hf: tuple | None = None, alst: int = 0,
          save: tuple | None = None, load: str | None = None, tiles: tuple = (1, 1)) -> dict:
    """Train to `steps` optimizer steps on this world (one process: the reference). `hf`:
    (key/value heads, core attention[, kind, config extras]) of an HF decoder (`llama`)
    in place of the GPT; `alst`: S through
    DeepSpeed's names (register_with_transformers, the mpu, UlyssesSPDataLoaderAdapter);
    save = (dir, after_step); load: a checkpoint to continue from; tiles: (MLP, loss) tiles."""
    import zerotrain
    from zerotrain.features.engine_methods import tokens_consumed
    from zerotrain.parallel.sequence import UlyssesSPAttentionHF, UlyssesSPDataLoaderAdapter

    from zerotrain.parallel.sequence.tiled import tile_model

    model = gpt(heads, *tiles) if hf is None else tile_model(llama(*hf[:3], **(hf[3] if len(hf) > 3 else {})),
                                                             *tiles)
    mpu = UlyssesSPAttentionHF.register_with_transformers(model, hf[1], alst, 1, None, True) if alst else None
    engine, *_ = zerotrain.initialize(model=model, config=cfg, mpu=mpu)
    if load is not None:
        engine.load_checkpoint(load)
    adapter = None
    if alst:
        adapter = UlyssesSPDataLoaderAdapter([], sp_rank=mpu.get_sequence_parallel_rank(),
                                             sp_group=mpu.get_sequence_parallel_group(),
                                             sp_world_size=mpu.get_sequence_parallel_world_size(), device="cpu")
    seq = getattr(engine, "sequence_comm", None)
    data_rank = engine.comm.rank // (seq.world_size if seq else 1)
    data_world = engine.comm.world_size // (seq.world_size if seq else 1)
    micro, ga = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    losses, norms, tokens = [], [], []
    while engine.global_steps < steps:
        ids, labels = global_batch(engine.global_steps, micro * ga * data_world)
        mine = slice(data_rank * micro * ga, (data_rank + 1) * micro * ga)
        ids, labels = ids[mine], labels[mine]
        total = 0.0
        for m in range(ga):
            batch = {"input_ids": ids[m * micro:(m + 1) * micro], "labels": labels[m * micro:(m + 1) * micro]}
            loss = engine(**(adapter.shard(batch) if adapter is not None else batch))
            loss = loss if hf is None else loss.loss
            engine.backward(loss)
            engine.step()
            total += loss.item() / ga
        losses.append(total)
        norms.append(engine.get_global_grad_norm())
        tokens.append(tokens_consumed(engine))
        if save is not None and engine.global_steps == save[1]:
            engine.save_checkpoint(save[0])
    logits = None
    if not alst:
        engine.eval()
        with torch.no_grad():  # in eval mode the logits of the whole sequences come back
            logits = engine(input_ids=global_batch(99, 2)[0])
        logits = logits if hf is None else logits.logits
        engine.train()
    return {"losses": losses, "norms": norms, "tokens": tokens, "logits": logits,
            "params": {k: v.detach().clone() for k, v in engine.module_state_dict().items()}}


def bad_input(case: str) -> str | None:
    """The ConfigError's message for a bad input (None: none was raised)."""
    import zerotrain
    from zerotrain.errors import ConfigError, DataError
    from zerotrain.models import BertConfig, PreLNBertMLM

    cases = {"heads": lambda: zerotrain.initialize(model=gpt(heads=3), config=config(4, 1, 0, sequence=2)),
             "qwen_heads": lambda: zerotrain.initialize(model=llama(1, "sdpa", "qwen2", heads=3),
                                                        config=config(4, 1, 0, sequence=2)),
             "world": lambda: zerotrain.initialize(model=gpt(), config=config(4, 1, 0, sequence=3)),
             "encoder": lambda: zerotrain.initialize(model=PreLNBertMLM(BertConfig(vocab_size=VOCAB, n_embd=32,
                                                                                  n_layer=1)),
                                                     config=config(4, 1, 0, sequence=2)),
             "tensor": lambda: zerotrain.initialize(model=gpt(), config=config(4, 1, 0, sequence=2)
                                                    | {"tensor_parallel": {"autotp_size": 2}}),
             "packed": lambda: zerotrain.initialize(model=gpt(), config=config(4, 1, 0, sequence=2))[0](
                 input_ids=global_batch(0, 1)[0], labels=global_batch(0, 1)[1], position_ids=torch.arange(SEQ)[None])}
    try:
        cases[case]()
    except (ConfigError, DataError) as e:
        return str(e)
    return None
