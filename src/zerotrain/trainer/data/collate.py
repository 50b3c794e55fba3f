"""Batches from tokenized samples: padding into tensors, and BERT's masking for mlm."""

from __future__ import annotations

import torch

from ...errors import ConfigError


class Collator:
    """Pads a list of samples into tensors: input_ids, attention_mask, labels (clm: the ids, -100
    at padding; sft: the sample's labels, -100 at padding; classification: class ids, or float
    targets for a regression), and token_type_ids when samples have them. Packed
    sft samples carry position_ids instead of a mask (see packing.py); padding then gets
    positions of its own, so no real token attends to it. MLM masking happens later, in the
    main process, so it draws from the RNG the checkpoints restore."""

    def __init__(self, task: str, pad_id: int | None):
        self.task = task
        self.pad_id = 0 if pad_id is None else pad_id

    def __call__(self, samples: list[dict]) -> dict[str, torch.Tensor]:
        longest = max(len(s["input_ids"]) for s in samples)
        ids = torch.full((len(samples), longest), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(samples), longest), dtype=torch.long)
        for i, s in enumerate(samples):
            row = torch.as_tensor(s["input_ids"], dtype=torch.long)
            ids[i, : len(row)] = row
            mask[i, : len(row)] = 1
        batch = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in samples[0]:  # sentence pairs: 0 for the first, 1 for the second, 0 at padding
            types = torch.zeros((len(samples), longest), dtype=torch.long)
            for i, s in enumerate(samples):
                types[i, : len(s["token_type_ids"])] = torch.as_tensor(s["token_type_ids"], dtype=torch.long)
            batch["token_type_ids"] = types
        if self.task == "classification":
            values = [s["labels"] for s in samples]
            regression = isinstance(values[0], float)  # one output (GLUE STS-B): float targets for the MSE
            batch["labels"] = torch.as_tensor(values, dtype=torch.float32 if regression else torch.long)
        elif self.task == "clm":
            batch["labels"] = ids.masked_fill(mask == 0, -100)
        elif self.task == "sft":
            labels = torch.full_like(ids, -100)
            for i, s in enumerate(samples):
                labels[i, : len(s["labels"])] = torch.as_tensor(s["labels"], dtype=torch.long)
            batch["labels"] = labels
            if "position_ids" in samples[0]:
                positions = torch.arange(longest).repeat(len(samples), 1)
                for i, s in enumerate(samples):
                    positions[i, : len(s["position_ids"])] = torch.as_tensor(s["position_ids"], dtype=torch.long)
                    positions[i, len(s["position_ids"]):] -= len(s["position_ids"])
                batch["position_ids"] = positions
                del batch["attention_mask"]
        return batch


def pad_to_length(batch, length: int, pad_id: int = 0) -> dict:
    """Right-pad a collated batch's token columns (every tensor of shape (rows, width, ...) with
    the width of input_ids) to `length`: input_ids with pad_id, labels with -100 (the loss's
    ignore index), position_ids counting on, the rest (attention_mask, token_type_ids) with 0.
    A pipeline runs one shape per step, so each micro-batch is padded to its step's longest
    sample; padding after a row's tokens changes no real token's output or loss."""
    width = batch["input_ids"].shape[1]
    if width >= length:
        return batch
    extra, out = length - width, dict(batch)
    for key, t in batch.items():
        if not torch.is_tensor(t) or t.dim() < 2 or t.shape[1] != width:
            continue  # classification labels, per-row values
        if key == "position_ids":
            tail = t[:, -1:] + torch.arange(1, extra + 1, dtype=t.dtype)
        else:
            value = pad_id if key == "input_ids" else -100 if key == "labels" else 0
            tail = t.new_full((t.shape[0], extra, *t.shape[2:]), value)
        out[key] = torch.cat([t, tail], dim=1)
    return out


def mask_tokens(batch: dict, tokenizer, probability: float, generator: torch.Generator | None = None) -> dict:
    """BERT masking: pick `probability` of the real tokens; of those 80% -> mask, 10% -> a
    random token, 10% unchanged. Labels hold the original id at picked positions, else -100."""
    if tokenizer.mask_token_id is None:
        raise ConfigError("task mlm needs a tokenizer with a mask token")
    ids = batch["input_ids"].clone()
    special = torch.zeros_like(ids, dtype=torch.bool)
    for tid in set(tokenizer.all_special_ids):
        special |= ids == tid
    candidates = (batch["attention_mask"] == 1) & ~special
    picked = (torch.rand(ids.shape, generator=generator) < probability) & candidates
    labels = ids.masked_fill(~picked, -100)
    r = torch.rand(ids.shape, generator=generator)
    ids[picked & (r < 0.8)] = tokenizer.mask_token_id
    swap = picked & (r >= 0.8) & (r < 0.9)
    ids[swap] = torch.randint(len(tokenizer), ids.shape, generator=generator)[swap]
    return {**batch, "input_ids": ids, "labels": labels}
