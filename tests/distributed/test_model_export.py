"""engine.save_16bit_model on 2 real ranks: ZeRO-3 gathers the sharded weights, rank 0 writes
one whole file, equal to what one process trains. save_checkpoint with a tag that differs
between ranks stops every rank with one line; with folders that differ, every rank saves into
rank 0's and says so."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file as load_safetensors

import zerotrain
from zerotrain.errors import ConfigError
from scenarios import base_config, global_batch, rank_and_world, tiny_gpt


def train_and_export(stage: int, folder: str, name: str) -> list[str]:
    rank, world = rank_and_world()
    micro = 4 // world
    cfg = base_config(4, micro, zero_optimization={"stage": stage, "stage3_param_persistence_threshold": 0})
    engine, *_ = zerotrain.initialize(model=tiny_gpt(), config=cfg)
    for step in range(2):
        mine = global_batch(step, 4)[rank * micro : (rank + 1) * micro]
        engine.backward(engine(mine, labels=mine))
        engine.step()
    engine.save_16bit_model(folder, name)
    sharded = [n for n, p in engine.module.named_parameters() if p.untyped_storage().nbytes() == 0]
    engine.destroy()
    return sharded


@pytest.mark.parametrize("name", ["pytorch_model.bin", "model.safetensors"])
def test_stage3_writes_whole_weights_equal_to_one_process(world2, tmp_path, name):
    sharded = world2.run(train_and_export, 3, str(tmp_path / "z3"), name)
    assert all(sharded), "stage 3 should hold the parameters as shards between steps"
    train_and_export(0, str(tmp_path / "one"), name)
    read = load_safetensors if name.endswith(".safetensors") else torch.load
    got, want = read(tmp_path / "z3" / name), read(tmp_path / "one" / name)
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].shape == want[k].shape, k
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=1e-5, msg=k)


def save_under_rank_tags(folder: str) -> str:
    rank, _ = rank_and_world()
    engine, *_ = zerotrain.initialize(model=tiny_gpt(), config=base_config(2, 1))
    try:
        engine.save_checkpoint(folder, tag=f"tag-{rank}")
    except ConfigError as err:
        return str(err)
    finally:
        engine.destroy()
    return "saved"


def test_save_checkpoint_refuses_tags_that_differ_between_ranks(world2, tmp_path):
    said = world2.run(save_under_rank_tags, str(tmp_path))
    assert said == ["save_checkpoint: the ranks were given different tags (rank 0: 'tag-0', rank 1: 'tag-1'); "
                    "pass the same tag on every rank"] * 2
    assert not any(tmp_path.iterdir()), "nothing is written"


def save_under_rank_folders(folder: str) -> dict:
    """HelloDeepSpeed's train_bert_ds.py names its folder from each rank's clock and a random
    id: each rank saves a stage-2 checkpoint (an optimizer file per rank) under its own name,
    then a fresh engine on every rank loads rank 0's folder."""
    import logging

    rank, _ = rank_and_world()
    cfg = base_config(2, 1, zero_optimization={"stage": 2})
    engine, *_ = zerotrain.initialize(model=tiny_gpt(), config=cfg)
    mine = global_batch(0, 2)[rank : rank + 1]
    engine.backward(engine(mine, labels=mine))
    engine.step()
    said = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage().replace(folder, "F"))
    logging.getLogger("zerotrain").addHandler(handler)
    try:
        engine.save_checkpoint(f"{folder}/run-{rank}", tag="t")
    finally:
        logging.getLogger("zerotrain").removeHandler(handler)
    saved = engine.optimizer.state_dict()["state"]
    engine.destroy()
    again, *_ = zerotrain.initialize(model=tiny_gpt(seed=1), config=cfg)
    again.load_checkpoint(f"{folder}/run-0", tag="t")
    loaded = again.optimizer.state_dict()["state"]
    same = bool(loaded) and all(torch.equal(saved[i][k], loaded[i][k]) for i in saved for k in saved[i])
    again.destroy()
    return {"said": [s for s in said if s.startswith("save_checkpoint")], "same_state": same}


def test_ranks_given_different_folders_save_one_checkpoint_into_rank_0s(world2, tmp_path):
    got = world2.run(save_under_rank_folders, str(tmp_path))
    line = ("save_checkpoint: rank 1 was given the folder 'F/run-1', rank 0 the folder 'F/run-0'; every rank saves "
            "into rank 0's, so the checkpoint is whole in one folder (pass the same save_dir on every rank to "
            "silence this)")
    assert got == [{"said": [line], "same_state": True}] * 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run-0"]
    files = {p.name for p in (tmp_path / "run-0" / "t").iterdir()}
    assert {"model_states.pt", "optim_rank0.pt", "optim_rank1.pt", "rng_rank0.pt", "rng_rank1.pt"} <= files
