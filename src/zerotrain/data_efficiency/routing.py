"""Routing layers for random-LTD: which layers drop tokens, and the two hooks that do it.

A routed layer keeps its class, its place and its parameter names (no wrapper module, so
state dicts, ZeRO-3's gathers and layer drop's block lists are untouched); two hooks act
around its forward during training:

    before   hidden states -> the kept tokens (random_ltd.gather_tokens); the arguments that
             are indexed by position follow them: the attention mask (rows and columns,
             [.., s, s]; or the key positions, [.., 1, s]), position_ids, and rotary
             position_embeddings (cos, sin) of HF decoder layers
    after    the layer's output (a tensor, or a tuple led by one) scattered back into the
             full hidden states

Kept positions are sorted, so a causal layer (is_causal, or its mask gathered at the kept rows
and columns) lets each kept token see the kept tokens before it. DeepSpeed slices a decoder's
mask to its first r rows and columns instead, which equals the gather for a purely causal mask
and is wrong with padding; it also gathers neither position ids nor rotary embeddings.

Which layers: `random_ltd_layer_id` counts the candidate layers in model order from 0: the
blocks of zerotrain's GPT and BERT, the block list of an HF model (LLaMA, Qwen, Mistral,
GPT-2, BERT: layer_drop.HF_BLOCK_PATHS), or the modules of the class given to
`convert_to_random_ltd(model, LayerClass)`; for a block list that is the block's index, what
DeepSpeed's name matching (the id's digits in the module name) picks for such lists.
"""

from __future__ import annotations

import inspect
from collections import OrderedDict

import torch
from torch import nn

from ..errors import ModelInterfaceError
from .random_ltd import gather_tokens, kept_token_indices, sample_indices, scatter_tokens

WHERE = "data_efficiency.data_routing.random_ltd"


class TokenRouter:
    """What every routed layer of one engine reads: the schedule, the seed, and where the
    current forward sits (step, micro-batch of the step, data-parallel rank and size). Under
    the pipeline engine the micro-batch is the one the stage runs (`micro_source`, the
    PipelineModule, whose schedule interleaves the micro-batches' forwards)."""

    def __init__(self, scheduler, seed: int, batch_first: bool = True):
        self.scheduler = scheduler
        self.seed = seed
        self.batch_first = batch_first
        self.step = 0
        self.micro_in_step = 0
        self.rank, self.world = 0, 1
        self.dealing = "interleaved"  # random_ltd.sample_indices
        self.micro_source = None  # an object whose micro_batch names the micro-batch running now

    def kept(self, layer_id: int, batch: int, seq_len: int, device) -> torch.Tensor | None:
        """[batch, r] sorted positions to keep, or None when r >= seq_len (nothing dropped)."""
        keep = self.scheduler.get_current_seq()
        if keep >= seq_len:
            return None
        micro = self.micro_in_step if self.micro_source is None else self.micro_source.micro_batch
        samples = sample_indices(0, batch, self.rank, self.world, self.dealing, micro, device)
        return kept_token_indices(self.seed, self.step, layer_id, samples, seq_len, keep)


# ---- the arguments that follow the tokens ----------------------------------------------------
def _gather_mask(mask, kept: torch.Tensor, seq_len: int, name: str):
    if not torch.is_tensor(mask):  # flex attention's BlockMask, say: it has no rows to pick
        raise ModelInterfaceError(f"random-LTD: the mask argument {name!r} is a {type(mask).__name__}, not a tensor, "
                                  "and cannot follow the kept tokens; use an attention implementation with tensor "
                                  "masks (sdpa or eager)")
    b, r = kept.shape
    shape = tuple(mask.shape)
    if mask.dim() >= 2 and shape[-2:] == (seq_len, seq_len):  # [.., query, key]
        m = mask if mask.dim() >= 3 else mask[None]
        if m.shape[0] not in (1, b):
            raise ModelInterfaceError(f"random-LTD: the mask argument {name!r} has shape {shape}; its first dim "
                                      f"should be the batch ({b}) or 1")
        m = m.expand(b, *m.shape[1:])
        ones = [1] * (m.dim() - 3)
        rows = m.gather(-2, kept.view(b, *ones, r, 1).expand(*m.shape[:-2], r, seq_len))
        return rows.gather(-1, kept.view(b, *ones, 1, r).expand(*m.shape[:-2], r, r))
    if mask.dim() >= 2 and shape[-1] == seq_len and (mask.dim() == 2 or shape[-2] == 1):  # key padding
        m = mask.expand(b, *shape[1:]) if shape[0] == 1 else mask
        return m.gather(-1, kept.view(b, *([1] * (m.dim() - 2)), r).expand(*m.shape[:-1], r))
    raise ModelInterfaceError(f"random-LTD: the mask argument {name!r} has shape {shape}, which is neither "
                              f"(..., {seq_len}, {seq_len}) nor (..., 1, {seq_len}) for sequence length {seq_len}; "
                              f"set model_mask_name to the layer's mask argument (or null for none)")


