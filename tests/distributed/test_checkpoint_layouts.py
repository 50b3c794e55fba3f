"""A checkpoint resumes on another ZeRO stage and data-parallel size (checkpoint/reshard.py),
another tensor-parallel size or pipeline (checkpoint/resplit.py), and another optimizer
offload: the resumed run's next losses are those of the run that never stopped, on its own
layout, with gradient clipping on."""

from __future__ import annotations

import pytest

import pipe_scenarios as ps
import tp_scenarios as ts
from scenarios import base_config, train
from asserts import assert_params_close


def cfg(stage: int, **extra) -> dict:
    return base_config(4, 1, **{"zero_optimization": {"stage": stage}, **extra})  # global batch 4


def mean_losses(ranks: list[dict]) -> list[float]:
    """The global batch's loss per step: the mean of the ranks' (equal-sized) slices."""
    return [sum(step) / len(step) for step in zip(*(r["losses"] for r in ranks))]


def relative(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b) and a
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


@pytest.mark.parametrize("was,now", [(0, 3), (3, 0)])
def test_two_ranks_change_stage(world2, tmp_path, was, now):
    full = world2.run(train, cfg(was), 6, 4, save=(str(tmp_path), 3))
    resumed = world2.run(train, cfg(now), 6, 4, load=(str(tmp_path), None))
    assert relative(mean_losses(resumed), mean_losses(full)[3:]) <= 1e-5
    assert_params_close(resumed[0]["params"], full[0]["params"], rtol=1e-5)


def test_bf16_masters_carry_over_from_stage3_to_stage0(tmp_path):
    """One process, so the reduction order is the same and the losses are equal exactly; the
    fp32 masters, not the bf16 weights, must seed the new masters (which moves them by 5e-5)."""
    def bf16(stage):  # one micro-batch per step: stages accumulate bf16 gradients differently
        return base_config(4, 4, zero_optimization={"stage": stage}, bf16={"enabled": True})

    full = train(bf16(3), 6, 4, save=(str(tmp_path), 3))
    resumed = train(bf16(0), 6, 4, load=(str(tmp_path), None))
    assert resumed["losses"] == full["losses"][3:]
    assert_params_close(resumed["params"], full["params"], rtol=0)


def test_stage1_on_two_ranks_resumes_at_stage2_on_four(world2, world4, tmp_path):
    full = world2.run(train, cfg(1), 6, 4, save=(str(tmp_path), 3))
    resumed = world4.run(train, cfg(2), 6, 4, load=(str(tmp_path), None))
    assert relative(mean_losses(resumed), mean_losses(full)[3:]) <= 1e-5
    assert_params_close(resumed[3]["params"], full[0]["params"], rtol=1e-5)


def test_a_checkpoint_of_another_model_names_what_differs(tmp_path):
    import torch

    import zerotrain
    from scenarios import tiny_gpt

    train(cfg(2), 1, 4, save=(str(tmp_path), 1))
    model = tiny_gpt()
    model.lm_head = torch.nn.Linear(32, 65, bias=False)  # another vocabulary size, untied
    engine, *_ = zerotrain.initialize(model=model, config=cfg(3))
    with pytest.raises(Exception, match=r"another model: .*lm_head.weight only in this model|"
                                        r"another model: .*\[64, 32\] there, \[65, 32\] here"):
        engine.load_checkpoint(str(tmp_path))
    engine.destroy()


@pytest.mark.parametrize("source", ["zerotrain", "deepspeed"])
def test_another_count_of_param_groups_is_one_line(tmp_path, source):
    """Param groups pair with the checkpoint's in order: one group saved, two now (weight decay
    split), from zerotrain's checkpoint on the same layout and from DeepSpeed's fixture (read
    through the relayout)."""
    import json
    from pathlib import Path

    import zerotrain
    from scenarios import tiny_gpt
    from zerotrain.models import GPT, GPTConfig

    if source == "zerotrain":
        train(cfg(1), 1, 4, save=(str(tmp_path), 1))
        model, config, folder = tiny_gpt(), cfg(1), str(tmp_path)
    else:
        fixture = Path(__file__).resolve().parents[1] / "fixtures" / "deepspeed_zero2_bf16_2ranks"
        expected = json.loads((fixture / "expected.json").read_text())
        spec = {k: v for k, v in expected["model"].items() if k != "seed"}
        model, folder = GPT(GPTConfig(**spec)), str(fixture)
        config = dict(expected["config"], train_micro_batch_size_per_gpu=4)
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.dim() > 1]},
              {"params": [p for p in params if p.dim() <= 1], "weight_decay": 0.0}]
    engine, *_ = zerotrain.initialize(model=model, model_parameters=groups, config=config)
    with pytest.raises(Exception, match=r"its optimizer has 1 parameter group\(s\), this run's has 2; give the "
                                        r"optimizer the same param groups"):
        engine.load_checkpoint(folder)
    engine.destroy()


