"""`zerotrain merge-lora ADAPTER_DIR --output_dir OUT [--base BASE_DIR]`: fold the adapter
into its base model (W + alpha/r B A) and write a plain model folder, with no peft needed to
load it."""

from __future__ import annotations

from pathlib import Path


def add_arguments(parser) -> None:
    parser.add_argument("adapter_dir", help="folder with adapter_config.json (a run's output_dir or checkpoint)")
    parser.add_argument("--output_dir", required=True, help="where the merged model goes")
    parser.add_argument("--base", default=None,
                        help="base model folder (default: base_model_name_or_path in adapter_config.json)")
    parser.add_argument("--task", default=None, choices=("clm", "sft", "mlm", "classification"),
                        help="head of the base model (default: the adapter's recorded task, else clm)")


def run(args) -> int:
    from transformers.utils import logging as hf_logging

    from ..errors import ConfigError
    from ..trainer.data.tokenizer import load_tokenizer
    from ..trainer.model import build as models
    from ..trainer.model import lora

    adapter = Path(args.adapter_dir).expanduser()
    meta, _ = lora.read_adapter(adapter)
    base = args.base or meta.get("base_model_name_or_path")
    if not base:
        raise ConfigError(f"{adapter}: the adapter names no base model; pass --base FOLDER")
    task = args.task or meta.get("task") or "clm"
    # the command's own line says what it read and wrote: no loading or writing bars around it
    hf_logging.disable_progress_bar()
    model, info = models.load_model(base, task, meta.get("num_labels"))
    lora.load_adapter(model, adapter)
    merged = lora.merge(model)
    out = Path(args.output_dir).expanduser()
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"output_dir {out} is not empty; choose a new folder")
    tokenizer = load_tokenizer(str(adapter) if (adapter / "tokenizer.json").is_file() else None, base)
    models.save_model(out, model, info, model.state_dict(), tokenizer)
    print(f"merged {merged} LoRA layers of {adapter} into {base}; wrote {out}", flush=True)
    return 0
