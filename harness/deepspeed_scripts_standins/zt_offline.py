"""Offline stand-ins for hub and dataset downloads, for harness/deepspeed_scripts.py.

`load_dataset` returns a small `datasets.Dataset` of generated English-like lines in the
shape of the one asked for (a "text" column, some empty lines as wikitext has); `tokenizer`
builds a word-level fast tokenizer over the same words with RoBERTa's special tokens. Both are
made here, in memory: no hub, no network, no cache."""

import random

WORDS = ("the model reads a line of text and learns to fill the masked words back in while the "
         "engine keeps its optimizer state sharded over ranks and saves a checkpoint every few "
         "steps so that a run can resume where it stopped").split()


def _lines(n=200, seed=0):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        out.append("" if i % 5 == 0 else " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 30))) + "\n")
    return out


def load_dataset(path, name=None, split=None, **_):
    import datasets

    return datasets.Dataset.from_dict({"text": _lines()})


def tokenizer(name_or_path, **_):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    vocab = {tok: i for i, tok in enumerate(specials + sorted(set(WORDS)))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", unk_token="<unk>", mask_token="<mask>")
