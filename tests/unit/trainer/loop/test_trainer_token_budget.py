"""`zerotrain train` with a token budget: the options and the DeepSpeed config's token_budget
block drive one LR, equal to Megatron-DeepSpeed's (tests/megatron_lr.py) at every step; the
banner and the run's end say what the budget does; what cannot describe a token schedule is
one line naming what can. One process, tiny GPT, a sequence-length curriculum so that the
steps hold varying numbers of tokens."""

from __future__ import annotations

import copy
import json
import logging
import re

import pytest
import torch
from megatron_lr import golden_lrs
from trainer_helpers import options, run

import zerotrain
from zerotrain import TrainerCallback
from zerotrain.errors import ConfigError
from zerotrain.trainer.args import build

CURRICULUM = {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": 8, "max_difficulty": 32,
              "schedule_type": "fixed_linear", "schedule_config": {"total_curriculum_step": 8, "difficulty_step": 8}}
TOKEN_OPTIONS = {"train_tokens": 1500, "lr_decay_tokens": 1200, "min_lr": 1e-5, "lr_decay_style": "cosine"}


class Steps(TrainerCallback):
    """Each optimizer step's (step, LR in force after it, tokens trained so far)."""

    def __init__(self):
        self.rows = []

    def on_step_end(self, trainer):
        self.rows.append((trainer.engine.global_steps, trainer.engine.get_lr()[0], trainer.tokens))
        self.scheduler = trainer.engine.lr_scheduler


def budget_options(tmp_path, source: str, **extra) -> dict:
    ds = {"curriculum_learning": CURRICULUM}
    values = {"deepspeed": ds, "line_by_line": True, "max_steps": 40, "validation_split_percentage": 0}
    if source == "config":
        ds["token_budget"] = {**TOKEN_OPTIONS, "warmup_steps": 3}
    else:
        values.update(warmup_steps=3, **TOKEN_OPTIONS)
    return options(tmp_path, **{**values, **extra})


def golden(rows) -> list[float]:
    tokens = [t for _, _, t in rows]
    per_step = [b - a for a, b in zip([0] + tokens, tokens)]
    return golden_lrs(per_step, max_lr=1e-3, min_lr=1e-5, decay_tokens=1200, style="cosine", warmup_steps=3)[1:]


@pytest.mark.parametrize("source", ["options", "config"])
def test_options_or_the_config_block_drive_one_lr_equal_to_megatron_deepspeed(tmp_path, source, capsys):
    steps = Steps()
    results, _ = run(budget_options(tmp_path, source), [steps])
    rows = steps.rows
    assert steps.scheduler is None  # no HF schedule beside the token one
    assert len({b - a for a, b in zip([0] + [t for *_, t in rows], [t for *_, t in rows])}) > 2  # tokens vary
    assert [lr for _, lr, _ in rows] == pytest.approx(golden(rows), rel=1e-12, abs=0)
    assert rows[-2][2] < 1500 <= rows[-1][2] == results["tokens"] and results["global_step"] < 40
    out = capsys.readouterr().out
    assert "  token budget: train_tokens 1,500 ends the run; max_steps 40 is only a cap\n" in out
    assert ("  LR by tokens: a 3-step warmup, then cosine decay to min_lr 1e-05 over the tokens from the warmup's end "
            "to lr_decay_tokens 1,200\n") in out
    assert (f"zerotrain: stopped at step {rows[-1][0]}: the token budget is spent ({rows[-1][2]:,} tokens trained, "
            "train_tokens 1,500), before max_steps 40\n") in out


def test_the_lr_and_the_token_count_survive_a_resume(tmp_path):
    class StopAfter(TrainerCallback):
        def on_step_end(self, trainer):
            if trainer.engine.global_steps == 7:
                raise KeyboardInterrupt

    full = Steps()
    run(budget_options(tmp_path, "options", output_dir=str(tmp_path / "full")), [full])
    cut = dict(budget_options(tmp_path, "options", output_dir=str(tmp_path / "cut")), save_strategy="steps",
               save_steps=5)
    with pytest.raises(KeyboardInterrupt):
        run(cut, [StopAfter()])
    resumed = Steps()
    run({**cut, "resume_from_checkpoint": "latest"}, [resumed])
    assert resumed.rows[0][0] == 6 and resumed.rows == full.rows[5:]
    assert [lr for _, lr, _ in full.rows] == pytest.approx(golden(full.rows), rel=1e-12, abs=0)


