"""Three GLUE-format tasks built from the Python standard library's sources, whose labels are
real (computed from the code, not guessed) and learnable by a small byte-level model:

    cola-like  one line of Python: does it parse on its own (ast.parse)?          MCC / accuracy
    mrpc-like  two lines: is the second the first with its names consistently renamed
               (a paraphrase), or another line of the same function renamed
               the same way?                                                     F1 / accuracy
    stsb-like  two lines: 5 x the Jaccard overlap of their identifier sets, a fifth
               of the pairs in each fifth of the range 0-5                       Pearson / Spearman

Training rows come from training files and dev rows from held-out ones (study_text.is_held_out,
the split the pretraining text uses). The two classification tasks are balanced, so the
majority class is 50%. write_glue puts the rows in GLUE's own layouts, which
`zerotrain train --task_name X --data_dir DIR/X` reads.
"""

from __future__ import annotations

import ast
import builtins
import keyword
import math
import random
import re
import warnings
from pathlib import Path

import torch

from study_text import is_held_out, python_files

CLS, PAD = 256, 257  # byte ids are 0-255; [CLS] doubles as [SEP]
TASKS = {"cola": ("CoLA", "matthews_correlation", 2), "mrpc": ("MRPC", "f1", 2), "stsb": ("STS-B", "pearson", 1)}

IDENT = re.compile(r"[A-Za-z_]\w*")
# a name to rename: not inside a number (0x1f, 1e5) and not a string prefix (f"...", rb'...')
NAME = re.compile(r"(?<!\w)[A-Za-z_]\w*(?![\w'\"])")
FIXED = set(keyword.kwlist) | set(keyword.softkwlist) | set(dir(builtins))  # renaming these changes the meaning


def function_lines(files: list[Path], line: tuple[int, int]) -> list[list[str]]:
    """Per function of these files: its lines (dedented) of the kept lengths, no comments."""
    lo, hi = line
    out = []
    for f in files:
        try:
            src = f.read_text(encoding="utf-8")
            tree = ast.parse(src)
        except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
            continue
        lines = src.splitlines()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno:
                body = [x.strip() for x in lines[node.lineno - 1: node.end_lineno]]
                body = [x for x in body if lo <= len(x) <= hi and not x.startswith("#") and x.isascii()]
                if len(body) >= 4:
                    out.append(sorted(set(body), key=body.index))
    return out


def parses(line: str) -> bool:
    with warnings.catch_warnings():  # "invalid decimal literal" and the like are warnings, not verdicts
        warnings.simplefilter("ignore")
        try:
            ast.parse(line)
            return True
        except (SyntaxError, ValueError):
            return False


def jaccard(a: str, b: str) -> float:
    x, y = set(IDENT.findall(a)), set(IDENT.findall(b))
    return len(x & y) / len(x | y) if x | y else 0.0


def graded_pairs(funcs: list[list[str]], lines: list[str], n: int, rng: random.Random) -> list[tuple]:
    """n pairs scored 5 x Jaccard(identifiers), about n/5 in each fifth of the score range (pairs
    drawn at random are mostly near 0, and a regression would learn to predict the mean)."""
    bins: list[list[tuple]] = [[] for _ in range(5)]
    for _ in range(60 * n):
        if min(len(b) for b in bins) >= n // 5:
            break
        fa = rng.randrange(len(funcs))
        a = rng.choice(funcs[fa])
        c = rng.choice([x for x in funcs[fa] if x != a]) if rng.random() < 0.7 else rng.choice(lines)
        score = 5 * jaccard(a, c)
        b = bins[min(4, int(score))]
        if len(b) < n // 5:
            b.append((a, c, round(score, 3)))
    return [p for b in bins for p in b]


def renamed(line: str, pool: dict[int, list[str]], rng: random.Random) -> str:
    """The line with every name that is not a keyword or builtin replaced, consistently, by
    another real name of the same length (from `pool`, by length; its reverse or a trailing
    underscore where the pool has none) that the line does not use:
    the same statement, reworded, as long as before."""
    own = set(NAME.findall(line))
    mapping = {}
    for x in sorted(own - FIXED):
        choices = [y for y in pool.get(len(x), ()) if y not in own and y not in mapping.values()]
        mapping[x] = rng.choice(choices) if choices else x[::-1] if x[::-1] not in own else x + "_"
    return NAME.sub(lambda m: mapping.get(m.group(), m.group()), line)


def skeleton(line: str) -> str:
    """What renaming leaves: the line with its renameable names blanked."""
    return NAME.sub(lambda m: m.group() if m.group() in FIXED else "_", line)


def paraphrase_pairs(funcs: list[list[str]], n: int, rng: random.Random) -> list[tuple]:
    """n pairs, alternately (line, the line renamed, 1) and (line, another line of its function
    whose skeleton differs, renamed the same way, 0): both sides of a negative are as reworded
    as a positive's, so only whether the two say the same thing tells them apart."""
    pool: dict[int, list[str]] = {}
    for x in sorted({x for fn in funcs for line in fn for x in NAME.findall(line)} - FIXED):
        pool.setdefault(len(x), []).append(x)
    usable = [fn for fn in funcs if any(skeleton(x) != x for x in fn)]
    out = []
    while len(out) < n:
        fn = rng.choice(usable)
        a = rng.choice([x for x in fn if skeleton(x) != x])
        if len(out) % 2 == 0:
            out.append((a, renamed(a, pool, rng), 1))
            continue
        others = [x for x in fn if skeleton(x) != skeleton(a)]
        if others:
            out.append((a, renamed(rng.choice(others), pool, rng), 0))
    return out