def _gather_position_ids(ids, kept: torch.Tensor, seq_len: int):
    """position_ids [s] or [1 or b, s] -> [b, r]; anything else is left as it is."""
    if not torch.is_tensor(ids) or ids.dim() not in (1, 2) or ids.shape[-1] != seq_len:
        return ids
    ids = ids if ids.dim() == 2 else ids[None]
    return ids.expand(kept.shape[0], seq_len).gather(1, kept)


def _gather_rotary(pair, kept: torch.Tensor, seq_len: int):
    """HF's position_embeddings (cos, sin), each [1 or b, s, d] -> [b, r, d]."""
    if not isinstance(pair, tuple):
        return pair
    return tuple(gather_tokens(t.expand(kept.shape[0], *t.shape[1:]), kept)
                 if torch.is_tensor(t) and t.dim() == 3 and t.shape[1] == seq_len else t for t in pair)


_SIGNATURES: dict[type, list[str]] = {}


def _params(module: nn.Module) -> list[str]:
    kind = type(module)
    if kind not in _SIGNATURES:
        try:
            params = inspect.signature(module.forward).parameters.values()
            _SIGNATURES[kind] = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        except (TypeError, ValueError):
            _SIGNATURES[kind] = []
    return _SIGNATURES[kind]


class _Call:
    """args / kwargs of one forward call, addressable by parameter name."""

    def __init__(self, module, args, kwargs):
        self.names, self.args, self.kwargs = _params(module), list(args), dict(kwargs)

    def get(self, name: str):
        if name in self.kwargs:
            return self.kwargs[name]
        i = self.names.index(name) if name in self.names else len(self.args)
        return self.args[i] if i < len(self.args) else None

    def set(self, name: str, value) -> None:
        i = self.names.index(name) if name in self.names else len(self.args)
        if i < len(self.args) and name not in self.kwargs:
            self.args[i] = value
        else:
            self.kwargs[name] = value


class RoutedLayer:
    """The hook pair on one layer (a class, so copies and pickles of the model carry it)."""

    def __init__(self, router: TokenRouter, layer_id: int, mask_name: str | None):
        self.router, self.layer_id, self.mask_name = router, layer_id, mask_name
        self.open: list = []  # (full hidden, kept) per call in flight; None where nothing was dropped
        self.handles: list = []

    def before(self, module, args, kwargs):
        router = self.router
        call = _Call(module, args, kwargs)
        hidden_name = call.names[0] if call.names and call.names[0] in kwargs else "hidden_states"
        hidden = args[0] if args else kwargs.get(hidden_name)
        kept = None
        if module.training and torch.is_tensor(hidden) and hidden.dim() >= 3:
            seq_dim = 1 if router.batch_first else 0
            kept = router.kept(self.layer_id, hidden.shape[1 - seq_dim], hidden.shape[seq_dim], hidden.device)
        self.open.append(None if kept is None else (hidden, kept))
        if kept is None:
            return None
        seq_len = hidden.shape[1 if router.batch_first else 0]
        if args:
            call.args[0] = gather_tokens(hidden, kept, router.batch_first)
        else:
            call.kwargs[hidden_name] = gather_tokens(hidden, kept, router.batch_first)
        if self.mask_name is not None and (mask := call.get(self.mask_name)) is not None:
            call.set(self.mask_name, _gather_mask(mask, kept, seq_len, self.mask_name))
        if router.batch_first:  # HF's layers: positions ride along with the tokens
            for name, gather in (("position_ids", _gather_position_ids), ("position_embeddings", _gather_rotary)):
                if (value := call.get(name)) is not None:
                    call.set(name, gather(value, kept, seq_len))
        return tuple(call.args), call.kwargs

    def after(self, module, args, kwargs, output):
        entry = self.open.pop() if self.open else None
        if entry is None or output is None:  # nothing dropped, or the forward failed (always_call)
            return None
        hidden, kept = entry
        first = self.router.batch_first
        if torch.is_tensor(output):
            return scatter_tokens(hidden, output, kept, first)
        if isinstance(output, tuple) and output and torch.is_tensor(output[0]):
            return (scatter_tokens(hidden, output[0], kept, first), *output[1:])
        raise ModelInterfaceError(f"random-LTD: {type(module).__name__} returned {type(output).__name__}; a routed "
                                  "layer must return its hidden states, or a tuple that starts with them")

    def attach(self, module: nn.Module) -> None:
        self.handles = [module.register_forward_pre_hook(self.before, with_kwargs=True),
                        module.register_forward_hook(self.after, with_kwargs=True, always_call=True)]
        module._random_ltd = self

    def detach(self, module: nn.Module) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
        module.__dict__.pop("_random_ltd", None)


