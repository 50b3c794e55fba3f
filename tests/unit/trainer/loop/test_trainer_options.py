"""Each TrainingArguments option changes what training does (one process, tiny GPT, ~1 s a run)."""

from __future__ import annotations

import datetime
import json
import math
import os

import pytest
import torch
from trainer_helpers import Capture, options, run, write_text

from zerotrain.errors import ConfigError
from zerotrain.trainer import TrainerCallback


def losses(records):
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def lrs(records):
    return {r["step"]: r["lr"] for r in records if "lr" in r}


def test_batch_size_accumulation_epochs_and_max_steps(tmp_path):
    base = dict(max_train_samples=40, max_steps=-1, num_train_epochs=1, validation_split_percentage=0)
    res, recs = run(options(tmp_path, **base, output_dir=str(tmp_path / "a")))
    assert res["global_step"] == 10 and recs[0]["tokens"] == 4 * 32  # 40 samples / 4 per step
    res, recs = run(options(tmp_path, **base, gradient_accumulation_steps=2, output_dir=str(tmp_path / "b")))
    assert res["global_step"] == 5 and recs[0]["tokens"] == 2 * 4 * 32
    res, _ = run(options(tmp_path, **{**base, "num_train_epochs": 2.5}, per_device_train_batch_size=8,
                         output_dir=str(tmp_path / "c")))
    assert res["global_step"] == 13 and res["epoch"] == 2.6  # ceil(2.5 x 5 steps), whole steps
    res, _ = run(options(tmp_path, **{**base, "max_steps": 3}, output_dir=str(tmp_path / "d")))
    assert res["global_step"] == 3  # max_steps wins over epochs


def test_learning_rate_warmup_and_schedule_types(tmp_path):
    _, recs = run(options(tmp_path, learning_rate=1e-3, warmup_steps=2, lr_scheduler_type="linear"))
    got = lrs(recs)
    for step, f in {1: 0.5, 2: 1.0, 3: 0.75, 4: 0.5, 6: 0.0}.items():  # HF: step/W, then (N-s)/(N-W)
        assert got[step] == pytest.approx(1e-3 * f, abs=1e-12)
    for extra in ({"warmup_ratio": 0.5}, {"warmup_steps": 0.5}):  # both mean 3 warmup steps of 6
        _, recs = run(options(tmp_path, learning_rate=1e-3, overwrite_output_dir=True, **extra))
        assert lrs(recs)[1] == pytest.approx(1e-3 / 3)
    _, recs = run(options(tmp_path, learning_rate=1e-3, lr_scheduler_type="cosine", max_steps=4,
                          overwrite_output_dir=True))
    assert lrs(recs)[2] == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    _, recs = run(options(tmp_path, learning_rate=1e-3, lr_scheduler_type="cosine_with_min_lr",
                          lr_scheduler_kwargs={"min_lr_rate": 0.1}, max_steps=4, overwrite_output_dir=True))
    assert lrs(recs)[4] == pytest.approx(1e-4)


def test_optimizer_options_reach_the_optimizer(tmp_path):
    cap = Capture()
    run(options(tmp_path, optim="adamw", adam_beta1=0.8, adam_beta2=0.9, adam_epsilon=1e-6, weight_decay=0.3,
                max_steps=1), [cap])
    opt = cap.trainer.engine.optimizer
    assert type(opt) is torch.optim.AdamW
    decay, no_decay = opt.param_groups
    assert decay["betas"] == (0.8, 0.9) and decay["eps"] == 1e-6 and decay["weight_decay"] == 0.3
    assert no_decay["weight_decay"] == 0.0  # biases and LayerNorm weights are not decayed
    for optim, cls, momentum in (("adam", torch.optim.Adam, None), ("sgd", torch.optim.SGD, 0.0),
                                 ("momentum", torch.optim.SGD, 0.9)):
        cap = Capture()
        run(options(tmp_path, optim=optim, max_steps=1, overwrite_output_dir=True), [cap])
        opt = cap.trainer.engine.optimizer
        assert type(opt) is cls
        if momentum is not None:
            assert opt.param_groups[0]["momentum"] == momentum


