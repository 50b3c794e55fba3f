"""`--pipeline_parallel_size P`: a model the trainer built, cut into pipeline stages by its
block list, embedding in the first stage, head in the last.

    zerotrain GPT     [tok embed*] [positions] [PreLNBlock] x L [ln_f] [tok embed* as head]
    zerotrain BERT    [tok embed*] [positions, types, LN] [block] x L [ln_f, transform] [tok embed* as decoder] [bias]
    HF LLaMA-family   [embed_tokens] [rotary] [decoder layer] x L [norm] [lm_head]   (* = tied when tied)
    HF GPT-2          [wte*] [wpe] [GPT2Block] x L [ln_f] [wte* as lm_head]

The layers are the model's own modules (the trainer has built the whole model on every rank;
each rank then keeps only its stages' weights). With --tensor_parallel_size T the world is
pipe x data x tensor (the mesh's order, tensor fastest) and each stage's projections are split
T ways at initialize by the whole model's plan (zerotrain's, or the HF config's
base_model_tp_plan), read and checked before anything is split and renamed to the stages'
modules (a LLaMA's "model.layers.1.self_attn.q_proj" is "3.layer.self_attn.q_proj"); the
embedding and head stay whole. Tied token embeddings become one TiedLayerSpec key, so their
gradients are summed over the first and last stage. The model's own names of this rank's
weights are read by identity before training (`names`), so the stages' state dicts can be
saved as the model's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import ConfigError
from ..topology import PipeModelDataParallelTopology
from .module import PipelineModule
from .spec import TiedLayerSpec


class _Existing(TiedLayerSpec):
    """A tied layer that is a module already built."""

    def __init__(self, key: str, module: nn.Module, forward_fn=None):
        self.key, self.typename, self.module = key, type(module), module
        self.module_args, self.module_kwargs = (), {}
        self.forward_fn, self.tied_weight_attr = forward_fn, ["weight"]

    def build(self, log: bool = False) -> nn.Module:
        return self.module


class _Call(nn.Module):
    """Registers `parts` and runs fn(parts, x)."""

    def __init__(self, fn, **parts):
        super().__init__()
        self.fn = fn
        for name, part in parts.items():
            setattr(self, name, part)

    def forward(self, x):
        return self.fn(self, x)


def _gpt_loss(logits, labels):
    targets = F.pad(labels[:, 1:], (0, 1), value=-100)
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def _mlm_loss(logits, labels):
    picked = labels != -100
    return F.cross_entropy(logits[picked].float(), labels[picked])


def _project(m, x):
    return x @ m.weight.t()


def _embed_first(m, xs):  # (ids, mask) -> (embedding, ids, mask)
    return (m(xs[0]), *xs) if isinstance(xs, tuple) else m(xs)


def _ours_gpt(model):
    tied = model.lm_head.weight is model.wte.weight
    head = _Existing("embed", model.wte, forward_fn=_project) if tied else _Call(lambda s, x: s.head(x), head=model.lm_head)
    layers = [_Existing("embed", model.wte) if tied else _Call(lambda s, x: s.wte(x), wte=model.wte),
              _Call(lambda s, x: x + s.wpe(torch.arange(x.shape[1], device=x.device)), wpe=model.wpe),
              *model.blocks._modules.values(), model.ln_f, head]
    return layers, _gpt_loss


class _BertBlock(nn.Module):
    def __init__(self, block):
        super().__init__()
        self.block = block

    def forward(self, xs):
        x, mask = xs
        return self.block(x, mask[:, None, None, :].bool()), mask


def _ours_bert(model):
    enc = model.bert

    def rest(s, xs):
        e, ids, mask = xs
        x = e + s.wpe(torch.arange(ids.shape[1], device=ids.device))
        return F.dropout(s.ln_emb(x), enc.cfg.dropout, s.training), mask

    def transform(s, xs):
        return s.ln(F.gelu(s.dense(s.ln_f(xs[0]))))

    layers = [_Existing("embed", enc.wte, forward_fn=_embed_first), _Call(rest, wpe=enc.wpe, wtt=enc.wtt, ln_emb=enc.ln_emb),
              *[_BertBlock(b) for b in enc.blocks._modules.values()],
              _Call(transform, ln_f=enc.ln_f, dense=model.dense, ln=model.ln),
              _Existing("embed", enc.wte, forward_fn=_project),
              _Call(lambda s, x: x + s.decoder.bias, decoder=model.decoder)]
    return layers, _mlm_loss


def _hf_decoder(model):
    base = getattr(model, "model", None) or getattr(model, "transformer", None)
    if hasattr(base, "layers") and hasattr(base, "rotary_emb"):  # LLaMA, Qwen, Mistral
        def rotary(s, x):
            pos = torch.arange(x.shape[1], device=x.device)[None]
            cos, sin = s.rotary(x, pos)
            return x, cos, sin

        def block(layer, xs):
            x, cos, sin = xs
            out = layer(x, attention_mask=None, position_embeddings=(cos, sin),
                        position_ids=torch.arange(x.shape[1], device=x.device)[None])
            return (out[0] if isinstance(out, tuple) else out), cos, sin

        embed, blocks, top = base.embed_tokens, base.layers, [_Call(lambda s, xs: s.norm(xs[0]), norm=base.norm)]
        first = [_Call(rotary, rotary=base.rotary_emb)]
    elif hasattr(base, "h") and hasattr(base, "wpe"):  # GPT-2
        def block(layer, x):
            out = layer(x)
            return out[0] if isinstance(out, tuple) else out

        embed, blocks, top = base.wte, base.h, [base.ln_f]
        first = [_Call(lambda s, x: x + s.wpe(torch.arange(x.shape[1], device=x.device)), wpe=base.wpe)]
    else:
        raise ConfigError(f"--pipeline_parallel_size: no block list found in {type(model).__name__}; supported are "
                          "zerotrain's GPT and BERT and HF LLaMA/Qwen/Mistral/GPT-2-style decoders")
    tied = model.lm_head.weight is embed.weight
    wrapped = [_Call(lambda s, x, fn=block: fn(s.layer, x), layer=b) for b in blocks]
    head = _Existing("embed", embed, forward_fn=_project) if tied else _Call(lambda s, x: s.head(x), head=model.lm_head)
    embed_layer = _Existing("embed", embed) if tied else _Call(lambda s, x: s.embed(x), embed=embed)
    return [embed_layer, *first, *wrapped, *top, head], _gpt_loss


def _stage_plan(model: nn.Module, layers: list, tensor: int) -> dict[str, str]:
    """The whole model's tensor-parallel plan (its heads and widths checked), under the
    PipelineModule's names of the same modules: layer i is "i", a tied layer "tied_modules.<key>"."""
    from ..tensor.plan import tensor_plan

    plan, _ = tensor_plan(model, tensor)  # the vocabulary stays whole: a stage holds the embedding or the head
    where: dict[int, str] = {}
    for idx, layer in enumerate(layers):
        tied = isinstance(layer, _Existing)
        module, prefix = (layer.module, f"tied_modules.{layer.key}") if tied else (layer, str(idx))
        for path, sub in module.named_modules(prefix=prefix):
            where.setdefault(id(sub), path)
    modules = dict(model.named_modules())
    return {where[id(modules[path])]: style for path, style in plan.items()}


