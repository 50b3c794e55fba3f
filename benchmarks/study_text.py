"""Real text for the curriculum and layer-drop studies: files no one here wrote that every
machine of this kind has, read as bytes (a 256-symbol vocabulary: one byte is one token).

    english   /usr/share/doc: READMEs, changelogs, copyright notices, NEWS, .txt/.md/.rst
              (gzipped ones decompressed; html, PostScript and archives left out)
    vim       the vim help files, /usr/share/vim/vim*/doc/*.txt
    python    this interpreter's standard library sources, lib/python3.X/**/*.py (no site-packages)

Each file is cut to its first 256 KiB (so no one changelog outweighs a source), files of
identical content are kept once (hash of the bytes: /usr/share/doc holds hundreds of copies
of the same licences), and only then split: a file whose content hash is 0 mod 10 is held
out. The held-out files never reach training, in either study (the fine-tuning tasks' dev
rows come from held-out Python files too).
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import torch

MAX_FILE = 256 * 1024
DOC_NAMES = ("readme", "changelog", "copyright", "news", "authors", "todo", "faq", "history", "thanks", "bugs")
DOC_SUFFIXES = {"", ".txt", ".md", ".rst", ".debian", ".text"}


def _doc_files():
    """Package by package (lazily: the quick mode reads only the first few)."""
    for package in sorted(Path("/usr/share/doc").iterdir()):
        for p in sorted(package.rglob("*")) if package.is_dir() else [package]:
            if not p.is_file() or p.is_symlink():
                continue
            name = p.name.lower()
            base = name[:-3] if name.endswith(".gz") else name
            if any(base.endswith(s) for s in (".tar", ".ps", ".pdf", ".html", ".htm")):
                continue
            if base.startswith(DOC_NAMES) or Path(base).suffix in DOC_SUFFIXES:
                yield p


def _vim_files() -> list[Path]:
    return sorted(Path("/usr/share").glob("vim/vim*/doc/*.txt"))


@functools.lru_cache(maxsize=2)
def python_files(top_only: bool = False) -> list[Path]:
    """The standard library's modules: its top folder's, then (unless top_only) its packages'."""
    root = Path(sysconfig.get_paths()["stdlib"])
    top = sorted(p for p in root.glob("*.py") if p.is_file())
    if top_only:
        return top
    deeper = sorted(p for p in root.glob("*/**/*.py") if "site-packages" not in p.parts and p.is_file())
    return top + deeper


SOURCES = {"english": _doc_files, "vim": _vim_files, "python": python_files}
QUICK_SOURCES = {**SOURCES, "python": lambda: python_files(top_only=True)}


def _read(path: Path) -> bytes | None:
    try:
        raw = path.read_bytes()
        if path.name.endswith(".gz"):
            raw = gzip.decompress(raw)
        raw = raw[:MAX_FILE]
        text = raw.decode("utf-8", errors="strict") if raw else ""
    except (OSError, EOFError, gzip.BadGzipFile, UnicodeDecodeError):
        return None
    if len(text) < 200:
        return None
    printable = sum(ch.isprintable() or ch in "\n\t" for ch in text[:4096])
    return raw if printable >= 0.97 * min(len(text), 4096) else None


def is_held_out(raw: bytes) -> bool:
    return int.from_bytes(hashlib.sha256(raw).digest()[:8], "little") % 10 == 0


@dataclass
class Corpus:
    train: torch.Tensor  # int64 byte ids, files joined by a newline
    val: torch.Tensor
    stats: dict = field(default_factory=dict)  # source -> counts

    def describe(self) -> str:
        lines = ["text read (byte-level: tokens = bytes):"]
        for src, s in self.stats.items():
            lines.append(f"  {src:8s} {s['files_seen']:5d} files found, {s['duplicates']:4d} duplicates dropped, "
                         f"{s['unreadable']:4d} unreadable/not text; train {s['train_files']} files "
                         f"{s['train_bytes']:,} tokens, held out {s['val_files']} files {s['val_bytes']:,} tokens")
        lines.append(f"  total    train {len(self.train):,} tokens, held out {len(self.val):,} tokens")
        return "\n".join(lines)


def load_corpus(sources=("english", "vim", "python"), max_files: int | None = None) -> Corpus:
    """Read, de-duplicate by content hash, then split by file. max_files (quick mode): stop
    reading a source once it has that many training files and one held-out file."""
    seen: set[bytes] = set()
    train, val, stats = [], [], {}
    for src in sources:
        files = (SOURCES if max_files is None else QUICK_SOURCES)[src]()
        s = stats[src] = dict.fromkeys(("files_seen", "duplicates", "unreadable", "train_files", "val_files",
                                        "train_bytes", "val_bytes"), 0)
        for path in files:
            if max_files is not None and s["train_files"] >= max_files and s["val_files"] >= 1:
                break
            s["files_seen"] += 1
            raw = _read(path)
            if raw is None:
                s["unreadable"] += 1
                continue
            digest = hashlib.sha256(raw).digest()
            if digest in seen:
                s["duplicates"] += 1
                continue
            seen.add(digest)
            side = "val" if is_held_out(raw) else "train"
            (val if side == "val" else train).append(raw)
            s[f"{side}_files"] += 1
            s[f"{side}_bytes"] += len(raw)
        if s["train_files"] == 0 or s["val_files"] == 0:
            raise SystemExit(f"{src} text: {s['files_seen']} files found, {s['train_files']} for training and "
                             f"{s['val_files']} held out; the studies need both from each of /usr/share/doc, "
                             "/usr/share/vim/vim*/doc/*.txt and the Python standard library's sources")
    as_tensor = lambda parts: torch.frombuffer(bytearray(b"\n".join(parts)), dtype=torch.uint8).long()  # noqa: E731
    return Corpus(as_tensor(train), as_tensor(val), stats)


def windows(stream: torch.Tensor, n: int, length: int, seed: int) -> torch.Tensor:
    """n random windows of `length` tokens, the same for every run that asks with the same seed."""
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(stream) - length, (n,), generator=g)
    return torch.stack([stream[s: s + length] for s in starts.tolist()])


def unigram_entropy(stream: torch.Tensor) -> float:
    """Nats per byte of the bytes' own frequencies: the loss of a model that ignores context,
    the plateau a language model sits on before it learns any."""
    p = torch.bincount(stream, minlength=256).double()
    p = p[p > 0] / p.sum()
    return float(-(p * p.log()).sum())


if __name__ == "__main__":
    corpus = load_corpus()
    print(corpus.describe())
    print(f"byte unigram entropy: train {unigram_entropy(corpus.train):.3f}, held out "
          f"{unigram_entropy(corpus.val):.3f} nats per byte")