def test_one_token_count_in_the_engine_lines_and_the_trainer_log(tmp_path, caplog):
    logger = logging.getLogger("zerotrain")
    logger.addHandler(caplog.handler)  # initialize turns propagation off
    caplog.set_level(logging.INFO, logger="zerotrain")
    try:
        values = budget_options(tmp_path, "options", max_steps=6)
        values["deepspeed"]["steps_per_print"] = 2
        _, records = run(values)
    finally:
        logger.removeHandler(caplog.handler)
    engine_lines = [re.search(r"^step=(\d+) .* tokens=(\d+)$", r.getMessage()) for r in caplog.records]
    engine_tokens = {int(m.group(1)): int(m.group(2)) for m in engine_lines if m}
    assert sorted(engine_tokens) == [2, 4, 6]
    assert engine_tokens == {r["step"]: r["tokens"] for r in records if r["step"] in engine_tokens}


def test_a_budget_beside_a_step_schedule_says_so():
    from types import SimpleNamespace

    from zerotrain.trainer.report.banner import token_budget_lines

    budget = SimpleNamespace(enabled=True, train_tokens=25000, lr_decay_tokens=None)
    assert token_budget_lines(budget, 3000) == [
        "  token budget: train_tokens 25,000 ends the run; max_steps 3000 is only a cap",
        "  LR by steps, planned for max_steps 3000: the budget may end the run early in the schedule; "
        "--lr_decay_tokens sets the LR by tokens"]
    assert token_budget_lines(SimpleNamespace(enabled=True, train_tokens=None, lr_decay_tokens=None), 9) == []


def test_the_step_the_budget_ends_on_is_logged(tmp_path):
    results, records = run(budget_options(tmp_path, "options", logging_steps=5))
    assert results["global_step"] % 5 and records[-1]["step"] == results["global_step"]
    assert records[-1]["tokens"] == results["tokens"] >= 1500


def test_the_run_says_when_max_steps_ends_it_first(tmp_path, capsys):
    results, _ = run(budget_options(tmp_path, "options", max_steps=4))
    assert (f"zerotrain: stopped at step 4: max_steps 4 reached with {results['tokens']:,} of train_tokens 1,500 "
            "trained; raise --max_steps (or num_train_epochs) to train the whole budget\n") in capsys.readouterr().out


# ---- what cannot describe a token schedule: one line each, before anything is loaded ----------------
def preflight_error(tmp_path, **values) -> str:
    from zerotrain.trainer.preflight import check_deepspeed_config

    explicit: set[str] = set()
    _, _, train_args = build(options(tmp_path, **values), explicit)
    with pytest.raises(ConfigError) as err:
        check_deepspeed_config(train_args, explicit, 1, 32)
    return str(err.value)


@pytest.mark.parametrize("values,message", [
    ({"warmup_ratio": 0.1}, "warmup_ratio 0.1 is a fraction of max_steps, which with lr_decay_tokens is only a cap; "
                            "give the warmup in steps (--warmup_steps N) or in tokens (--lr_warmup_tokens N)"),
    ({"warmup_steps": 0.05}, "warmup_steps 0.05 is a fraction of max_steps, which with lr_decay_tokens is only a cap; "
                             "give the warmup in steps (--warmup_steps N) or in tokens (--lr_warmup_tokens N)"),
    ({"lr_scheduler_type": "cosine"}, "lr_scheduler_type cosine and lr_decay_tokens both choose the LR schedule; with "
                                      "token-based decay give its shape as --lr_decay_style (linear, cosine, "
                                      "constant, inverse-square-root)"),
    ({"deepspeed": {"token_budget": {"lr_decay_tokens": 900}}},
     "the DeepSpeed config disagrees with the options: token_budget.lr_decay_tokens=900 vs --lr_decay_tokens 1000. "
     "Make them equal, set the DeepSpeed value to \"auto\", or drop the option"),
    ({"warmup_steps": 5, "lr_warmup_tokens": 50}, "token_budget.lr_warmup_tokens: and warmup_steps both set the warmup; "
                                                  "keep one"),
])
def test_lr_options_that_do_not_fit_a_token_schedule(tmp_path, values, message):
    assert preflight_error(tmp_path, lr_decay_tokens=1000, **values) == message


