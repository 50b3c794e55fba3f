"""DeepSpeed's universal checkpoint format (checkpoint/universal.py, universal_out.py): a zerotrain
run written out by `zerotrain convert --to deepspeed-universal` resumes on another stage and
data-parallel size as the run that never stopped, and a round trip back is exact."""

from __future__ import annotations

import pytest
import torch

import zerotrain
from scenarios import base_config, tiny_gpt, train
from test_checkpoint_layouts import mean_losses, relative

from zerotrain.checkpoint.universal_out import write_universal


def cfg(stage: int, micro: int = 1, **extra) -> dict:
    return base_config(4, micro, zero_optimization={"stage": stage}, **extra)  # global batch 4


def universal(cfg_: dict) -> dict:
    return dict(cfg_, checkpoint={"load_universal": True})


@pytest.fixture(scope="module")
def two_rank_run(world2, tmp_path_factory):
    """ZeRO 1 on 2 ranks for 6 steps, saved at step 3 and converted to a universal folder."""
    folder = tmp_path_factory.mktemp("universal")
    full = world2.run(train, cfg(1), 6, 4, save=(str(folder / "zt"), 3))
    write_universal(folder / "zt", folder / "ds" / "global_step3_universal")
    return folder, full


def test_a_universal_folder_resumes_on_another_stage_and_data_size(world2, two_rank_run):
    folder, full = two_rank_run
    one = train(universal(cfg(3, micro=4)), 6, 4, load=(str(folder / "ds"), None))  # 1 process, ZeRO 3
    assert relative(one["losses"], mean_losses(full)[3:]) <= 1e-5
    two = world2.run(train, universal(cfg(0)), 6, 4, load=(str(folder / "ds"), None))  # 2 ranks, ZeRO 0
    assert relative(mean_losses(two), mean_losses(full)[3:]) <= 1e-5


def test_the_folder_is_in_deepspeeds_universal_format(two_rank_run):
    """What DeepSpeed 0.19's load_universal reads: per-parameter {"param", "cat_dim"} files and the
    step (ZeRO 1-2), optimizer_state.pt with the hyperparameters, its version and the step (ZeRO 3),
    both model-state file names, latest_universal beside the folder."""
    folder, _ = two_rank_run
    ds = folder / "ds" / "global_step3_universal"
    assert (folder / "ds" / "latest_universal").read_text() == "global_step3_universal"
    weights = torch.load(ds / "zero" / "wte.weight" / "fp32.pt", weights_only=True)
    assert weights["cat_dim"] == 0 and weights["param"].shape == (64, 32) and weights["param"].dtype == torch.float32
    assert sorted(f.name for f in (ds / "zero" / "wte.weight").iterdir()) == \
        ["exp_avg.pt", "exp_avg_sq.pt", "fp32.pt", "step.pt"]
    assert float(torch.load(ds / "zero" / "wte.weight" / "step.pt", weights_only=True)) == 3
    optim = torch.load(ds / "zero" / "optimizer_state.pt", weights_only=True)
    assert optim["ds_version"].startswith("0.19.") and optim["param_groups"][0]["lr"] == 3e-3
    assert float(optim["optimizer_state_dict"]["state"][0]["step"]) == 3
    assert optim["optimizer_state_dict"]["param_groups"] == optim["param_groups"]
    for name in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt"):
        states = torch.load(ds / name, weights_only=True)
        assert (states["global_steps"], states["dp_world_size"], states["mp_world_size"]) == (3, 2, 1)
        assert "wte.weight" in states["param_shapes"][0] and "wte.weight" not in states["module"]
        assert states["shared_params"] == {"lm_head.weight": "wte.weight"}


