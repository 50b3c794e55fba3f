"""The banner rank 0 prints once the engine is built: engine/summary.py's lines (the same that
initialize logs), with the task and the number of steps the trainer knows, and what a token
budget changes, and how a seqlen curriculum's lengths are rounded under sequence parallelism;
initialize has logged the config notice already.

      token budget: train_tokens 2,000,000 ends the run; max_steps 3000 is only a cap
      LR by tokens: 5-step warmup, then cosine decay to min_lr 1e-05 over the tokens from the warmup's
        end to lr_decay_tokens 1,800,000
      seqlen curriculum: lengths below max_difficulty 512 rounded down to a multiple of sequence
        parallel 4 (never below 4); each token counted once
"""

from __future__ import annotations

from ...engine.summary import render
from ...features.curriculum import CurriculumFeature


def banner(engine, model, task: str, total_steps: int, nodes: int) -> str:
    lines = [render(engine, model, task=task, total_steps=total_steps, nodes=nodes, notices=False)]
    lines += token_budget_lines(engine.config.token_budget, total_steps)
    lines += curriculum_lines(engine.feature(CurriculumFeature))
    return "\n".join(lines)


def curriculum_lines(curriculum) -> list[str]:
    """What sequence parallelism does to a seqlen curriculum's lengths (none without both)."""
    if curriculum is None or curriculum.multiple <= 1:
        return []
    top, size = curriculum.scheduler.state["max_difficulty"], curriculum.multiple
    return [f"  seqlen curriculum: lengths below max_difficulty {top} rounded down to a multiple of sequence "
            f"parallel {size} (never below {size}); each token counted once"]


def token_budget_lines(budget, total_steps: int) -> list[str]:
    """What a token budget changes: the run's end and the LR (none without a budget)."""
    if budget is None or not budget.enabled or (budget.train_tokens is None and budget.lr_decay_tokens is None):
        return []
    lines = []
    if budget.train_tokens is not None:
        lines.append(f"  token budget: train_tokens {budget.train_tokens:,} ends the run; max_steps {total_steps} is "
                     "only a cap")
    if budget.lr_decay_tokens is None:
        lines.append(f"  LR by steps, planned for max_steps {total_steps}: the budget may end the run early in "
                     "the schedule; --lr_decay_tokens sets the LR by tokens")
    else:
        warmup = (f"a warmup over {budget.lr_warmup_tokens:,} tokens" if budget.lr_warmup_tokens
                  else f"a {budget.warmup_steps}-step warmup" if budget.warmup_steps else "no warmup")
        if budget.lr_decay_style == "constant":
            lines.append(f"  LR by tokens: {warmup}, then constant (lr_decay_tokens {budget.lr_decay_tokens:,})")
        else:
            lines.append(f"  LR by tokens: {warmup}, then {budget.lr_decay_style} decay to min_lr {budget.min_lr:g} "
                         f"over the tokens from the warmup's end to lr_decay_tokens {budget.lr_decay_tokens:,}")
    return lines


def stop_line(tokens: int, budget, step: int, max_steps: int) -> str | None:
    """Which of the two ends stopped a run with a token budget: the budget or the step cap."""
    if budget is None or budget.train_tokens is None:
        return None
    if tokens >= budget.train_tokens:
        return (f"zerotrain: stopped at step {step}: the token budget is spent ({tokens:,} tokens trained, "
                f"train_tokens {budget.train_tokens:,}), before max_steps {max_steps}")
    return (f"zerotrain: stopped at step {step}: max_steps {max_steps} reached with {tokens:,} of train_tokens "
            f"{budget.train_tokens:,} trained; raise --max_steps (or num_train_epochs) to train the whole budget")
