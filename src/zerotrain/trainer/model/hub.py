"""Hub ids for --model_name_or_path and --tokenizer_name_or_path (`roberta-base`,
`meta-llama/Llama-3.2-1B`), resolved as transformers resolves them, to a folder the rest of
the trainer reads like any local one:

    an existing local path             -> itself
    org/name or name, not a local path -> its snapshot in the HF cache ($HF_HUB_CACHE, else
                                          $HF_HOME/hub, else ~/.cache/huggingface/hub), at
                                          --model_revision (branch, tag or commit; main)
        in the cache                   -> used as it is: nothing is fetched
        not in the cache               -> downloaded, with a line saying so and the hub's
                                          progress bars; where HF_HUB_OFFLINE=1 is set or
                                          the hub cannot be reached, one line saying what to do

Custom model code in a snapshot runs only with --trust_remote_code, as in transformers.
The launcher's preflight resolves the ids before any rank starts, so the ranks find them in
the cache.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ...errors import ConfigError

_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
# weights in formats torch does not read: never fetched
_SKIP = ["*.msgpack", "*.h5", "*.ot", "*.onnx", "*.onnx_data", "*.tflite", "*.gguf", "original/*", "onnx/*"]
TOKENIZER_FILES = ["tokenizer*", "vocab*", "merges.txt", "special_tokens_map.json", "added_tokens.json", "*.model",
                   "*.tiktoken", "chat_template*", "config.json"]


def is_hub_id(text: str) -> bool:
    """`name` or `org/name` that names no local path."""
    return bool(_ID.fullmatch(text)) and ".." not in text and not Path(text).expanduser().exists()


def cache_dir() -> Path:
    """The HF hub cache, read from the environment at each call (as huggingface_hub reads it)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def local_folder(name_or_path: str, what: str, revision: str | None = None, files: list[str] | None = None) -> Path:
    """The folder `name_or_path` stands for (`what`: the option, for messages; `files`: only
    these patterns are fetched, e.g. TOKENIZER_FILES)."""
    if not is_hub_id(name_or_path):
        return Path(name_or_path).expanduser()
    from huggingface_hub import snapshot_download

    cache, rev = cache_dir(), revision or "main"
    kwargs = dict(repo_id=name_or_path, revision=rev, cache_dir=str(cache), allow_patterns=files,
                  ignore_patterns=_SKIP)
    try:
        return Path(snapshot_download(**kwargs, local_files_only=True))
    except (OSError, ValueError):
        pass  # not in the cache
    fix = (f"download it where the hub is reachable (hf download {name_or_path}"
           f"{'' if rev == 'main' else f' --revision {rev}'}), point HF_HOME at a cache that holds it, or give a "
           f"local folder")
    where = f"{what} {name_or_path}{'' if rev == 'main' else f'@{rev}'}: no local folder of that name, and not in " \
            f"the HF cache {cache}"
    if offline():
        raise ConfigError(f"{where} (HF_HUB_OFFLINE is set); {fix}")
    if os.environ.get("RANK", "0") == "0":
        print(f"zerotrain: downloading {name_or_path} ({rev}) from the Hugging Face hub into {cache}", flush=True)
    try:
        return Path(snapshot_download(**kwargs))
    except Exception as e:  # network, authentication, unknown repo or revision: all end the same way
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"{where}, and the hub could not give it ({reason[:160]}); {fix}") from None
