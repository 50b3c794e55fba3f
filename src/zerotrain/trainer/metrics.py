"""Evaluation metrics from logits, and where logged numbers go (metrics.jsonl, TensorBoard).

Each rank turns its eval batches into a vector of sums (loss, counted tokens or samples,
correct predictions, per-class true/false positives and false negatives); one all-reduce of
that vector gives exact job-wide numbers however the eval set was split.

    clm             eval_loss, eval_perplexity (next-token cross-entropy)
    mlm             eval_loss, eval_perplexity, eval_accuracy (at masked positions)
    classification  eval_loss, eval_accuracy, eval_f1 (binary: class 1; more classes: macro)
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F

METRICS_FILE = "metrics.jsonl"
TB_FOLDER = "tensorboard"


def logits_of(output) -> torch.Tensor:
    return output if torch.is_tensor(output) else output.logits


def eval_sums(task: str, logits: torch.Tensor, batch: dict, valid: torch.Tensor, num_labels: int) -> torch.Tensor:
    """This batch's contribution: [loss_sum, count, correct, tp x C, fp x C, fn x C]."""
    logits = logits.float()
    labels = batch["labels"]
    extra = torch.zeros(3 * num_labels, dtype=torch.float64)
    if task == "classification":
        keep = valid.bool()
        logits, labels = logits[keep], labels[keep]
        loss = F.cross_entropy(logits, labels, reduction="sum") if len(labels) else logits.sum() * 0
        pred = logits.argmax(-1)
        for c in range(num_labels):
            extra[c] = ((pred == c) & (labels == c)).sum()
            extra[num_labels + c] = ((pred == c) & (labels != c)).sum()
            extra[2 * num_labels + c] = ((pred != c) & (labels == c)).sum()
        head = [loss.item(), float(len(labels)), (pred == labels).sum().item()]
        return torch.cat([torch.tensor(head, dtype=torch.float64), extra])
    if task == "clm":
        logits, labels = logits[:, :-1], labels[:, 1:]
    labels = labels.masked_fill(~valid.bool()[:, None], -100)
    picked = labels != -100
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=-100,
                           reduction="sum")
    correct = ((logits.argmax(-1) == labels) & picked).sum().item()
    head = [loss.item(), float(picked.sum().item()), float(correct)]
    return torch.cat([torch.tensor(head, dtype=torch.float64), extra])


def finish(task: str, sums: torch.Tensor, num_labels: int) -> dict[str, float]:
    loss_sum, count, correct = sums[:3].tolist()
    if count == 0:
        return {}
    loss = loss_sum / count
    out = {"eval_loss": loss}
    if task in ("clm", "mlm"):
        out["eval_perplexity"] = math.exp(min(loss, 700.0))
    if task in ("mlm", "classification"):
        out["eval_accuracy"] = correct / count
    if task == "classification":
        tp, fp, fn = (sums[3 + k * num_labels: 3 + (k + 1) * num_labels] for k in range(3))
        f1 = [(2 * tp[c] / (2 * tp[c] + fp[c] + fn[c])).item() if (2 * tp[c] + fp[c] + fn[c]) > 0 else 0.0
              for c in range(num_labels)]
        out["eval_f1"] = f1[1] if num_labels == 2 else sum(f1) / num_labels
    return out


class MetricsLog:
    """Rank 0's sinks: one JSON object per line in metrics.jsonl, and TensorBoard scalars."""

    def __init__(self, output_dir: Path, tensorboard: bool, resume_step: int | None):
        self.path = output_dir / METRICS_FILE
        kept = []
        if resume_step is not None and self.path.is_file():  # drop what the killed run logged later
            kept = [json.dumps(r) for r in _records(self.path) if r.get("step", 0) <= resume_step]
        self.path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        self.tb = None
        if tensorboard:
            from .tensorboard import EventWriter

            self.tb = EventWriter(output_dir / TB_FOLDER)

    def write(self, record: dict) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        if self.tb is not None:
            scalars = {k: v for k, v in record.items() if isinstance(v, (int, float)) and k not in ("step",)}
            self.tb.add_scalars(int(record["step"]), scalars)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def read_metrics(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        from ..errors import DataError

        raise DataError(f"{path}: not found; pass the output_dir of a `zerotrain train` run")
    return _records(path)


def _records(path: Path) -> list[dict]:
    """The JSON lines of a metrics file; a line torn by a killed run is skipped."""
    records = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records