def test_a_missing_rank_file_is_named(world2, tmp_path):
    world2.run(train, cfg(1), 1, 4, save=(str(tmp_path), 1))
    folder = tmp_path / "global_step1"
    (folder / "optim_rank1.pt").unlink()
    import json
    manifest = json.loads((folder / "manifest.json").read_text())
    del manifest["files"]["optim_rank1.pt"]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(Exception, match=r"optim_rank1.pt is missing \(2 ranks wrote this checkpoint"):
        train(cfg(3), 2, 4, load=(str(tmp_path), None))


def test_data2_tensor2_resumes_on_data4_at_stage3(world4, tmp_path):
    """Tensor pieces (fused q/k/v, the vocabulary split, row- and column-split layers) joined
    into stage-3 shards of 4 data ranks: weights, masters and Adam moments alike."""
    full = world4.run(ts.train, ts.config(8, 2, 1, tensor=2), 5, save=(str(tmp_path), 3))
    resumed = world4.run(ts.train, ts.config(8, 2, 3), 5, load=str(tmp_path))
    assert relative(mean_losses(resumed), mean_losses(full)[3:]) <= 1e-5
    assert_params_close(resumed[0]["params"], full[0]["params"], rtol=1e-5)


def test_two_pipeline_stages_resume_in_one_process(world2, tmp_path):
    """Stage files hold layers by their index; one process holds them all (the tied embedding
    once), as a one-stage pipeline or as a plain model of the same layers (read in layer order).
    Curriculum and progressive layer drop counters carry over too."""
    full = world2.run(ps.pipeline_run, ps.config(4, 1, 1), 5, num_stages=2, save=(str(tmp_path), 3))
    resumed = ps.pipeline_run(ps.config(4, 1, 0), 5, num_stages=1, load=str(tmp_path))
    assert relative(resumed["losses"], full[0]["losses"][3:]) <= 1e-5
    assert resumed["seqlens"] == full[0]["seqlens"][3:]
    plain = ps.reference_run(ps.config(4, 1, 1), 5, load=str(tmp_path))
    assert relative(plain["losses"], full[0]["losses"][3:]) <= 1e-5
    assert plain["tokens"] == full[0]["tokens"][3:]
    assert_params_close(plain["params"], ps.to_reference_names(full[0]["params"] | full[1]["params"]), rtol=1e-5)


def offload(stage: int, device: str, nvme_path: str) -> dict:
    zero = {"stage": stage}
    if device != "none":
        zero["offload_optimizer"] = {"device": device, "nvme_path": nvme_path}
    return cfg(stage, zero_optimization=zero, gradient_clipping=1.0)


def test_nvme_offload_resumes_without_it_and_back(world2, tmp_path):
    """The swap-file copies of an NVMe run (2 ranks) resume without offload on the same layout
    and in one process at stage 3; that run's checkpoint resumes into NVMe files again."""
    swap, ckpt, again = tmp_path / "swap", str(tmp_path / "nvme"), str(tmp_path / "none")
    swap.mkdir()
    full = world2.run(train, offload(2, "nvme", str(swap)), 6, 4, save=(ckpt, 3))
    same = world2.run(train, offload(2, "none", str(swap)), 6, 4, load=(ckpt, None))
    one = train(offload(3, "none", str(swap)), 6, 4, save=(again, 4), load=(ckpt, None))
    back = train(offload(1, "nvme", str(swap)), 6, 4, load=(again, None))
    want = mean_losses(full)
    assert relative(mean_losses(same), want[3:]) <= 1e-5
    assert relative(one["losses"], want[3:]) <= 1e-5
    assert relative(back["losses"], want[4:]) <= 1e-5
