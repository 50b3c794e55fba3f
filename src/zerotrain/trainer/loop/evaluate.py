"""Evaluation: one pass over the eval set on every rank, and the metrics it reports.

Each rank turns its eval batches into a vector of sums (loss, counted tokens or samples,
correct predictions, per-class true/false positives and false negatives); one all-reduce of
that vector gives exact job-wide numbers however the eval set was split.

    clm, sft        eval_loss, eval_perplexity (next-token cross-entropy; sft: over assistant tokens)
    mlm             eval_loss, eval_perplexity, eval_accuracy (at masked positions)
    classification  eval_loss, eval_accuracy, eval_f1 (binary: class 1; more classes: macro)
                    one output: a regression, eval_loss is the mean squared error
    compute_metrics eval_loss, then what it returns from the whole set's outputs and labels,
                    gathered from every rank (the GLUE metrics, glue_metrics.py)
"""

from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from ..data.collate import mask_tokens
from ..data.sampler import EvalSampler
from .step import forward_inputs


def logits_of(output) -> torch.Tensor:
    return output if torch.is_tensor(output) else output.logits


def eval_sums(task: str, logits: torch.Tensor, batch: dict, valid: torch.Tensor, num_labels: int) -> torch.Tensor:
    """This batch's contribution: [loss_sum, count, correct, tp x C, fp x C, fn x C]."""
    logits = logits.float()
    labels = batch["labels"]
    extra = torch.zeros(3 * num_labels, dtype=torch.float64)
    if task == "classification" and logits.shape[-1] == 1:  # regression
        keep = valid.bool()
        loss = F.mse_loss(logits[keep][:, 0], labels[keep].float(), reduction="sum")
        return torch.cat([torch.tensor([loss.item(), float(keep.sum()), 0.0], dtype=torch.float64), extra])
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
    if task in ("clm", "sft"):
        logits, labels = logits[:, :-1], labels[:, 1:]
    labels = labels.masked_fill(~valid.bool()[:, None], -100)
    picked = labels != -100
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=-100,
                           reduction="sum")
    correct = ((logits.argmax(-1) == labels) & picked).sum().item()
    head = [loss.item(), float(picked.sum().item()), float(correct)]
    return torch.cat([torch.tensor(head, dtype=torch.float64), extra])


def finish(task: str, sums: torch.Tensor, num_labels: int, loss_only: bool = False) -> dict[str, float]:
    loss_sum, count, correct = sums[:3].tolist()
    if count == 0:
        return {}
    loss = loss_sum / count
    out = {"eval_loss": loss}
    if loss_only or (task == "classification" and num_labels == 1):
        return out
    if task in ("clm", "sft", "mlm"):
        out["eval_perplexity"] = math.exp(min(loss, 700.0))
    if task in ("mlm", "classification"):
        out["eval_accuracy"] = correct / count
    if task == "classification":
        tp, fp, fn = (sums[3 + k * num_labels: 3 + (k + 1) * num_labels] for k in range(3))
        f1 = [(2 * tp[c] / (2 * tp[c] + fp[c] + fn[c])).item() if (2 * tp[c] + fp[c] + fn[c]) > 0 else 0.0
              for c in range(num_labels)]
        out["eval_f1"] = f1[1] if num_labels == 2 else sum(f1) / num_labels
    return out


def evaluate(engine, dataset, *, collator, keys, task: str, num_labels: int, batch_size: int, workers: int,
             seed: int, tokenizer=None, mlm_probability: float = 0.15, prefix: str = "eval",
             predictions: list | None = None, compute_metrics=None) -> dict[str, float]:
    """Metrics over the whole set, the same on every rank (every rank must call this: the eval
    sampler pads each rank to the same number of forwards, which ZeRO-3's gathers need), named
    `<prefix>_loss` and so on. `<prefix>_runtime` is the pass's seconds, which training's
    tokens_per_s leaves out. Classification with `predictions` (a list): rank 0 gets there
    the predicted class (a regression: the score) of every sample, in the dataset's order."""
    start = time.perf_counter()
    comm = engine.batch_comm or engine.strategy.comm  # tensor and sequence ranks of a data index read the same samples
    sampler = EvalSampler(len(dataset), comm.rank, comm.world_size)
    valid = sampler.valid()
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, collate_fn=collator, num_workers=workers)
    generator = torch.Generator().manual_seed(seed)  # the same masks at every evaluation
    sums, pos = torch.zeros(3 + 3 * num_labels, dtype=torch.float64), 0
    mine = []  # (sample index, outputs, label) of this rank's valid samples
    collect = task == "classification" and (predictions is not None or compute_metrics is not None)
    engine.eval()
    with torch.no_grad():
        for batch in loader:
            n = len(batch["input_ids"])
            ok = torch.tensor(valid[pos: pos + n])
            if collect:
                picked = [comm.rank + (pos + k) * comm.world_size for k in range(n) if valid[pos + k]]
                pos += n
            else:
                picked, pos = None, pos + n
            if task == "mlm":
                batch = mask_tokens(batch, tokenizer, mlm_probability, generator)
            inputs = forward_inputs({k: v for k, v in batch.items() if k != "labels"}, keys, engine.device)
            logits = logits_of(engine(**inputs)).cpu()
            sums += eval_sums(task, logits, batch, ok, num_labels)
            if picked is not None:
                mine += zip(picked, logits[ok.bool()].float().tolist(), batch["labels"][ok.bool()].tolist())
    engine.train()
    comm.all_reduce(sums)
    metrics = finish(task, sums, num_labels, loss_only=compute_metrics is not None)
    if collect:
        rows = sorted((row for part in comm.all_gather_object(mine) for row in part), key=lambda r: r[0])
        outputs = torch.tensor([r[1] for r in rows], dtype=torch.float64).reshape(len(rows), -1)
        labels = torch.tensor([r[2] for r in rows], dtype=torch.float64)
        if predictions is not None:
            predictions.extend(outputs[:, 0].tolist() if num_labels == 1 else outputs.argmax(-1).tolist())
        if compute_metrics is not None and metrics:
            metrics.update({f"eval_{k}": v for k, v in compute_metrics(outputs, labels).items()})
    if not metrics:
        return metrics
    metrics["eval_runtime"] = round(time.perf_counter() - start, 3)
    return {f"{prefix}_{k[len('eval_'):]}": v for k, v in metrics.items()}