def test_token_lr_options_need_lr_decay_tokens(tmp_path):
    assert preflight_error(tmp_path, min_lr=1e-5) == ("min_lr is for the token-based LR: add --lr_decay_tokens N (an HF "
                                                      "schedule takes its floor as lr_scheduler_kwargs {\"min_lr\": ...})")
    assert preflight_error(tmp_path, lr_warmup_tokens=10) == ("lr_warmup_tokens is for the token-based LR: add "
                                                              "--lr_decay_tokens N")


@pytest.mark.parametrize("name,value,message", [
    ("lr_decay_samples", "3000", "lr_decay_samples: not a zerotrain option; use --lr_decay_tokens: 3000 samples x the "
                                 "full sequence length (block_size)"),
    ("lr-decay-iters", "50", "lr-decay-iters: not a zerotrain option; use --lr_decay_tokens: 50 iterations x the full "
                             "sequence length (block_size) x the global batch (samples per optimizer step)"),
    ("rampup_batch_size", "16 16 1000", "rampup_batch_size: not a zerotrain option; a batch-size ramp-up is not "
                                        "supported; with a sequence-length curriculum the recipe removes it (both "
                                        "shrink the early batches' tokens): drop it and keep a fixed batch"),
])
def test_megatron_sample_and_iteration_options_are_refused_with_the_conversion(tmp_path, name, value, message):
    with pytest.raises(ConfigError) as err:
        build(options(tmp_path, **{name: value}), set())
    assert str(err.value) == message


def test_rampup_batch_size_takes_its_three_values_from_the_command_line():
    from zerotrain.commands.train import split_foreign

    assert split_foreign(["--rampup-batch-size", "16", "16", "1000", "opts.yaml", "--push_to_hub", "false"]) == \
        (["opts.yaml"], {"rampup-batch-size": "16 16 1000", "push_to_hub": "false"})


def test_dashed_megatron_spellings_and_mbgd(tmp_path):
    notices: list[str] = []
    _, _, args = build(options(tmp_path, **{"train-tokens": "800", "lr-decay-tokens": "700", "optim": "mbgd"}),
                       set(), notices)
    assert (args.train_tokens, args.lr_decay_tokens, args.optim) == (800, 700, "sgd")
    assert notices == ["optim mbgd: mini-batch gradient descent is SGD over mini-batches; training with sgd"]


# ---- optimizer.params.max_grad_norm: the same answer from initialize, `zerotrain config`, train ------
@pytest.mark.parametrize("clipping", [True, False])
def test_max_grad_norm_in_the_optimizer_params_is_answered_alike_everywhere(tmp_path, clipping):
    from zerotrain.commands.config import resolve
    from zerotrain.trainer.preflight import check_deepspeed_config

    ds = {"train_micro_batch_size_per_gpu": 4,
          "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "max_grad_norm": 1.0, "betas": [0.9, 0.95]}}}
    if clipping:
        ds["gradient_clipping"] = 1.0
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(ds), encoding="utf-8")
    refusal = ("optimizer.params.max_grad_norm: zerotrain clips with the top-level key; set \"gradient_clipping\": "
               "1.0 (with it this key is accepted and has no effect)")
    explicit: set[str] = set()
    _, _, train_args = build(options(tmp_path, deepspeed=str(path)), explicit)
    answers = []
    for door in (lambda: zerotrain.initialize(model=torch.nn.Linear(2, 2), config=copy.deepcopy(ds)),
                 lambda: resolve(str(path), 1), lambda: check_deepspeed_config(train_args, explicit, 1, 32)):
        try:
            door()
            answers.append("accepted")
        except ConfigError as err:
            answers.append(str(err))
    assert answers == (["accepted"] * 3 if clipping else [refusal] * 3)
    if clipping:
        table, _, notice = resolve(str(path), 1)
        assert "optimizer.params.max_grad_norm (gradient_clipping clips)" in notice
        assert ("optimizer.params.max_grad_norm", "1.0", "user, no effect: gradient_clipping clips") in table


def test_the_lr_axis_shows_the_whole_schedule():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from zerotrain.trainer.report.plot import lr_axis

    fig, ax = plt.subplots()
    lrs = [1.5e-4, 1.49e-4, 1.48e-4, 1.47e-4]
    ax.plot(range(4), lrs)
    lr_axis(ax, lrs)
    fig.canvas.draw()
    low, high = ax.get_ylim()
    assert low == 0.0 and high == pytest.approx(1.5e-4 * 1.05)  # a 2% move stays a 2% move
    assert ax.yaxis.get_major_formatter().get_offset() == "1e−4"  # a scale, never an offset
    plt.close(fig)