def make_tasks(n_train: int, n_dev: int, line: tuple[int, int] = (16, 56), max_files: int | None = None,
               seed: int = 0) -> dict:
    """{task: {"train": rows, "dev": rows}}; a row is (text_a, text_b or None, label)."""
    split = {"train": [], "dev": []}
    for f in python_files(top_only=max_files is not None):
        if max_files and min(len(v) for v in split.values()) >= max_files:
            break
        raw = f.read_bytes()
        if len(raw) > 200:
            split["dev" if is_held_out(raw[:256 * 1024]) else "train"].append(f)
    rng = random.Random(seed)
    tasks = {t: {} for t in TASKS}
    for name, n in (("train", n_train), ("dev", n_dev)):
        funcs = function_lines(split[name], line)
        lines = sorted({x for fn in funcs for x in fn})
        good = [x for x in lines if parses(x)]
        bad = [x for x in lines if not parses(x)]
        k = min(n // 2, len(good), len(bad))
        cola = [(x, None, 1) for x in rng.sample(good, k)] + [(x, None, 0) for x in rng.sample(bad, k)]
        mrpc = paraphrase_pairs(funcs, n, rng)
        stsb = graded_pairs(funcs, lines, n, rng)
        for t, rows in (("cola", cola), ("mrpc", mrpc), ("stsb", stsb)):
            rng.shuffle(rows)
            tasks[t][name] = rows
    return tasks


def write_glue(tasks: dict, root: Path) -> None:
    """The same rows in GLUE's own layouts, for `zerotrain train --task_name X --data_dir root/X`."""
    for t, (folder, _, _) in TASKS.items():
        d = root / folder
        d.mkdir(parents=True, exist_ok=True)
        for split, rows in tasks[t].items():
            if t == "cola":
                lines = [f"py\t{y}\t{'' if y else '*'}\t{a}" for a, _, y in rows]
            elif t == "mrpc":
                lines = ["\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String"] + [
                    f"{y}\t{2 * i}\t{2 * i + 1}\t{a}\t{b}" for i, (a, b, y) in enumerate(rows)]
            else:
                lines = ["index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"] + [
                    f"{i}\tcode\tstdlib\t2026\t{i}\tnone\tnone\t{a}\t{b}\t{y}" for i, (a, b, y) in enumerate(rows)]
            (d / f"{split}.tsv").write_text("\n".join(x.replace('"', "'") for x in lines) + "\n", encoding="utf-8")


def encode(rows: list, max_len: int) -> tuple[torch.Tensor, ...]:
    seqs, types = [], []
    for a, b, _ in rows:
        ids = [CLS] + list(a.encode()) + [CLS]
        tt = [0] * len(ids)
        if b is not None:
            ids += list(b.encode()) + [CLS]
            tt += [1] * (len(ids) - len(tt))
        seqs.append(ids[:max_len])
        types.append(tt[:max_len])
    n = max(len(s) for s in seqs)
    ids = torch.full((len(rows), n), PAD)
    tt = torch.zeros((len(rows), n), dtype=torch.long)
    mask = torch.zeros((len(rows), n), dtype=torch.long)
    for i, (s, t) in enumerate(zip(seqs, types)):
        ids[i, :len(s)], tt[i, :len(t)], mask[i, :len(s)] = torch.tensor(s), torch.tensor(t), 1
    return ids, tt, mask


# ---- metrics (GLUE's) ---------------------------------------------------------------------------
def metrics(task: str, preds: list[float], labels: list[float]) -> dict:
    if task == "stsb":
        from scipy.stats import pearsonr, spearmanr

        p = float(pearsonr(preds, labels)[0]) if len(set(preds)) > 1 else 0.0
        s = float(spearmanr(preds, labels)[0]) if len(set(preds)) > 1 else 0.0
        return {"pearson": p, "spearmanr": s, "pred_std": float(torch.tensor(preds).std())}
    tp = sum(p == 1 and y == 1 for p, y in zip(preds, labels))
    tn = sum(p == 0 and y == 0 for p, y in zip(preds, labels))
    fp = sum(p == 1 and y == 0 for p, y in zip(preds, labels))
    fn = sum(p == 0 and y == 1 for p, y in zip(preds, labels))
    den = math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    majority = max(sum(labels), len(labels) - sum(labels)) / len(labels)
    return {"accuracy": (tp + tn) / len(labels), "f1": 2 * tp / (2 * tp + fp + fn) if tp else 0.0,
            "matthews_correlation": (tp * tn - fp * fn) / den if den else 0.0, "majority": majority,
            "predicted_1": (tp + fp) / len(labels)}


def learnt(task: str, m: dict) -> bool:
    if task == "stsb":
        return m["pearson"] >= 0.2
    if task == "cola":
        return m["matthews_correlation"] >= 0.1 or m["accuracy"] >= m["majority"] + 0.05
    return m["accuracy"] >= m["majority"] + 0.05