def _one_sgd_step_change(tmp_path, name, clip):
    from zerotrain.trainer.data.prepare import prepare
    from zerotrain.trainer.args import DataArguments, ModelArguments, TrainingArguments
    from zerotrain.trainer.data.tokenizer import byte_tokenizer
    from zerotrain.trainer.model.build import build_model
    from zerotrain.trainer import Trainer
    from zerotrain.comm import Comm, ParallelState

    tok = byte_tokenizer()
    data = prepare(ModelArguments(), DataArguments(train_file=str(write_text(tmp_path / "t.txt")), block_size=32,
                                                   cache_dir=str(tmp_path / "c")), 0, tok, 128,
                   Comm(ParallelState()))
    torch.manual_seed(0)
    model, info = build_model(None, "gpt-tiny", "clm", tok)
    before = [p.detach().clone() for p in model.parameters()]
    args = TrainingArguments(output_dir=str(tmp_path / name), optim="sgd", learning_rate=1.0, max_grad_norm=clip,
                             max_steps=1, save_strategy="no", report_to="none", disable_tqdm=True,
                             lr_scheduler_type="constant")
    Trainer(model, args, data.train, tokenizer=tok, model_info=info).train()
    return math.sqrt(sum(((p.detach() - b) ** 2).sum().item() for p, b in zip(model.parameters(), before)))


def test_max_grad_norm_bounds_the_update(tmp_path):
    clipped = _one_sgd_step_change(tmp_path, "a", 1e-3)
    free = _one_sgd_step_change(tmp_path, "b", 0.0)
    assert clipped == pytest.approx(1e-3, rel=1e-3)  # lr 1 x the clipped gradient norm
    assert free > 0.1


def test_precision_flags(tmp_path):
    cap = Capture()
    _, recs = run(options(tmp_path, bf16=True, max_steps=2), [cap])
    last = [r for r in recs if "loss" in r][-1]
    assert next(cap.trainer.model.parameters()).dtype == torch.bfloat16 and "loss_scale" not in last
    _, recs = run(options(tmp_path, fp16=True, max_steps=2, overwrite_output_dir=True))
    last = [r for r in recs if "loss" in r][-1]
    assert last["loss_scale"] == 2.0 ** 16 and math.isfinite(last["loss"])


def test_seed_decides_weights_data_order_and_dropout(tmp_path):
    a = losses(run(options(tmp_path, seed=1, output_dir=str(tmp_path / "a")))[1])
    b = losses(run(options(tmp_path, seed=1, output_dir=str(tmp_path / "b")))[1])
    c = losses(run(options(tmp_path, seed=2, output_dir=str(tmp_path / "c")))[1])
    assert a == b and a != c


def test_logging_and_eval_steps_and_strategies(tmp_path):
    _, recs = run(options(tmp_path, logging_steps=2, eval_strategy="steps", eval_steps=3, max_steps=6))
    assert [r["step"] for r in recs if "loss" in r] == [2, 4, 6]
    assert [r["step"] for r in recs if "eval_loss" in r] == [3, 6]
    _, recs = run(options(tmp_path, eval_strategy="epoch", save_strategy="epoch", max_steps=-1, num_train_epochs=2,
                          max_train_samples=12, overwrite_output_dir=True))
    assert [r["step"] for r in recs if "eval_loss" in r] == [3, 6]  # 12 samples / 4 = 3 steps an epoch
    assert sorted(p.name for p in (tmp_path / "out").glob("checkpoint-*")) == ["checkpoint-3", "checkpoint-6"]


def test_save_steps_total_limit_and_best_checkpoint(tmp_path):
    res, _ = run(options(tmp_path, save_strategy="steps", save_steps=2, save_total_limit=2, eval_strategy="steps",
                         eval_steps=2, max_steps=6))
    out = tmp_path / "out"
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-6"]
    assert (out / "latest").read_text().strip() == "checkpoint-6"
    assert res["best_checkpoint"].endswith("checkpoint-6")  # the loss falls, so the last is best
    for folder in out.glob("checkpoint-*"):  # each checkpoint is also a loadable model folder
        assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()


def test_rotation_keeps_the_best_checkpoint(tmp_path):
    from zerotrain.trainer.loop.run_folder import rotate

    for step in (2, 4, 6, 8):
        (tmp_path / f"checkpoint-{step}").mkdir()
    rotate(tmp_path, 2, tmp_path / "checkpoint-2")
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-8"]


