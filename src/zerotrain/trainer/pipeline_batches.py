"""The trainer's step and evaluation with a pipeline engine: a step's micro-batches handed to
engine.train_batch together, and the eval set read one micro-batch per eval_batch. The model
is cut into stages by parallel/pipeline/from_model.py."""

from __future__ import annotations

import torch

def _pair(inputs: dict, kind: str):
    ids = inputs["input_ids"]
    x = (ids, inputs["attention_mask"]) if kind == "bert" else ids
    return x, inputs["labels"]


class PipelineMicroBatches:
    """The trainer's micro-batch runner (loop/step.py MicroBatches) for a pipeline: it holds a
    step's micro-batches and the last one runs engine.train_batch over all of them. The step's
    mean loss is reported once per micro-batch (x accumulation at the last, 0 before), so the
    trainer's mean over every rank's micro-batches is that mean; tokens are counted once, by
    the first stage's tensor rank 0, after the step, at the step's curriculum length (the one
    definition, features.batch.count_tokens)."""

    def __init__(self, engine, keys, kind: str, task: str, tokenizer, mlm_probability: float):
        self.engine, self.keys, self.kind = engine, keys, kind
        self.task, self.tokenizer, self.mlm_probability = task, tokenizer, mlm_probability
        self.piped: list = []
        self.sums = torch.zeros(3, dtype=torch.float64)

    def at_boundary(self) -> bool:
        return len(self.piped) + 1 == self.engine.gradient_accumulation_steps()

    def run(self, batch: dict) -> None:
        from ..features.batch import count_tokens
        from ..features.engine_methods import curriculum_seqlen
        from .data.collate import mask_tokens
        from .loop.step import forward_inputs

        engine = self.engine
        if self.task == "mlm":
            batch = mask_tokens(batch, self.tokenizer, self.mlm_probability)
        self.piped.append(_pair(forward_inputs(batch, self.keys, engine.device), self.kind))
        self.sums[1] += 1
        ga = engine.gradient_accumulation_steps()
        if len(self.piped) < ga:
            return
        pairs, self.piped = self.piped, []
        self.sums[0] += engine.train_batch(iter(pairs)).item() * ga
        if engine.is_first_stage() and not engine.input_replica:  # a tensor rank > 0 reads the same batches
            cut = {"curriculum_seqlen": curriculum_seqlen(engine)}
            self.sums[2] += sum(count_tokens((x[0] if isinstance(x, tuple) else x,), cut) for x, _ in pairs)

    def take(self) -> torch.Tensor:
        out = self.sums.clone()
        self.sums.zero_()
        return out


def evaluate_pipeline(engine, dataset, *, collator, keys, kind: str, task: str, batch_size: int, workers: int,
                      seed: int, data_rank: int, data_world: int, tokenizer=None, mlm_probability: float = 0.15,
                      prefix: str = "eval") -> dict:
    """<prefix>_loss (and perplexity for clm) over the eval set, one micro-batch per eval_batch
    (padding makes each batch its own shape); the mean over samples of every data-parallel rank
    (a pipeline's stages read the same batches)."""
    import math
    import time

    from torch.utils.data import DataLoader

    from .data.collate import mask_tokens
    from .data.sampler import EvalSampler
    from .loop.step import forward_inputs

    start = time.perf_counter()
    loader = DataLoader(dataset, batch_size=batch_size, sampler=EvalSampler(len(dataset), data_rank, data_world),
                        collate_fn=collator, num_workers=workers)
    generator = torch.Generator().manual_seed(seed)
    total = torch.zeros(2, dtype=torch.float64)
    for batch in loader:
        if task == "mlm":
            batch = mask_tokens(batch, tokenizer, mlm_probability, generator)
        n = len(batch["input_ids"])
        pair = _pair(forward_inputs(batch, keys, engine.device), kind)
        loss = engine.eval_batch(iter([pair]), num_micro_batches=1).item()
        total += torch.tensor([loss * n, n], dtype=torch.float64)  # the same on every rank
    mean = (total[0] / total[1]).item() if total[1] else float("nan")
    out = {f"{prefix}_loss": mean}
    if task == "clm":
        out[f"{prefix}_perplexity"] = math.exp(min(mean, 50.0))
    out[f"{prefix}_runtime"] = round(time.perf_counter() - start, 3)
    return out
