"""The GLUE metrics, named as HF's GLUE metric names them, from the model's outputs and the
labels of the whole eval set (gathered from every rank: Spearman's ranks and Matthews'
correlation need all of it).

    cola         matthews_correlation
    stsb         pearson, spearmanr        (the one output is the predicted score)
    mrpc, qqp    accuracy, f1              (f1 of class 1)
    the rest     accuracy                  (MNLI: matched; mismatched gets the suffix _mm)

Tasks with two metrics also get combined_score, their mean, as run_glue adds it. A
correlation that is undefined (constant predictions or labels) is reported as 0.0.
"""

from __future__ import annotations

import math

import torch

from ..data.glue_tasks import get_task


def accuracy(pred: torch.Tensor, labels: torch.Tensor) -> float:
    return (pred == labels).double().mean().item() if len(labels) else 0.0


def f1(pred: torch.Tensor, labels: torch.Tensor, positive: int = 1) -> float:
    tp = ((pred == positive) & (labels == positive)).sum().item()
    fp = ((pred == positive) & (labels != positive)).sum().item()
    fn = ((pred != positive) & (labels == positive)).sum().item()
    return 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0


def matthews_correlation(pred: torch.Tensor, labels: torch.Tensor) -> float:
    """The multiclass form (Gorodkin's R_K), which is Matthews' phi for two classes."""
    classes = int(max(pred.max().item(), labels.max().item())) + 1 if len(labels) else 1
    confusion = torch.zeros(classes, classes, dtype=torch.float64)
    confusion.index_put_((labels.long(), pred.long()), torch.ones(len(labels), dtype=torch.float64), accumulate=True)
    t, p = confusion.sum(1), confusion.sum(0)  # true and predicted counts per class
    c, s = confusion.trace(), confusion.sum()
    denominator = math.sqrt(float((s * s - (p * p).sum()) * (s * s - (t * t).sum())))
    return float((c * s - (t * p).sum()) / denominator) if denominator else 0.0


def pearson(x: torch.Tensor, y: torch.Tensor) -> float:
    x, y = x.double() - x.double().mean(), y.double() - y.double().mean()
    denominator = math.sqrt(float((x * x).sum() * (y * y).sum()))
    return float((x * y).sum() / denominator) if denominator else 0.0


def average_ranks(x: torch.Tensor) -> torch.Tensor:
    """1-based ranks, ties sharing the mean of the ranks they span (as Spearman's rho needs)."""
    values, inverse, counts = torch.unique(x.double(), return_inverse=True, return_counts=True)
    ends = counts.cumsum(0).double()
    return ((ends - counts.double() + 1 + ends) / 2)[inverse]


def spearmanr(x: torch.Tensor, y: torch.Tensor) -> float:
    return pearson(average_ranks(x), average_ranks(y))


def glue_metrics(task_name: str):
    """compute_metrics(logits, labels) -> {metric name: value} for the task."""
    task = get_task(task_name)

    def compute(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
        if task.labels is None:
            scores = logits.double().reshape(len(labels), -1)[:, 0]
            out = {"pearson": pearson(scores, labels), "spearmanr": spearmanr(scores, labels)}
        else:
            pred, labels = logits.argmax(-1), labels.long()
            names = {"accuracy": accuracy, "f1": f1, "matthews_correlation": matthews_correlation}
            out = {name: names[name](pred, labels) for name in task.metrics}
        if len(out) > 1:
            out["combined_score"] = sum(out.values()) / len(out)
        return out

    return compute
