"""Tokenizers without a download: the built-in byte-level one, a BPE trained on local files,
or a user's tokenizer folder / tokenizer.json, all as HF `PreTrainedTokenizerFast`.

    byte-level:   256 byte symbols + <|endoftext|> <|pad|> <|mask|>; any text, no unknowns
    trained BPE:  the same bytes and specials, plus merges learnt from the given files
"""

from __future__ import annotations

from pathlib import Path

from ...errors import ConfigError

SPECIALS = {"eos_token": "<|endoftext|>", "pad_token": "<|pad|>", "mask_token": "<|mask|>"}


def _wrap(tok):
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=SPECIALS["eos_token"], **SPECIALS)
    fast.model_max_length = 1 << 30  # the model decides the length, not the tokenizer
    return fast


def byte_tokenizer():
    """Every byte is one token: a tokenizer that needs no training and no files."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(sorted(alphabet))}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIALS.values()))
    return _wrap(tok)


def train_bpe(texts, vocab_size: int):
    """A byte-level BPE learnt from an iterable of strings (HF tokenizers' trainer)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS.values()),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return _wrap(tok)


def check_tokenizer_source(name_or_path: str, revision: str | None = None) -> Path:
    """The tokenizer's folder or file; a hub id is its snapshot in the HF cache (fetched if not there)."""
    from ..model.hub import TOKENIZER_FILES, local_folder

    path = local_folder(name_or_path, "tokenizer_name_or_path", revision, files=TOKENIZER_FILES)
    if not path.exists():
        raise ConfigError(f"tokenizer_name_or_path {path}: does not exist; give a folder, a tokenizer.json or a "
                          "hub id")
    return path


def load_tokenizer(name_or_path: str | None, model_dir: str | None = None, revision: str | None = None,
                   trust_remote_code: bool = False):
    """The tokenizer for a run: explicit path or hub id, else the model's (folder or hub id),
    else byte-level."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from ..model.hub import local_folder

    if name_or_path in (None, "", "byte"):
        model_dir = str(local_folder(model_dir, "model_name_or_path", revision)) if model_dir else None
        if model_dir and any((Path(model_dir) / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
            name_or_path = model_dir
        else:
            return byte_tokenizer()
    path = check_tokenizer_source(name_or_path, revision)
    try:
        if path.is_file():
            tok = PreTrainedTokenizerFast(tokenizer_file=str(path))
            vocab = tok.get_vocab()
            for key, names in (("eos_token", ("<|endoftext|>", "</s>", "[SEP]")),
                               ("pad_token", ("<|pad|>", "<pad>", "[PAD]")),
                               ("mask_token", ("<|mask|>", "<mask>", "[MASK]")),
                               ("unk_token", ("<unk>", "[UNK]"))):
                found = next((n for n in names if n in vocab), None)
                if found:
                    tok.add_special_tokens({key: found})
        else:
            tok = AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:
        raise ConfigError(f"tokenizer_name_or_path {path}: cannot load ({str(e).splitlines()[0]})") from None
    if tok.pad_token is None and tok.eos_token is not None:
        tok.pad_token = tok.eos_token  # GPT-2 style tokenizers have no pad token
    return tok
