"""A step's micro-batches on the ranks that read data, and the one check every rank shares.

DeepSpeed's contract: `data_iter` yields (inputs, labels) pairs; the first stage uses the
inputs and the last stage the labels, so only ranks that hold one of them read (a middle
stage may pass no iterator at all). All `gradient_accumulation_steps` pairs are read before
any compute, cut to the curriculum length when the model does not take it, and stacked along
dim 0 for torch's schedule, which cuts them again into the same micro-batches.

Every rank then joins one small all-gather of (problem, input shapes, label shapes): a rank
whose iterator ran dry or yielded something else makes every rank raise the same line (no
rank is left waiting in a collective), and each pipeline learns the shapes of its step, the
key of its cached stages (stages.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...errors import DataError
from ...features.batch import cut_sequences, find_sequence


class RepeatingLoader:
    """Iterate a loader forever, starting over at its end (DeepSpeed's RepeatingLoader)."""

    def __init__(self, loader):
        self.loader = loader
        self._it = iter(loader)

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self._it)
        except StopIteration:
            self._it = iter(self.loader)
            return next(self._it)


def _as_tuple(x) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def signature(tensors) -> tuple | None:
    return None if tensors is None else tuple((tuple(t.shape), str(t.dtype)) for t in tensors)


@dataclass
class StepData:
    inputs: tuple | None = None  # stacked micro-batch inputs (first stage)
    labels: torch.Tensor | None = None  # stacked labels (last stage)
    problem: str | None = None

    def report(self) -> tuple:
        labels = None if self.labels is None else (self.labels,)
        return self.problem, signature(self.inputs), signature(labels)


def read_pairs(data_iter, count: int) -> tuple[list, str | None]:
    """`count` (inputs-tuple, labels) pairs, or what went wrong (returned, not raised)."""
    if data_iter is None:
        return [], ("no data: pass engine.train_batch(data_iter=...) on the ranks of the first and last stage, "
                    "or training_data= to zerotrain.initialize")
    pairs = []
    for k in range(count):
        try:
            item = next(data_iter)
        except StopIteration:
            return pairs, (f"data_iter ran out after {k} of the {count} micro-batches of this step "
                           "(gradient_accumulation_steps); give it enough batches, e.g. "
                           "zerotrain.pipe.RepeatingLoader(loader)")
        except TypeError:
            return pairs, f"data_iter is a {type(data_iter).__name__}, not an iterator; pass iter(loader)"
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            return pairs, f"data_iter yielded a {type(item).__name__}; a pipeline micro-batch is a pair (inputs, labels)"
        x, y = _as_tuple(item[0]), item[1]
        if not all(torch.is_tensor(t) for t in x) or not (y is None or torch.is_tensor(y)):
            return pairs, ("a pipeline micro-batch is (a tensor or tuple of tensors, a tensor or None); got "
                           f"({', '.join(type(t).__name__ for t in x)}; {type(y).__name__})")
        pairs.append((x, y))
    return pairs, None


def stack_step(pairs: list, cut_to: int | None, wants_inputs: bool, wants_labels: bool) -> StepData:
    """Cut each pair to `cut_to` positions (when given) and stack them along dim 0."""
    inputs, labels = [], []
    for x, y in pairs:
        seq = find_sequence(x, {}) if cut_to is not None else None
        if seq is not None and seq.dim() >= 2 and cut_to < seq.shape[1]:
            (*x, y), _ = cut_sequences((*x, y), {}, seq.shape[1], cut_to)
        inputs.append(tuple(x))
        labels.append(y)
    shapes = {signature(x) for x in inputs}
    label_shapes = {signature(None if y is None else (y,)) for y in labels}
    if len(shapes) > 1 or len(label_shapes) > 1:
        return StepData(problem=f"the micro-batches of one step differ in shape ({sorted(map(str, shapes))}); "
                                "torch's pipeline runs one shape per step: pad them to one length")
    stacked = tuple(torch.cat([x[i] for x in inputs]) for i in range(len(inputs[0])))
    target = None if labels[0] is None else torch.cat(labels)
    return StepData(inputs=stacked if wants_inputs else None, labels=target if wants_labels else None)


def agree(comm, data: StepData, mesh, first_pipe_rank: int, last_pipe_rank: int) -> tuple:
    """All-gather every rank's report; raise one DataError everywhere if any rank had a
    problem; else return this pipeline's key (its first stage's input shapes, its last
    stage's label shapes)."""
    reports = comm.all_gather_object(data.report())
    bad = [(r, p) for r, (p, _, _) in enumerate(reports) if p]
    if bad:
        rank, problem = bad[0]
        more = f" (and {len(bad) - 1} more ranks)" if len(bad) > 1 else ""
        raise DataError(f"rank {rank} (pipeline stage {mesh.coord_of(rank)['pipe']}){more}: {problem}")
    first = reports[mesh.rank_of(pipe=first_pipe_rank)]
    last = reports[mesh.rank_of(pipe=last_pipe_rank)]
    return first[1], last[2]