class StopAfter(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, trainer):
        if trainer.engine.global_steps == self.step:
            raise KeyboardInterrupt


def test_resume_from_checkpoint_continues_exactly(tmp_path):
    opts = dict(max_steps=8, save_strategy="steps", save_steps=3, dataloader_num_workers=0, max_train_samples=20)
    full = losses(run(options(tmp_path, **opts, output_dir=str(tmp_path / "full")))[1])
    with pytest.raises(KeyboardInterrupt):
        run(options(tmp_path, **opts, output_dir=str(tmp_path / "cut")), [StopAfter(5)])
    res, recs = run(options(tmp_path, **opts, output_dir=str(tmp_path / "cut"), resume_from_checkpoint="latest"))
    resumed = losses(recs)
    assert sorted(resumed) == list(range(1, 9))  # steps 4-5 of the killed run are logged once, anew
    assert resumed == full  # the same batches, masks and updates as the uninterrupted run
    assert res["epoch"] == pytest.approx(8 * 4 / 20)


def test_gradient_checkpointing_recomputes_blocks_with_the_same_result(tmp_path):
    calls = {}

    class CountBlock(TrainerCallback):
        def __init__(self, key):
            self.key = key

        def on_train_end(self, trainer):
            calls[self.key] = trainer.model.blocks[0].calls

    def counting(key):
        from zerotrain.trainer.model import build as models

        real = models.build_model

        def build(*a, **k):
            model, info = real(*a, **k)
            block = model.blocks[0]
            block.calls = 0
            block.register_forward_pre_hook(lambda m, args: setattr(m, "calls", m.calls + m.training))
            return model, info
        return build

    for key, flag in (("plain", False), ("checkpointed", True)):
        from zerotrain.trainer.model import build as models

        mp = pytest.MonkeyPatch()
        mp.setattr(models, "build_model", counting(key))
        try:
            _, recs = run(options(tmp_path, gradient_checkpointing=flag, max_steps=3, output_dir=str(tmp_path / key)),
                          [CountBlock(key)])
        finally:
            mp.undo()
        calls[key + "_loss"] = losses(recs)
    assert calls["plain"] == 3 and calls["checkpointed"] == 6  # the block runs again in each backward
    assert calls["plain_loss"] == calls["checkpointed_loss"]