def test_zerotrain_to_universal_to_zerotrain_is_exact(tmp_path):
    """One process, so the arithmetic is the same: the state saved again after loading the
    universal folder equals the original, and the losses equal the run that never stopped."""
    config = cfg(2, micro=4, bf16={"enabled": True})
    full = train(config, 6, 4, save=(str(tmp_path / "zt"), 3))
    write_universal(tmp_path / "zt", tmp_path / "ds" / "global_step3_universal")
    engine, *_ = zerotrain.initialize(model=tiny_gpt(1), config=config)
    engine.load_checkpoint(str(tmp_path / "ds"), tag="global_step3_universal")
    engine.save_checkpoint(str(tmp_path / "back"))
    engine.destroy()
    was = torch.load(tmp_path / "zt" / "global_step3" / "optim_rank0.pt", weights_only=True)
    now = torch.load(tmp_path / "back" / "global_step3" / "optim_rank0.pt", weights_only=True)
    assert torch.equal(was["strategy"]["masters"][0], now["strategy"]["masters"][0])
    for key in ("exp_avg", "exp_avg_sq", "step"):
        assert torch.equal(was["optimizer"]["state"][0][key], now["optimizer"]["state"][0][key]), key
    assert was["optimizer"]["param_groups"] == now["optimizer"]["param_groups"]
    resumed = train(universal(config), 6, 4, load=(str(tmp_path / "ds"), None))
    assert resumed["losses"] == full["losses"][3:]


def _load(folder, config, tag=None, model=None):
    engine, *_ = zerotrain.initialize(model=model or tiny_gpt(1), config=config)
    try:
        return engine.load_checkpoint(str(folder), tag=tag)
    finally:
        engine.destroy()


def test_convert_command_and_wrong_input_are_one_line(tmp_path, capsys):
    from zerotrain.checkpoint.deepspeed import load_ds_file
    from zerotrain.cli import main
    from zerotrain.models import GPT, GPTConfig

    train(cfg(2, micro=4), 1, 4, save=(str(tmp_path / "zt"), 1))
    ds = tmp_path / "ds" / "global_step1_universal"
    assert main(["convert", "--to", "deepspeed-universal", str(tmp_path / "zt"), str(ds)]) == 0
    assert "15 parameters" in capsys.readouterr().out
    assert main(["convert", "--to", "deepspeed-universal", str(tmp_path / "zt"), str(ds)]) == 2
    assert "global_step1_universal exists; pass --overwrite" in capsys.readouterr().err

    config = cfg(2, micro=4)
    with pytest.raises(Exception, match=r"holds a universal checkpoint \(latest_universal names "
                                        r"global_step1_universal\) and no 'latest': set checkpoint.load_universal"):
        _load(tmp_path / "ds", config)
    with pytest.raises(Exception, match=r"load_universal is set and \S+/zt/latest_universal does not exist"):
        _load(tmp_path / "zt", universal(config))
    with pytest.raises(Exception, match=r"load_universal is set and \S+global_step1 is not a universal checkpoint"):
        _load(tmp_path / "zt", universal(config), tag="global_step1")

    other = GPT(GPTConfig(vocab_size=64, n_positions=16, n_embd=48, n_layer=2, n_head=2, bias=False))
    with pytest.raises(Exception, match=r"a DeepSpeed checkpoint of another model: blocks.0.fc.weight "
                                        r"\[128, 32\] there, \[192, 48\] here"):
        _load(tmp_path / "ds", universal(config), model=other)

    (ds / "zero" / "blocks.0.fc.weight" / "exp_avg.pt").rename(tmp_path / "exp_avg.pt")
    with pytest.raises(Exception, match=r"zero/blocks.0.fc.weight/exp_avg.pt is missing; the universal checkpoint "
                                        r"is incomplete"):
        _load(tmp_path / "ds", universal(config))
    (ds / "zero" / "blocks.0.fc.weight" / "fp32.pt").unlink()
    with pytest.raises(Exception, match=r"zero/blocks.0.fc.weight/fp32.pt is missing \(1 of 15 parameters"):
        _load(tmp_path / "ds", universal(config))

    states = load_ds_file(ds / "mp_rank_00_model_states.pt")
    torch.save(dict(states, ds_version="0.9.2"), tmp_path / "new.pt")
    (tmp_path / "new.pt").replace(ds / "mp_rank_00_model_states.pt")  # memory-mapped: replace, never rewrite
    with pytest.raises(Exception, match=r"a universal checkpoint of DeepSpeed 0.9.2; zerotrain reads the format of "
                                        r"DeepSpeed 0.19.x"):
        _load(tmp_path / "ds", universal(config))
