"""Which model a run trains, and how a trained one is written and read back.

    model_name_or_path   a local folder: an HF model (config.json + weights) or one of ours
                         (zerotrain_model.json + model.safetensors); or a hub id, resolved to
                         its snapshot folder in the HF cache (hub.py)
    model_config         from scratch: a preset name or a JSON/YAML config file
    init_from            after building: copy matching weights (strict=False), report the rest

Only hub.py downloads: the HF classes are built from configs or read from local folders.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import torch
from torch import nn

from ...errors import ConfigError
from ...zero.stage3.init import Init, is_partitioned
from ...models import GPT, BertConfig, PreLNBertClassifier, PreLNBertMLM, GPTConfig
from ...models.bert import bert_config_keys, is_bert_recipe_config
from .hub import local_folder

log = logging.getLogger("zerotrain")

OURS_FILE = "zerotrain_model.json"
WEIGHTS_FILE = "model.safetensors"

PRESETS = {
    "gpt-tiny": {"zerotrain_model": "gpt", "n_embd": 64, "n_layer": 2, "n_head": 2, "n_positions": 128},
    "gpt-small": {"zerotrain_model": "gpt", "n_embd": 128, "n_layer": 4, "n_head": 4, "n_positions": 256},
    "bert-tiny": {"zerotrain_model": "bert", "n_embd": 64, "n_layer": 2, "n_head": 2, "n_positions": 128},
    "bert-small": {"zerotrain_model": "bert", "n_embd": 128, "n_layer": 4, "n_head": 4, "n_positions": 256},
    # the PLD recipe's BERT-Base shape (Pre-LN); the vocabulary comes from the tokenizer
    "bert-base": {"zerotrain_model": "bert", "n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": 3072,
                  "n_positions": 512, "type_vocab_size": 2, "dropout": 0.1, "attn_dropout": 0.1,
                  "activation": "gelu", "init_std": 0.02},
    "gpt2-tiny": {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 2, "n_positions": 128},
    "llama-tiny": {"model_type": "llama", "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128},
}
_OURS = {"gpt": (GPTConfig, {"clm": GPT, "sft": GPT}),
         "bert": (BertConfig, {"mlm": PreLNBertMLM, "classification": PreLNBertClassifier})}


@dataclasses.dataclass(frozen=True)
class Partition:
    """ZeRO stage 3's cut of a model being loaded: this rank, of how many, its chunks kept in
    which dtype (None: as built)."""

    rank: int
    world_size: int
    dtype: torch.dtype | None = None


@dataclasses.dataclass
class ModelInfo:
    """What the rest of the run needs to know about the model."""

    kind: str  # "gpt", "bert" or "hf"
    task: str
    max_positions: int | None
    hidden_size: int | None
    config: dict  # ours: the dataclass fields; hf: config.to_dict()
    lora_config: dict | None = None  # with a LoRA adapter on: its config, saved beside the adapter


def _read_mapping(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
        if path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ConfigError(f"model_config {path}: cannot read ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"model_config {path}: expected a mapping of config keys")
    return data


def _build_ours(spec: dict, task: str, tokenizer, num_labels: int | None) -> tuple[nn.Module, ModelInfo]:
    spec = dict(spec)
    name = spec.pop("zerotrain_model")
    if name not in _OURS:
        raise ConfigError(f"zerotrain_model: should be gpt or bert, got {name!r}")
    cfg_cls, heads = _OURS[name]
    if name == "bert":
        spec = bert_config_keys(spec)
    if task not in heads:
        raise ConfigError(f"task {task}: the zerotrain {name} model supports {', '.join(heads)}; use "
                          f"{'a bert model' if name == 'gpt' else 'a gpt model'} or an HF config")
    names = {f.name for f in dataclasses.fields(cfg_cls)}
    unknown = sorted(set(spec) - names)
    if unknown:
        raise ConfigError(f"model_config: unknown key {unknown[0]!r} for the zerotrain {name} model; "
                          f"keys are {', '.join(sorted(names))}")
    if tokenizer is not None:
        given = spec.get("vocab_size")
        if given is not None and (isinstance(given, bool) or not isinstance(given, int) or given < len(tokenizer)):
            raise ConfigError(f"model_config: vocab_size {given!r} is smaller than the tokenizer's {len(tokenizer)} "
                              "tokens; raise it, or leave it out to take the tokenizer's")
        spec["vocab_size"] = given or len(tokenizer)  # a larger vocabulary than the tokenizer's is kept
    if task == "classification" and num_labels:
        spec["num_labels"] = num_labels
    cfg = cfg_cls(**spec)
    model = heads[task](cfg)
    return model, ModelInfo(name, task, cfg.n_positions, cfg.n_embd, dataclasses.asdict(cfg))


def _hf_class(task: str):
    import transformers

    return {"clm": transformers.AutoModelForCausalLM, "sft": transformers.AutoModelForCausalLM,
            "mlm": transformers.AutoModelForMaskedLM,
            "classification": transformers.AutoModelForSequenceClassification}[task]


def _hf_info(model, task: str) -> ModelInfo:
    cfg = model.config
    positions = next((getattr(cfg, k) for k in ("n_positions", "max_position_embeddings") if hasattr(cfg, k)), None)
    hidden = next((getattr(cfg, k) for k in ("hidden_size", "n_embd") if hasattr(cfg, k)), None)
    return ModelInfo("hf", task, positions, hidden, cfg.to_dict())


def _build_hf_from_config(spec: dict, task: str, tokenizer, num_labels: int | None):
    import transformers

    spec = dict(spec)
    model_type = spec.pop("model_type")
    try:
        cfg = transformers.AutoConfig.for_model(model_type, **spec)
    except (ValueError, KeyError) as e:
        raise ConfigError(f"model_config: {str(e).splitlines()[0]}") from None
    if tokenizer is not None:
        cfg.vocab_size = len(tokenizer)
        cfg.pad_token_id = tokenizer.pad_token_id
        if tokenizer.eos_token_id is not None:
            cfg.eos_token_id = cfg.bos_token_id = tokenizer.eos_token_id
    if task == "classification" and num_labels:
        cfg.num_labels = num_labels
    try:
        model = _hf_class(task).from_config(cfg)
    except ValueError as e:
        raise ConfigError(f"model_config: {model_type} has no {task} model ({str(e).splitlines()[0]})") from None
    return model, _hf_info(model, task)


def check_model_source(model_name_or_path: str | None, model_config: str | None, revision: str | None = None) -> None:
    """The model options name something that exists (checked before anything is loaded); a
    hub id is fetched into the HF cache here if it is not there yet."""
    if model_name_or_path and model_config:
        raise ConfigError("model_name_or_path and model_config both given: start from a folder or from a "
                          "config, not both")
    if model_name_or_path:
        folder = local_folder(model_name_or_path, "model_name_or_path", revision)
        if not folder.is_dir():
            raise ConfigError(f"model_name_or_path {folder}: not a folder; give a model folder or a hub id")
        if not (folder / OURS_FILE).is_file() and not (folder / "config.json").is_file():
            raise ConfigError(f"model_name_or_path {folder}: no config.json or {OURS_FILE}; not a model folder")
        return
    if not model_config:
        raise ConfigError("no model: pass --model_name_or_path FOLDER or --model_config "
                          f"({', '.join(PRESETS)} or a config file)")
    if model_config not in PRESETS and not Path(model_config).expanduser().is_file():
        from ...errors import did_you_mean

        raise ConfigError(f"model_config {model_config!r}: neither a preset ({', '.join(PRESETS)}) nor an "
                          f"existing file{did_you_mean(model_config, PRESETS)}")


def build_model(model_name_or_path: str | None, model_config: str | None, task: str, tokenizer,
                num_labels: int | None = None, partition: Partition | None = None, revision: str | None = None,
                trust_remote_code: bool = False) -> tuple[nn.Module, ModelInfo]:
    """`partition`: ZeRO stage 3, where a saved model is built under zero.Init and its weights
    streamed into each rank's chunks (streamed_load.py). `revision`: a hub id's."""
    check_model_source(model_name_or_path, model_config, revision)
    if model_name_or_path:
        return load_model(model_name_or_path, task, num_labels, partition, revision, trust_remote_code)
    spec = PRESETS[model_config] if model_config in PRESETS else _read_mapping(Path(model_config).expanduser())
    if "zerotrain_model" in spec:
        return _build_ours(spec, task, tokenizer, num_labels)
    if "model_type" in spec:
        return _build_hf_from_config(spec, task, tokenizer, num_labels)
    if is_bert_recipe_config(spec):  # the PLD recipe's bert_model_config: our Pre-LN BERT
        return _build_ours({"zerotrain_model": "bert", **spec}, task, tokenizer, num_labels)
    raise ConfigError("model_config: needs \"model_type\" (an HF config), \"zerotrain_model\": gpt|bert, or BERT "
                      "config keys (hidden_size, num_hidden_layers, ...)")


# ---- folders -------------------------------------------------------------------------------
def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """Model weights of a folder we or HF wrote, or of a training checkpoint (stages 0-2)."""
    from safetensors.torch import load_file

    from ...checkpoint.store import load_file as load_checkpoint_file

    if (folder / WEIGHTS_FILE).is_file():
        return load_file(str(folder / WEIGHTS_FILE))
    if (folder / "pytorch_model.bin").is_file():
        return torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    if (folder / "model_states.pt").is_file():
        return load_checkpoint_file(folder, "model_states.pt")["module"]
    raise ConfigError(f"{folder}: no model weights ({WEIGHTS_FILE}, pytorch_model.bin or model_states.pt)")


def load_model(path_text: str, task: str, num_labels: int | None = None, partition: Partition | None = None,
               revision: str | None = None, trust_remote_code: bool = False) -> tuple[nn.Module, ModelInfo]:
    """A model folder, or a hub id's snapshot folder, read into a model for `task`."""
    check_model_source(path_text, None, revision)
    folder = local_folder(path_text, "model_name_or_path", revision)
    if (folder / OURS_FILE).is_file():
        meta = json.loads((folder / OURS_FILE).read_text(encoding="utf-8"))
        spec = {"zerotrain_model": meta["model"], **meta["config"]}
        if task == "classification" and num_labels:
            spec["num_labels"] = num_labels
        strict = meta.get("task") == task
        if partition is None:
            model, info = _build_ours(spec, task, None, None)
            load_matching(model, read_weights(folder), str(folder), strict=strict)
            return model, info
        with Init(dtype=partition.dtype):
            model, info = _build_ours(spec, task, None, None)
        _stream(model, folder, partition, strict)
        return model, info
    kwargs = {"num_labels": num_labels} if task == "classification" and num_labels else {}
    kwargs["trust_remote_code"] = trust_remote_code
    try:
        if partition is None:
            model = _hf_class(task).from_pretrained(str(folder), **kwargs)
        else:  # from_pretrained would hold the whole model on every rank
            import transformers

            config = transformers.AutoConfig.from_pretrained(str(folder), **kwargs)
            with Init(dtype=partition.dtype):
                model = _hf_class(task).from_config(config)
    except (OSError, ValueError) as e:
        hint = "; pass --trust_remote_code to run it" if "trust_remote_code" in str(e) else ""
        raise ConfigError(f"model_name_or_path {folder}: cannot load ({str(e).splitlines()[0]}){hint}") from None
    if partition is not None:
        _stream(model, folder, partition, strict=False)
    return model, _hf_info(model, task)