def test_ddp_timeout_reaches_init_process_group(tmp_path, monkeypatch):
    import zerotrain.comm.collectives as comm

    seen = {}

    def fake_init(**kwargs):
        seen.update(kwargs)
        raise RuntimeError("stop here")

    monkeypatch.setattr(comm.dist, "init_process_group", fake_init)
    monkeypatch.setattr(comm.dist, "is_initialized", lambda: False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(RuntimeError, match="stop here"):
        run(options(tmp_path, ddp_timeout=123))
    # the backend gets what is left after naming the culprit rank takes its share
    assert seen["timeout"] == datetime.timedelta(seconds=123 - comm._DIAGNOSIS_S)


class Unused(torch.nn.Module):
    """A model with a layer that never gets a gradient."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(300, 8)
        self.out = torch.nn.Linear(8, 300)
        self.spare = torch.nn.Linear(8, 8)

    def forward(self, input_ids, labels=None):
        logits = self.out(self.emb(input_ids))
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)


@pytest.mark.parametrize("flag", [False, None, True])
def test_ddp_find_unused_parameters(tmp_path, flag):
    from zerotrain.trainer import Trainer, TrainingArguments

    data = [{"input_ids": [1, 2, 3, 4]}] * 8
    args = TrainingArguments(output_dir=str(tmp_path / "o"), max_steps=2, per_device_train_batch_size=2,
                             ddp_find_unused_parameters=flag, save_strategy="no", report_to="none",
                             disable_tqdm=True)
    trainer = Trainer(Unused(), args, data)
    if flag is False:
        with pytest.raises(ConfigError, match="parameter spare.weight got no gradient in step 1"):
            trainer.train()
    else:
        assert trainer.train()["global_step"] == 2


class PidDataset(torch.utils.data.Dataset):
    def __init__(self, log):
        self.log = log

    def __len__(self):
        return 16

    def __getitem__(self, i):
        with open(self.log, "a") as f:
            f.write(f"{os.getpid()}\n")
        return {"input_ids": [i % 7 + 1] * (4 + i % 3)}


def test_dataloader_num_workers_loads_in_worker_processes(tmp_path):
    from zerotrain.trainer import Trainer, TrainingArguments

    results = {}
    for workers in (0, 2):
        log = tmp_path / f"pids{workers}.txt"
        args = TrainingArguments(output_dir=str(tmp_path / f"o{workers}"), max_steps=4, per_device_train_batch_size=2,
                                 dataloader_num_workers=workers, save_strategy="no", report_to="none",
                                 disable_tqdm=True)
        torch.manual_seed(0)
        results[workers] = Trainer(Unused(), args, PidDataset(str(log))).train()["train_loss"]
        pids = set(log.read_text().split())
        assert (str(os.getpid()) in pids) == (workers == 0)
        assert len(pids) == (1 if workers == 0 else 2)
    assert results[0] == results[2]  # same batches either way


def test_per_device_eval_batch_size_sets_eval_batches(tmp_path):
    counts = {}

    class CountEval(TrainerCallback):
        def __init__(self, key):
            self.key = key

        def on_train_end(self, trainer):
            n = [0]
            handle = trainer.model.register_forward_pre_hook(lambda m, a: n.__setitem__(0, n[0] + 1))
            trainer.evaluate()
            handle.remove()
            counts[self.key] = (n[0], len(trainer.eval_dataset))

    for size in (2, 5):
        run(options(tmp_path, per_device_eval_batch_size=size, max_steps=1, validation_split_percentage=10,
                    output_dir=str(tmp_path / str(size))), [CountEval(size)])
    n_eval = counts[2][1]
    assert counts[2][0] == math.ceil(n_eval / 2) and counts[5][0] == math.ceil(n_eval / 5)


def test_group_by_length_feeds_length_sorted_batches(tmp_path):
    cap = Capture()
    run(options(tmp_path, line_by_line=True, group_by_length=True, max_steps=2, block_size=64), [cap])
    t = cap.trainer
    first = t.sampler.indices()[:4]
    lengths = t.train_dataset["length"]
    assert t.sampler.lengths is not None
    assert max(lengths[i] for i in first) == max(lengths)  # the longest batch goes first
    assert max(lengths[i] for i in first) - min(lengths[i] for i in first) <= 4


def test_deepspeed_option_sets_zero_stage_and_refuses_conflicts(tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": "auto"}))
    cap = Capture()
    run(options(tmp_path, deepspeed=str(ds), max_steps=2), [cap])
    assert cap.trainer.engine.strategy.stage == 3
    ds.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2}))
    with pytest.raises(ConfigError, match="train_micro_batch_size_per_gpu=2 vs --per_device_train_batch_size 4"):
        run(options(tmp_path, deepspeed=str(ds), overwrite_output_dir=True))


def test_output_dir_is_not_overwritten_without_the_flag(tmp_path):
    run(options(tmp_path, save_strategy="steps", save_steps=2))
    out = tmp_path / "out"
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    with pytest.raises(ConfigError, match="is not empty .* --overwrite_output_dir"):
        run(options(tmp_path, save_steps=2))
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before
    (out / "notes.txt").write_text("mine")
    run(options(tmp_path, save_strategy="steps", save_steps=5, max_steps=5, overwrite_output_dir=True))
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-5"]  # the old run's are gone
    assert (out / "notes.txt").read_text() == "mine"


def test_reduce_lr_on_plateau_is_fed_the_eval_loss(tmp_path):
    _, recs = run(options(tmp_path, lr_scheduler_type="reduce_lr_on_plateau", eval_strategy="steps", eval_steps=1,
                          lr_scheduler_kwargs={"patience": 0, "factor": 0.5, "eps": 0.0}, learning_rate=1e-9, max_steps=4))
    got = lrs(recs)
    assert got[1] == 1e-9 and got[2] == 1e-9  # first eval sets the best; the flat loss then halves the lr
    assert got[3] == pytest.approx(5e-10) and got[4] == pytest.approx(2.5e-10)
