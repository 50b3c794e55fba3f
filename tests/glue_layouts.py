"""GLUE task folders as GLUE distributes them, written small: each task's real header row (CoLA's
train/dev files have none), MRPC's byte-order mark, MNLI's train (12 fields) and dev (16 fields,
label1..label5 then gold_label) layouts with dev_matched/dev_mismatched, STS-B's score column,
stray quote characters inside sentences (which CSV quoting would swallow), and a QQP row cut
short. The labels follow a rule the text shows, so a model can learn them.

    write_task(root, "mrpc", n_train=40, n_dev=16) -> root/MRPC/{train,dev}.tsv, and the rows
"""

from __future__ import annotations

import random
from pathlib import Path

WORDS = "the a cat dog runs sits on under big small red blue house tree river stone".split()
HEADERS = {
    "sst2": ["sentence", "label"],
    "mrpc": ["\ufeffQuality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
    "qqp": ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
    "stsb": ["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2", "score"],
    "mnli": ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
             "sentence1_parse", "sentence2_parse", "sentence1", "sentence2", "label1", "gold_label"],
    "mnli_dev": ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
                 "sentence1_parse", "sentence2_parse", "sentence1", "sentence2", "label1", "label2", "label3",
                 "label4", "label5", "gold_label"],
    "qnli": ["index", "question", "sentence", "label"],
    "rte": ["index", "sentence1", "sentence2", "label"],
    "wnli": ["index", "sentence1", "sentence2", "label"],
}
FOLDERS = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "qqp": "QQP", "stsb": "STS-B", "mnli": "MNLI",
           "qnli": "QNLI", "rte": "RTE", "wnli": "WNLI"}
NLI = ("entailment", "neutral", "contradiction")


def _sentence(rng: random.Random, quote: bool) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(3, 9))]
    if quote:  # GLUE's own: an unbalanced quote, and one opening a field
        words.insert(rng.randrange(len(words)), '"')
    return " ".join(words)


def rows(task: str, n: int, seed: int, dev: bool = False) -> list[tuple]:
    """(sentence, second sentence or None, label as the file writes it) for n rows."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        a = _sentence(rng, quote=i % 3 == 0)
        if task == "cola":
            label = rng.randint(0, 1)
            out.append((("good " if label else "bad ") + a, None, str(label)))
        elif task == "sst2":
            label = rng.randint(0, 1)
            out.append((a + (" great" if label else " awful"), None, str(label)))
        elif task == "stsb":
            same = rng.randint(0, 5)
            words = a.split()
            b = " ".join(words[: max(1, len(words) * same // 5)])
            out.append((a, b, f"{same * 0.8 + rng.random() * 0.99:.3f}"))
        else:
            label = rng.randint(0, 2 if task == "mnli" else 1)
            b = a if label == 0 else _sentence(rng, quote=False)
            names = {"mnli": NLI, "qnli": ("entailment", "not_entailment"), "rte": ("entailment", "not_entailment")}
            text = names[task][label] if task in names else str(1 - label)  # MRPC, QQP, WNLI: 1 = same meaning
            out.append((a, b, text))
    return out


def _line(task: str, i: int, row: tuple, dev: bool) -> list[str]:
    a, b, label = row
    if task == "cola":
        return ["gj04", label, "" if label == "1" else "*", a]
    if task == "sst2":
        return [a, label]
    if task == "mrpc":
        return [label, str(1000 + i), str(2000 + i), a, b]
    if task == "qqp":
        return [str(i), str(2 * i), str(2 * i + 1), a, b, label]
    if task == "stsb":
        return [str(i), "main-captions", "MSRvid", "2012test", f"{i:04d}", "none", "none", a, b, label]
    if task == "mnli":
        parse = ["( x )"] * 4
        labels = [label] * (5 if dev else 1)
        return [str(i), str(i), f"{i}e", "fiction", *parse, a, b, *labels, label]
    return [str(i), a, b, label]


def write_tsv(path: Path, task: str, data: list[tuple], dev: bool = False, header: bool = True) -> Path:
    lines = []
    if task != "cola" and header:
        lines.append(HEADERS["mnli_dev" if task == "mnli" and dev else task])
    lines += [_line(task, i, row, dev) for i, row in enumerate(data)]
    text = "".join("\t".join(fields) + "\n" for fields in lines)
    if task == "qqp":
        text += "999\t1998\t1999\ta question cut short\n"  # a row without all six fields, as QQP has
    path.write_bytes(text.encode("utf-8"))
    return path


def write_task(root: Path, task: str, n_train: int = 40, n_dev: int = 16, seed: int = 0) -> dict[str, list]:
    """The task's folder under root; returns split -> rows (MNLI: validation and validation_mm)."""
    folder = root / FOLDERS[task]
    folder.mkdir(parents=True, exist_ok=True)
    train = rows(task, n_train, seed)
    write_tsv(folder / "train.tsv", task, train)
    if task == "mnli":
        matched, mismatched = rows(task, n_dev, seed + 1), rows(task, n_dev + 3, seed + 2)
        write_tsv(folder / "dev_matched.tsv", task, matched, dev=True)
        write_tsv(folder / "dev_mismatched.tsv", task, mismatched, dev=True)
        return {"train": train, "validation": matched, "validation_mm": mismatched}
    dev = rows(task, n_dev, seed + 1)
    write_tsv(folder / "dev.tsv", task, dev, dev=True)
    return {"train": train, "validation": dev}
