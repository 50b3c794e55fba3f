"""Hub ids for the model and tokenizer options, resolved from an HF cache folder the test
builds (HF_HOME in tmp_path, the hub's layout models--org--name/snapshots/<rev>, refs/main)
with HF_HUB_OFFLINE=1: never the network."""

from __future__ import annotations

import pytest
import transformers

from zerotrain.errors import ConfigError
from zerotrain.trainer.data.tokenizer import byte_tokenizer, load_tokenizer
from zerotrain.trainer.model import build as models
from zerotrain.trainer.plan import Options
from zerotrain.trainer.preflight import preflight

MAIN, OTHER = "a" * 40, "b" * 40


def cache_model(home, repo: str, revision: str, layers: int, main: bool = True) -> None:
    """A tiny GPT-2 and its tokenizer saved where the hub cache keeps a snapshot."""
    repo_dir = home / "hub" / f"models--{repo.replace('/', '--')}"
    snapshot = repo_dir / "snapshots" / revision
    config = transformers.GPT2Config(n_embd=16, n_layer=layers, n_head=2, n_positions=64, vocab_size=300)
    transformers.GPT2LMHeadModel(config).save_pretrained(snapshot)
    byte_tokenizer().save_pretrained(snapshot)
    if main:
        (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
        (repo_dir / "refs" / "main").write_text(revision)


@pytest.fixture
def hub(tmp_path, monkeypatch):
    home = tmp_path / "hf"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cache_model(home, "org/tiny", MAIN, layers=1)
    cache_model(home, "org/tiny", OTHER, layers=2, main=False)
    return home


def test_a_hub_id_loads_from_the_cache(hub, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # "org/tiny" is no local folder here
    model, info = models.build_model("org/tiny", None, "clm", None)
    assert model.config.n_layer == 1 and info.max_positions == 64
    model, _ = models.build_model("org/tiny", None, "clm", None, revision=OTHER)  # --model_revision
    assert model.config.n_layer == 2
    assert load_tokenizer("org/tiny").get_vocab() == byte_tokenizer().get_vocab()
    assert load_tokenizer(None, "org/tiny").get_vocab() == byte_tokenizer().get_vocab()  # the model's own
    assert models.positions_hint("org/tiny", None) == 64
    train = tmp_path / "train.txt"
    train.write_text("the quick brown fox\n", encoding="utf-8")
    values = {"model_name_or_path": "org/tiny", "tokenizer_name_or_path": "org/tiny", "train_file": str(train),
              "output_dir": str(tmp_path / "out"), "model_revision": OTHER, "trust_remote_code": False}
    preflight(Options.parse(values), 1)  # the trainer's check passes, offline


def test_an_id_neither_cached_nor_reachable_is_one_line(hub, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    for call, option in ((lambda: models.build_model("meta-llama/Llama-3.2-1B", None, "clm", None),
                          "model_name_or_path"), (lambda: load_tokenizer("roberta-base"), "tokenizer_name_or_path")):
        with pytest.raises(ConfigError) as err:
            call()
        text = str(err.value)
        assert text.startswith(f"{option} ") and "\n" not in text
        assert f"not in the HF cache {hub / 'hub'} (HF_HUB_OFFLINE is set)" in text and "hf download" in text
    with pytest.raises(ConfigError, match=r"org/tiny@c{40}: no local folder .* --revision c{40}"):
        models.build_model("org/tiny", None, "clm", None, revision="c" * 40)


def test_an_id_not_in_the_cache_is_downloaded_and_says_so(hub, monkeypatch, tmp_path, capsys):
    import huggingface_hub

    from zerotrain.trainer.model.hub import local_folder

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    calls = []

    def fake(repo_id, local_files_only=False, **kwargs):  # the hub's call, without the network
        calls.append((repo_id, local_files_only, kwargs["revision"], kwargs["cache_dir"]))
        if local_files_only:
            raise huggingface_hub.errors.LocalEntryNotFoundError("not cached")
        return str(tmp_path / "fetched")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    assert local_folder("roberta-base", "model_name_or_path", "v1") == tmp_path / "fetched"
    assert calls == [("roberta-base", True, "v1", str(hub / "hub")), ("roberta-base", False, "v1", str(hub / "hub"))]
    assert "zerotrain: downloading roberta-base (v1) from the Hugging Face hub" in capsys.readouterr().out