# ---- which layers -----------------------------------------------------------------------------
def zerotrain_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    from ..models.block import PreLNBlock

    return [(n, m) for n, m in model.named_modules() if isinstance(m, PreLNBlock)]


def hf_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    from ..features.layer_drop import HF_BLOCK_PATHS
    from ..features.model_api import is_hf_model

    if not is_hf_model(model):
        return []
    for path in HF_BLOCK_PATHS:
        try:
            blocks = model.get_submodule(path)
        except AttributeError:
            continue
        if isinstance(blocks, nn.ModuleList):
            return [(f"{path}.{i}", m) for i, m in enumerate(blocks._modules.values())]
    return []


def layers_of_class(model: nn.Module, layer_class) -> list[tuple[str, nn.Module]]:
    if not (isinstance(layer_class, type) and issubclass(layer_class, nn.Module)):
        raise TypeError(f"convert_to_random_ltd: the layer class should be an nn.Module subclass, got {layer_class!r}")
    return [(n, m) for n, m in model.named_modules() if isinstance(m, layer_class)]


def routed(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(getattr(m, "_random_ltd", None), RoutedLayer)]


def check_ids(model: nn.Module, candidates: list, ids: list[int], what: str) -> None:
    missing = [i for i in ids if i >= len(candidates)]
    if missing:
        have = f"ids 0-{len(candidates) - 1}" if candidates else "none"
        raise ModelInterfaceError(f"{WHERE}.random_ltd_layer_id: {missing[0]} matches no layer: {type(model).__name__} "
                                  f"has {len(candidates)} {what} ({have}); list ids below {len(candidates)}")


def route(model: nn.Module, candidates: list[tuple[str, nn.Module]], ids: list[int], router: TokenRouter,
          mask_name: str | None, what: str) -> list[str]:
    """Attach the hooks to candidates[i] for each i in ids (again from scratch if some layers
    were routed before); returns the routed layers' names. A candidate whose module is None
    lives on another pipeline stage: it counts, and that stage routes it."""
    check_ids(model, candidates, ids, what)
    for i in ids:
        name, module = candidates[i]
        if module is not None and mask_name is not None and mask_name not in _params(module) and \
                not any(p.kind is p.VAR_KEYWORD for p in inspect.signature(module.forward).parameters.values()):
            raise ModelInterfaceError(f"{WHERE}.model_mask_name: {type(module).__name__}.forward ({name}) has no "
                                      f"argument {mask_name!r}; name its mask argument, or null if it takes none")
    for _, module in routed(model):
        module._random_ltd.detach(module)
    for i in ids:
        if candidates[i][1] is not None:
            RoutedLayer(router, i, mask_name).attach(candidates[i][1])
    return [candidates[i][0] for i in ids if candidates[i][1] is not None]


# ---- DeepSpeed's helper names -------------------------------------------------------------------
def remove_random_ltd_state_dict(state_dict) -> OrderedDict:
    """Keys without DeepSpeed's wrapper level (`.random_ltd_layer`): a DeepSpeed random-LTD
    model's state dict under its plain names. zerotrain's routed layers add no level."""
    return OrderedDict((k.replace(".random_ltd_layer", ""), v) for k, v in state_dict.items())


def save_without_random_ltd(model) -> OrderedDict:
    """The model's state dict under its plain names (an engine's module, or the model)."""
    module = model.module if hasattr(model, "module") else model
    return remove_random_ltd_state_dict(module.state_dict())


def convert_to_random_ltd(model, convert_type):
    """DeepSpeed's call: route the `convert_type` layers named by random_ltd_layer_id. Given
    the engine, it acts at once; given the model before initialize, it marks the class and
    initialize routes those layers. Returns what it was given."""
    from ..features.random_ltd import RandomLTDFeature

    feature = model.feature(RandomLTDFeature) if hasattr(model, "feature") else None
    module = model.module if hasattr(model, "module") and isinstance(model.module, nn.Module) else model
    layers_of_class(module, convert_type)  # the class is checked now, whichever way it goes
    if hasattr(model, "feature"):
        if feature is None:
            raise ModelInterfaceError("convert_to_random_ltd: random-LTD is not enabled in the config; set "
                                      f"{WHERE}.enabled (and data_routing.enabled, data_efficiency.enabled) true")
        feature.convert(module, convert_type)
    else:
        module._random_ltd_class = convert_type
    return model
