"""The GLUE tasks as HF's run_glue names them, and where their data is.

    --task_name cola|sst2|mrpc|qqp|stsb|mnli|qnli|rte|wnli
      --data_dir     a task folder as GLUE distributes it (or the GLUE root holding it):
                     train.tsv, dev.tsv; MNLI dev_matched.tsv + dev_mismatched.tsv
      --train_file   csv / tsv / jsonl / json with run_glue's columns: the task's own names
                     (premise/hypothesis, question1/question2, ...) or sentence1/sentence2, and label

Each task's columns in the distributed files (header names; CoLA has no header row) and its
label set: classes by id in HF datasets' order (so integer labels from an exported dataset
mean what they meant there), or STS-B's similarity score in [0, 5] (a regression). Its
metrics are HF's GLUE metric's names.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...errors import ConfigError, DataError, did_you_mean


@dataclass(frozen=True)
class GlueTask:
    name: str
    folder: str  # the folder name in GLUE's distribution
    keys: tuple  # run_glue's sentence columns (second None: one sentence)
    file_columns: tuple  # (sentence, sentence or None, label) in the distributed TSV header
    labels: tuple | None  # class names by id; None: a regression score
    metrics: tuple
    dev_files: tuple = ("dev.tsv",)  # MNLI: matched, then mismatched (suffix _mm)

    @property
    def pair(self) -> bool:
        return self.keys[1] is not None

    @property
    def num_labels(self) -> int:
        return 1 if self.labels is None else len(self.labels)


BINARY = ("0", "1")
NLI2 = ("entailment", "not_entailment")
TASKS = {t.name: t for t in (
    GlueTask("cola", "CoLA", ("sentence", None), (3, None, 1), BINARY, ("matthews_correlation",)),
    GlueTask("sst2", "SST-2", ("sentence", None), ("sentence", None, "label"), BINARY, ("accuracy",)),
    GlueTask("mrpc", "MRPC", ("sentence1", "sentence2"), ("#1 String", "#2 String", "Quality"), BINARY,
             ("accuracy", "f1")),
    GlueTask("qqp", "QQP", ("question1", "question2"), ("question1", "question2", "is_duplicate"), BINARY,
             ("accuracy", "f1")),
    GlueTask("stsb", "STS-B", ("sentence1", "sentence2"), ("sentence1", "sentence2", "score"), None,
             ("pearson", "spearmanr")),
    GlueTask("mnli", "MNLI", ("premise", "hypothesis"), ("sentence1", "sentence2", "gold_label"),
             ("entailment", "neutral", "contradiction"), ("accuracy",), ("dev_matched.tsv", "dev_mismatched.tsv")),
    GlueTask("qnli", "QNLI", ("question", "sentence"), ("question", "sentence", "label"), NLI2, ("accuracy",)),
    GlueTask("rte", "RTE", ("sentence1", "sentence2"), ("sentence1", "sentence2", "label"), NLI2, ("accuracy",)),
    GlueTask("wnli", "WNLI", ("sentence1", "sentence2"), ("sentence1", "sentence2", "label"), BINARY, ("accuracy",)),
)}
COLA_COLUMNS = ("source", "label", "original_label", "sentence")  # CoLA's train/dev.tsv, which have no header
STSB_RANGE = (0.0, 5.0)


def get_task(name: str) -> GlueTask:
    key = str(name).strip().lower().replace("-", "")
    if key not in TASKS:
        raise ConfigError(f"task_name {name!r}: not a GLUE task; choose one of {', '.join(TASKS)}"
                          f"{did_you_mean(key, TASKS)}")
    return TASKS[key]


def task_folder(data_dir: str, task: GlueTask, need_train: bool = True) -> Path:
    """The folder holding the task's files: data_dir itself, or its subfolder named as GLUE
    names it (so the GLUE root works too). A folder without the files is one clear line."""
    root = Path(data_dir).expanduser()
    if not root.is_dir():
        raise DataError(f"data_dir {root}: not a folder")
    needed = (("train.tsv",) if need_train else ()) + task.dev_files
    candidates = [root] + sorted(p for p in root.iterdir() if p.is_dir() and p.name.lower() == task.folder.lower())
    for folder in candidates:
        if all((folder / f).is_file() for f in needed):
            return folder
    best = candidates[-1]
    missing = [f for f in needed if not (best / f).is_file()]
    raise DataError(f"data_dir {best}: no {' or '.join(missing)} for task {task.name} (GLUE's {task.folder} folder "
                    f"holds {', '.join(needed)}); point --data_dir at that folder")


def check_glue_options(data_args, model_task: str, do_train: bool) -> None:
    """The GLUE options agree with each other (nothing is read but the folder's listing)."""
    if data_args.data_dir and not data_args.task_name:
        raise ConfigError("data_dir is read with --task_name (which GLUE task it holds); add --task_name")
    if not data_args.task_name:
        return
    task = get_task(data_args.task_name)
    if model_task != "classification":
        raise ConfigError(f"task_name {task.name} fine-tunes a sequence classifier; drop --task {model_task} "
                          "(or set --task classification)")
    if data_args.data_dir:
        given = [n for n in ("train_file", "validation_file") if getattr(data_args, n)]
        if given:
            raise ConfigError(f"data_dir and {given[0]} both name the data; use one")
        task_folder(data_args.data_dir, task, need_train=do_train)
