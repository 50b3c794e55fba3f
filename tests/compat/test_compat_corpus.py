"""The compatibility corpus: real DeepSpeed configs from public repositories (provenance.json
says where each came from, at which commit, and what DeepSpeed 0.19.8 makes of it). Each
runs as its user would run it (corpus_runner.py): HF-style files through the trainer's
filler, the others straight into initialize, then one optimizer step of a tiny model. Each
must load, or fail with the one line listed for it; and a config DeepSpeed accepts may only
fail on a key that zerotrain refuses by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from corpus_runner import run_config

from zerotrain.config.base import REFUSED, field_class, spellings
from zerotrain.config.loader import _model_at

HERE = Path(__file__).resolve().parent
CORPUS = json.loads((HERE / "provenance.json").read_text(encoding="utf-8"))


@pytest.fixture(autouse=True)
def _single_process(monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)


def _refused_by_name(message: str) -> bool:
    parts = message.split(":", 1)[0].split(".")
    model = _model_at(tuple(parts[:-1]))
    name = next((n for n in model.model_fields if parts[-1] in spellings(n, model)), None) if model else None
    return name is not None and field_class(model.model_fields[name]).get("effect") == REFUSED


def _needs_more_processes(message: str) -> bool:
    """A config for more processes than the corpus's one (tensor parallelism): a launch to
    change, named by its key, not a refusal."""
    return message.startswith("tensor_parallel.autotp_size") and "launch a multiple of" in message


def test_corpus_is_whole():
    files = {p.name for p in (HERE / "configs").iterdir()}
    assert files == {c["file"] for c in CORPUS} and len(files) >= 40
    for entry in CORPUS:
        assert entry["repo"].count("/") == 1 and len(entry["commit"]) == 40 and entry["path"], entry


@pytest.mark.parametrize("entry", CORPUS, ids=[c["file"] for c in CORPUS])
def test_config_runs_or_is_refused_as_listed(entry):
    got = run_config(str(HERE / "configs" / entry["file"]))
    expected = entry["zerotrain"]
    if expected == "loads":
        assert got == "loads"
        return
    assert got.startswith(expected.removeprefix("error: ")), got  # the first problem is the one listed
    if entry["deepspeed_0_19_8"] == "accepts":  # the promise: only features refused by name fail
        for line in got.splitlines():
            assert _refused_by_name(line) or _needs_more_processes(line), \
                f"DeepSpeed 0.19.8 accepts this config; zerotrain says: {got}"