def split_model(model: nn.Module, kind: str, task: str, stages: int, pipeline_cfg: dict | None = None,
                tensor: int = 1, data: int = 1):
    """(PipelineModule, names): names maps its state-dict keys on this rank to the model's.
    With `tensor` > 1 the world is stages x data x tensor, each stage's blocks split over the
    tensor ranks by the model's own plan."""
    if kind == "gpt" and task == "clm":
        layers, loss = _ours_gpt(model)
    elif kind == "bert" and task == "mlm":
        layers, loss = _ours_bert(model)
    elif kind == "hf" and task == "clm":
        layers, loss = _hf_decoder(model)
    else:
        raise ConfigError(f"--pipeline_parallel_size: a {kind} model for task {task} cannot be split; use a GPT "
                          "or HF decoder (clm) or a BERT (mlm), or --pipeline_parallel_size 1")
    plan = _stage_plan(model, layers, tensor) if tensor > 1 else None
    own = {}
    for name, t in list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers()):
        own.setdefault(id(t), name)  # a tied weight: its first name
    cfg = pipeline_cfg or {}
    partition = cfg.get("partition", "best")
    topology = PipeModelDataParallelTopology(stages, tensor, data) if tensor > 1 else None
    net = PipelineModule(layers, num_stages=None if topology else stages, topology=topology, loss_fn=loss,
                         seed_layers=bool(cfg.get("seed_layers", False)),
                         partition_method="parameters" if partition == "best" else partition,
                         droppable_layers=f"type:^({'|'.join(_block_types(layers))})$", tensor_plan=plan)
    if kind == "hf":  # random-LTD, when on, routes the stages' decoder layers (features/random_ltd.py)
        from ...data_efficiency.routing import hf_blocks

        net._random_ltd_class = type(hf_blocks(model)[0][1])
    names = {name: own[id(t)] for name, t in list(net.named_parameters(remove_duplicate=False))
             + list(net.named_buffers()) if id(t) in own}
    keep = {id(t) for t in list(net.parameters()) + list(net.buffers())}
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) not in keep:  # another stage's weight: free it here
            t.data = torch.empty(0, dtype=t.dtype, device=t.device)
    return net, names


def _block_types(layers) -> list[str]:
    counts: dict[str, int] = {}
    for layer in layers:
        if isinstance(layer, nn.Module):
            counts[type(layer).__name__] = counts.get(type(layer).__name__, 0) + 1
    return [max(counts, key=counts.get)]


def whole_state(engine, state: dict, names: dict[str, str]) -> dict:
    """The model's full state dict on every rank, from the stages' (data-parallel and tensor
    rank 0 of each stage sends its part, whole and under the model's names)."""
    grid = engine.grid
    sends = grid.get_data_parallel_rank() == 0 and grid.get_slice_parallel_rank() == 0
    mine = {names.get(k, k): v.cpu() for k, v in state.items()} if sends else {}
    whole: dict = {}
    for part in engine.comm.all_gather_object(mine):
        for k, v in part.items():
            whole.setdefault(k, v)
    return whole