def _stream(model: nn.Module, folder: Path, partition: Partition, strict: bool) -> None:
    from .streamed_load import stream_weights

    missing, unexpected = stream_weights(model, folder, partition.rank, partition.world_size)
    if strict and (missing or unexpected):
        raise ConfigError(f"{folder}: weights do not match the model (missing {missing[:3]}, "
                          f"unexpected {unexpected[:3]})")
    if missing or unexpected:
        log.warning(f"model_name_or_path {folder}: newly initialised: {', '.join(missing) or 'none'}; "
                    f"not used: {', '.join(unexpected) or 'none'}")


def _tied_aliases(model: nn.Module) -> set[str]:
    seen, aliases = {}, set()
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            aliases.add(name)
        seen.setdefault(id(p), name)
    return aliases


def load_matching(model: nn.Module, state: dict, source: str, strict: bool = False) -> tuple[list, list]:
    """load_state_dict(strict=False) that ignores tied copies and says what did not match; a
    weight of another shape is an error naming it (torch would raise a page of size mismatches)."""
    own = model.state_dict()
    for name, tensor in state.items():
        if name in own and tuple(own[name].shape) != tuple(tensor.shape):
            raise ConfigError(f"{source}: {name} has shape {tuple(tensor.shape)} there and {tuple(own[name].shape)} in "
                              "this model; build the model with the config (and tokenizer) those weights were "
                              "trained with")
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if k not in _tied_aliases(model)]
    if strict and (missing or unexpected):
        raise ConfigError(f"{source}: weights do not match the model (missing {missing[:3]}, "
                          f"unexpected {unexpected[:3]})")
    return missing, unexpected


