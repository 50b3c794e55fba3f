"""Which layers a tensor-parallel split cuts, and how: {module path: style}.

    zerotrain GPT / BERT   every PreLNBlock: models/block.py's TP_PLAN
    HF models              the config's `base_model_tp_plan` ("layers.*.self_attn.q_proj":
                           "colwise", ...), under the model's base_model_prefix; a module
                           with several colwise projections (q, k, v) gets "shared_input"

    the vocabulary      zerotrain's GPT (wte, lm_head) and an HF causal LM (its input and
                        output embeddings): the embedding's rows and the head's outputs
                        split by token id, the logits left sharded for loss_parallel

The vocabulary split is `vocab` (tensor_parallel.vocab_parallel_lm_head): None splits it
where the vocabulary divides by the tensor size (else both stay whole, said in a notice),
True requires it, False keeps both whole. Checked before anything is split: the heads (and
key/value heads) and every split width must divide by the tensor size, and a model with no
plan, or with a style zerotrain does not split, is one line naming what to change.
"""

from __future__ import annotations

import re

from torch import nn

from ...errors import ConfigError
from ...models.block import TP_PLAN, PreLNBlock
from ...models.gpt import GPT

_FIX = "set tensor_parallel.autotp_size (zerotrain train --tensor_parallel_size) to a divisor of it"
_STYLES = ("colwise", "rowwise")


def _heads(count: int, what: str, size: int) -> None:
    if count % size:
        raise ConfigError(f"tensor_parallel.autotp_size {size}: the model has {count} {what}, not divisible by "
                          f"{size}; {_FIX}")


def _zerotrain_plan(model: nn.Module, size: int) -> dict[str, str]:
    plan = {}
    for path, block in model.named_modules():
        if isinstance(block, PreLNBlock):
            _heads(block.n_head, "attention heads", size)
            plan.update({f"{path}.{name}": style for name, style in TP_PLAN.items()})
    return plan


def _hf_plan(model: nn.Module, size: int) -> dict[str, str] | None:
    """The plan of the first HF model inside `model` (itself, or one a wrapper holds)."""
    for root, hf in model.named_modules():
        config = getattr(hf, "config", None)
        rules = getattr(config, "base_model_tp_plan", None) if config is not None else None
        if rules:
            return _hf_rules(hf, config, rules, size, root + "." if root else "")
    return None


def _hf_rules(model: nn.Module, config, rules: dict, size: int, root: str) -> dict[str, str]:
    for attr, what in (("num_attention_heads", "attention heads"), ("num_key_value_heads", "key/value heads")):
        count = getattr(config, attr, None)
        if isinstance(count, int):
            _heads(count, what, size)
    prefix = getattr(model, "base_model_prefix", "")
    base = root + (prefix + "." if prefix and hasattr(model, prefix) else "")
    patterns = [(re.compile(re.escape(base + key).replace(r"\*", r"\d+") + "$"), key, style)
                for key, style in rules.items()]
    plan = {}
    for path, _ in model.named_modules(prefix=root.rstrip(".")):
        for pattern, key, style in patterns:
            if pattern.match(path):
                if style not in _STYLES:
                    raise ConfigError(f"tensor_parallel: {type(model).__name__}'s base_model_tp_plan splits {key} "
                                      f"as {style!r}, which zerotrain does not build (it splits {' and '.join(_STYLES)}"
                                      "); train this model without tensor_parallel")
                plan[path] = style
    parents = [path.rpartition(".")[0] for path, style in plan.items() if style == "colwise"]
    # attention's q, k, v and the MLP's gate, up read one input: converted once at their module
    return plan | {parent: "shared_input" for parent in set(parents) if parents.count(parent) > 1}


def _vocab_layers(model: nn.Module) -> tuple[nn.Module, nn.Module] | None:
    """(embedding, head) of zerotrain's GPT or of the first HF causal LM inside `model`."""
    for sub in model.modules():
        if isinstance(sub, GPT):
            return sub.wte, sub.lm_head
        inputs, outputs = getattr(sub, "get_input_embeddings", None), getattr(sub, "get_output_embeddings", None)
        if callable(inputs) and callable(outputs) and getattr(sub, "config", None) is not None:
            try:
                pair = inputs(), outputs()
            except NotImplementedError:
                continue
            if isinstance(pair[0], nn.Embedding) and isinstance(pair[1], nn.Linear):
                return pair
    return None


def vocab_plan(model: nn.Module, size: int, vocab: bool | None) -> tuple[dict[str, str], str | None]:
    """({embedding path: "vocab_embedding", head path: "vocab_head"} or {}, why not split)."""
    if vocab is False:
        return {}, None
    layers, why = _vocab_layers(model), None
    if layers is None:
        why = f"{type(model).__name__} has no token embedding and LM head zerotrain splits (its GPT, HF causal LMs)"
    elif layers[0].num_embeddings != layers[1].out_features:
        why = f"the embedding has {layers[0].num_embeddings} rows, the head {layers[1].out_features} outputs"
    elif layers[0].num_embeddings % size:
        why = f"the vocabulary of {layers[0].num_embeddings} tokens does not divide by {size}"
    if why is not None:
        if vocab:
            raise ConfigError(f"tensor_parallel.vocab_parallel_lm_head true: {why}; set it to false (the embedding "
                              "and head stay whole)" + (" or pad the vocabulary" if layers else ""))
        return {}, why
    paths = {id(m): path for path, m in model.named_modules()}
    return {paths[id(layers[0])]: "vocab_embedding", paths[id(layers[1])]: "vocab_head"}, None


def tensor_plan(model: nn.Module, size: int, vocab: bool | None = False,
                given: dict[str, str] | None = None) -> tuple[dict[str, str], str | None]:
    """The split of `model` over `size` tensor ranks, checked; and why the vocabulary is not
    split (None when it is, or when vocab is False). `given`: the plan, already read from the
    whole model (a pipeline stage's share of it, which may be empty), instead of reading one."""
    plan = dict(given) if given is not None else _zerotrain_plan(model, size) or _hf_plan(model, size)
    if not plan and given is None:
        raise ConfigError(f"tensor_parallel: {type(model).__name__} has no tensor-parallel plan (zerotrain splits its "
                          "GPT and BERT, and HF models whose config has a base_model_tp_plan: LLaMA, Qwen, Mistral, "
                          "...); use one of those or remove tensor_parallel (--tensor_parallel_size 1)")
    vocab_split, why = vocab_plan(model, size, vocab)
    modules = dict(model.named_modules())
    for path, style in plan.items():
        layer = modules.get(path)
        if layer is None:
            raise ConfigError(f"tensor_parallel: the plan names {path}, which is not a module of "
                              f"{type(model).__name__}; name its modules as named_modules() does")
        if style == "shared_input":
            continue
        if not isinstance(layer, nn.Linear):
            raise ConfigError(f"tensor_parallel: {path} is a {type(layer).__name__}, not a Linear; zerotrain splits "
                              "Linear layers only: train this model without tensor_parallel")
        width, side = (layer.out_features, "output") if style != "rowwise" else (layer.in_features, "input")
        parts = int(style.split(":")[1]) if ":" in style else 1
        if width % (size * parts):
            raise ConfigError(f"tensor_parallel.autotp_size {size}: {path} has {width // parts} {side} features"
                              f"{' per part' if parts > 1 else ''}, not divisible by {size}; {_FIX}")
    return plan | vocab_split, why
