"""Stock torch and HF models at ZeRO-3 (built plainly or under zero.Init), for the
distributed tests and their 1-process references. Module-level so spawned ranks can
unpickle them; every model takes (ids) and returns its scalar loss."""

from __future__ import annotations

import contextlib

import torch
from torch import nn

import zerotrain
from scenarios import rank_and_world

VOCAB, SEQ, WIDTH = 48, 8, 16


class Encoder(nn.Module):
    """torch's TransformerEncoder: deep-copied layers, nn.MultiheadAttention reading out_proj.weight itself."""

    def __init__(self, decoder: bool = False):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.decoder = decoder
        if decoder:
            layer = nn.TransformerDecoderLayer(WIDTH, 2, 32, dropout=0.0, batch_first=True)
            self.body = nn.TransformerDecoder(layer, 2)
        else:
            layer = nn.TransformerEncoderLayer(WIDTH, 2, 32, dropout=0.0, batch_first=True)
            self.body = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, ids):
        x = self.emb(ids)
        h = self.body(x, x) if self.decoder else self.body(x)
        return nn.functional.cross_entropy(self.head(h).flatten(0, 1), ids.flatten())


class TiedFunctional(nn.Module):
    """A tied head applied in the root's own forward (no module of its own) and a frozen
    position table: parameters used outside their module, and frozen ones."""

    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, WIDTH)
        self.wpe = nn.Embedding(SEQ, WIDTH)
        self.mix = nn.Linear(WIDTH, WIDTH)
        self.wpe.weight.requires_grad_(False)

    def forward(self, ids):
        h = torch.tanh(self.mix(self.wte(ids) + self.wpe.weight[: ids.shape[1]]))
        logits = nn.functional.linear(h, self.wte.weight)
        return nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten())


class HFLoss(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids, labels=ids).loss


def build(kind: str) -> nn.Module:
    torch.manual_seed(0)
    if kind in ("encoder", "decoder"):
        return Encoder(decoder=kind == "decoder")
    if kind == "tied_frozen":
        return TiedFunctional()
    if kind in ("llama", "lora"):
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=32, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=SEQ)
        return HFLoss(LlamaForCausalLM(cfg))
    if kind == "bert":
        from transformers import BertConfig, BertForMaskedLM

        cfg = BertConfig(vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, max_position_embeddings=SEQ, hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0)
        return HFLoss(BertForMaskedLM(cfg))
    raise ValueError(kind)


def with_lora(model: nn.Module) -> nn.Module:
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(1)
    model.model = get_peft_model(model.model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    return model


def train_model(kind: str, under_init: bool, stage: int, steps: int = 4) -> dict:
    """Train `kind` for `steps` steps of a global batch of 4; each rank takes its slice."""
    rank, world = rank_and_world()
    with zerotrain.zero.Init() if under_init else contextlib.nullcontext():
        model = build(kind)
    if kind == "lora":
        model = with_lora(model)
    config = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 4 // world, "gradient_clipping": 0.0,
              "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
              # SGD: attention key biases get gradients that are zero up to rounding, which Adam
              # would turn into lr-sized steps of noise
              "optimizer": {"type": "SGD", "params": {"lr": 0.2}}}
    engine, *_ = zerotrain.initialize(model=model, config=config)
    losses, norms = [], []
    per = 4 // world
    for step in range(steps):
        ids = torch.randint(0, VOCAB, (4, SEQ), generator=torch.Generator().manual_seed(step))
        loss = engine(ids[rank * per : (rank + 1) * per])
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
        norms.append(engine.get_global_grad_norm())
    params = {k: v.detach().float().clone() for k, v in engine.module_state_dict().items()}
    peak = getattr(getattr(engine.strategy, "gatherer", None), "peak_live_numel", None)
    engine.destroy()
    return {"losses": losses, "norms": norms, "params": params, "peak_live": peak,
            "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad)}
