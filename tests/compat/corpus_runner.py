"""Run one corpus config the way a user would: HF-style files (any "auto") through the
trainer's filler at zerotrain train's defaults, the others straight into initialize; then
one optimizer step of a tiny model. Returns "loads" or the ConfigError's problems, one line each."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch

import zerotrain
from zerotrain.config import read_config
from zerotrain.config.loader import problems_of
from zerotrain.errors import ConfigError

HIDDEN = 8  # the tiny model's width: what the trainer's "auto" bucket sizes are computed from


class Tiny(torch.nn.Module):
    """Two linear layers; takes (and ignores) the keyword arguments features pass."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.Linear(HIDDEN, 1)

    def forward(self, x, progressive_layer_drop=False, pld_theta=1.0, curriculum_seqlen=None):
        return self.b(torch.tanh(self.a(x)))


class TokenLayer(torch.nn.Module):
    """A token-wise residual layer, what a random-LTD config's convert_to_random_ltd routes."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(HIDDEN, HIDDEN)

    def forward(self, h, attention_mask=None):
        return h + torch.tanh(self.lin(h))


class Layered(torch.nn.Module):
    """A stack of `n` TokenLayers over (batch, seq, HIDDEN) or (seq, batch, HIDDEN) inputs."""

    def __init__(self, n: int):
        super().__init__()
        self.layers = torch.nn.ModuleList(TokenLayer() for _ in range(n))
        self.head = torch.nn.Linear(HIDDEN, 1)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def _random_ltd(config: dict) -> dict | None:
    block = ((config.get("data_efficiency") or {}).get("data_routing") or {}).get("random_ltd") or {}
    return block if block.get("enabled") else None


def _has_auto(node) -> bool:
    if isinstance(node, dict):
        return any(_has_auto(v) for v in node.values())
    if isinstance(node, list):
        return any(_has_auto(v) for v in node)
    return node == "auto"


def _through_trainer(path: str) -> dict:
    from zerotrain.trainer.args import TrainingArguments
    from zerotrain.trainer.ds_config import build_deepspeed_config, check_no_auto_left, fill_schedule

    args = TrainingArguments(output_dir=".", deepspeed=path)
    ds = build_deepspeed_config(args, set(), 1, HIDDEN, 16).config
    check_no_auto_left(fill_schedule(ds, 0, 100))
    return ds


def _nvme_paths(node, folder: str) -> None:
    """NVMe offload needs a real directory: the configs name their own cluster's."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "nvme_path":
                node[k] = folder
            else:
                _nvme_paths(v, folder)


def run_config(path: str) -> str:
    try:
        config = _through_trainer(path) if _has_auto(read_config(path)) else read_config(path)
        with tempfile.TemporaryDirectory() as folder:
            _nvme_paths(config, folder)
            if config.get("optimizer") is None:
                config["optimizer"] = {"type": "AdamW", "params": {"lr": 1e-3}}  # the user's own, as with a script
            torch.manual_seed(0)
            ltd = _random_ltd(config)
            model = Tiny() if ltd is None else Layered(ltd["total_layer_num"])
            engine, _, _, _ = zerotrain.initialize(model=model, config=config)
            if ltd is not None:  # as the examples do after initialize
                from zerotrain.data_efficiency import convert_to_random_ltd

                convert_to_random_ltd(engine, TokenLayer)
            try:
                dtype = torch.float16 if engine.config.fp16.enabled else \
                    torch.bfloat16 if engine.config.bf16.enabled else torch.float32
                for _ in range(engine.gradient_accumulation_steps()):
                    shape = (engine.train_micro_batch_size_per_gpu(), HIDDEN)
                    if ltd is not None:  # a sequence of 16
                        shape = (shape[0], 16, HIDDEN) if ltd["hidden_state_order"] == "batch_seq_dim" else \
                            (16, shape[0], HIDDEN)
                    x = torch.randn(*shape, dtype=dtype)
                    engine.backward(engine(x).float().pow(2).mean())
                    engine.step()
                assert engine.global_steps == 1
            finally:
                engine.destroy()
        return "loads"
    except ConfigError as err:
        return "\n".join(problems_of(err))


if __name__ == "__main__":
    import sys

    print(json.dumps({p: run_config(p) for p in sys.argv[1:]}, indent=1))
