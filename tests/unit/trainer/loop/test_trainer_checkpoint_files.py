"""A checkpoint folder of `zerotrain train` is also a model folder, and its manifest covers the
model files: a save that dies while writing them leaves no checkpoint that verifies."""

from __future__ import annotations

import json

import pytest
from trainer_helpers import options, run

from zerotrain.checkpoint.store import verify_checkpoint
from zerotrain.errors import CheckpointError
from zerotrain.trainer.model import build as models


def test_model_files_are_in_the_manifest(tmp_path):
    run(options(tmp_path, save_strategy="steps", save_steps=3))
    folder = tmp_path / "out" / "checkpoint-6"
    listed = set(json.loads((folder / "manifest.json").read_text())["files"])
    assert {"model.safetensors", "zerotrain_model.json", "tokenizer.json", "model_states.pt"} <= listed
    verify_checkpoint(folder)
    models.load_model(str(folder), "clm")  # and it loads as a model folder
    data = bytearray((folder / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (folder / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checkpoint-6/model.safetensors: sha256 differs"):
        verify_checkpoint(folder)


def test_a_save_that_dies_writing_the_model_files_publishes_nothing(tmp_path, monkeypatch):
    real, calls = models.save_model, []

    def dies_on_the_second_checkpoint(folder, *a, **k):
        calls.append(folder)
        if len(calls) == 2:
            raise KeyboardInterrupt  # stands in for a kill between the engine's files and the model's
        return real(folder, *a, **k)

    monkeypatch.setattr(models, "save_model", dies_on_the_second_checkpoint)
    with pytest.raises(KeyboardInterrupt):
        run(options(tmp_path, save_strategy="steps", save_steps=3))
    out = tmp_path / "out"
    assert (out / "latest").read_text() == "checkpoint-3"
    for folder in out.glob("checkpoint-*"):  # whatever verifies holds its model
        verify_checkpoint(folder)
        assert (folder / "model.safetensors").is_file(), f"{folder.name} verifies without its model files"
    assert not (out / "checkpoint-6").exists()
