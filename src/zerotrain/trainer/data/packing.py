"""--packing: several tokenized examples in one block_size sequence, each still on its own.

    examples   [a a a] [b b] [c c c c]          block_size 8
    packed     input_ids     a a a b b c c c | c ...     (an example never straddles two blocks)
               position_ids  0 1 2 0 1 0 1 2        positions restart per example
               labels        . a a . b . c c        the first token of each example is not a
                                                    target (it would be predicted from the one before)

HF models (transformers >= 4.53) see position ids that restart and no attention mask as packed
sequences and keep attention within each example (a block-diagonal causal mask), so packing
changes the padding, not what each example sees.
"""

from __future__ import annotations


def pack(batch: dict, block_size: int) -> dict:
    """A batched datasets.map function: consecutive examples packed greedily into blocks."""
    out = {"input_ids": [], "labels": [], "position_ids": [], "length": []}
    ids, labels, positions = [], [], []

    def close():
        if ids:
            out["input_ids"].append(list(ids))
            out["labels"].append(list(labels))
            out["position_ids"].append(list(positions))
            out["length"].append(len(ids))
            ids.clear(), labels.clear(), positions.clear()

    for example_ids, example_labels in zip(batch["input_ids"], batch["labels"]):
        n = len(example_ids)
        if len(ids) + n > block_size:
            close()
        ids.extend(example_ids)
        labels.extend([-100] + list(example_labels[1:]))
        positions.extend(range(n))
    close()
    return out