def check_init_from(path_text: str) -> Path:
    folder = Path(path_text).expanduser()
    if not folder.is_dir():
        raise ConfigError(f"init_from {folder}: not a folder")
    return folder


def init_from(model: nn.Module, path_text: str, rank: int = 0, world_size: int = 1) -> None:
    folder = check_init_from(path_text)
    if any(is_partitioned(p) for p in model.parameters()):  # built under zero.Init: into each rank's chunks
        from .streamed_load import stream_weights

        missing, unexpected = stream_weights(model, folder, rank, world_size)
    else:
        missing, unexpected = load_matching(model, read_weights(folder), str(folder))
    if rank == 0:
        print(f"init_from {folder}: loaded with strict=False\n  missing keys (newly initialised): "
              f"{', '.join(missing) or 'none'}\n  unexpected keys (ignored): {', '.join(unexpected) or 'none'}",
              flush=True)


def save_model(folder: Path, model: nn.Module, info: ModelInfo, state: dict, tokenizer=None) -> None:
    """Write weights + config (+ tokenizer) so load_model / from_pretrained can read them back."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    if info.kind == "hf":
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # one bar per save would clutter the training log
        model.save_pretrained(str(folder), state_dict=state)
    else:
        aliases = _tied_aliases(model)
        tensors = {k: v.detach().contiguous().cpu() for k, v in state.items() if k not in aliases}
        save_file(tensors, str(folder / WEIGHTS_FILE))
        _write_ours_meta(folder, info)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(folder))


def _write_ours_meta(folder: Path, info: ModelInfo) -> None:
    meta = {"model": info.kind, "task": info.task, "config": info.config}
    (folder / OURS_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")


def save_model_streamed(folder: Path, model: nn.Module, info: ModelInfo, entries: list, writer: bool,
                        tokenizer=None) -> None:
    """save_model for a model no rank holds whole (ZeRO stage 3): the weights written into
    model.safetensors one tensor at a time as each is gathered (`entries`, the engine's
    module_state_entries), so saving never holds the whole model. Every rank calls it; only
    `writer` writes, the others take part in each tensor's gather."""
    from ...checkpoint.safetensors_out import write_safetensors

    aliases = _tied_aliases(model)  # tied copies written once, as save_pretrained does
    entries = [e for e in entries if e[0] not in aliases]
    if not writer:
        for *_, fetch in entries:
            fetch()
        return
    folder.mkdir(parents=True, exist_ok=True)
    write_safetensors(entries, folder / WEIGHTS_FILE, overwrite=True)
    if info.kind == "hf":
        model.config.architectures = [type(model).__name__]
        model.config.save_pretrained(str(folder))
        if model.can_generate() and getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(str(folder))
    else:
        _write_ours_meta(folder, info)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(folder))


def positions_hint(model_name_or_path: str | None, model_config: str | None, revision: str | None = None) -> int | None:
    """The model's position count before building it (the default block size needs it)."""
    spec = None
    if model_config in PRESETS:
        spec = PRESETS[model_config]
    elif model_config and Path(model_config).is_file():
        spec = _read_mapping(Path(model_config))
    elif model_name_or_path:
        folder = local_folder(model_name_or_path, "model_name_or_path", revision)
        for name in (OURS_FILE, "config.json"):
            if (folder / name).is_file():
                data = json.loads((folder / name).read_text(encoding="utf-8"))
                spec = data.get("config", data)
                break
    if not spec:
        return None
    for key in ("n_positions", "max_position_embeddings"):
        if key in spec:
            return int(spec[key])
    kind = spec.get("zerotrain_model")
    if kind in ("gpt", "bert"):
        return (GPTConfig if kind == "gpt" else BertConfig)().n_positions
    return None  # an HF config without the key: checked once the model is built
