"""The trainer's stage-3 load on 2 real ranks: a saved HF or zerotrain model is built under
zero.Init and its files streamed into each rank's chunks; the model then trains at stage 3
as the same weights loaded whole train in one process."""

from __future__ import annotations

import pytest
import torch

import zerotrain
from asserts import assert_params_close
from scenarios import base_config, global_batch, rank_and_world


def _save(kind: str, folder: str) -> None:
    from zerotrain.trainer.model.build import ModelInfo, _build_ours, save_model

    torch.manual_seed(1)
    if kind == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
        LlamaForCausalLM(cfg).save_pretrained(folder)
    else:
        model, info = _build_ours({"zerotrain_model": "gpt", "vocab_size": 96, "n_embd": 32, "n_layer": 2,
                                   "n_head": 2, "n_positions": 32}, "clm", None, None)
        save_model(__import__("pathlib").Path(folder), model, info, model.state_dict())


def train_loaded(folder: str, stage: int, partitioned: bool) -> dict:
    from zerotrain.trainer.model.build import Partition, load_model

    rank, world = rank_and_world()
    model, _ = load_model(folder, "clm", partition=Partition(rank, world) if partitioned else None)
    whole = sum(p.untyped_storage().nbytes() for p in model.parameters() if p.requires_grad)
    micro = 4 // world
    cfg = base_config(4, micro, zero_optimization={"stage": stage, "stage3_param_persistence_threshold": 0})
    engine, *_ = zerotrain.initialize(model=model, config=cfg)
    losses = []
    for step in range(3):
        batch = global_batch(step, 4)[rank * micro:(rank + 1) * micro]
        out = engine(input_ids=batch, labels=batch)
        loss = out.loss if hasattr(out, "loss") else out
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    params = {k: v.detach().float().clone() for k, v in engine.module_state_dict().items()}
    engine.destroy()
    return {"losses": losses, "params": params, "held_before_initialize": whole}


@pytest.mark.parametrize("kind", ["llama", "ours"])
def test_a_saved_model_streams_into_stage3_chunks(world2, tmp_path, kind):
    _save(kind, str(tmp_path / kind))
    streamed = world2.run(train_loaded, str(tmp_path / kind), 3, True)
    whole = world2.run(train_loaded, str(tmp_path / kind), 3, False)  # loaded whole on each rank, then cut
    one = train_loaded(str(tmp_path / kind), 0, False)
    mean = torch.tensor([r["losses"] for r in streamed]).mean(0)  # each rank's loss is its half of the batch
    torch.testing.assert_close(mean, torch.tensor(one["losses"]), rtol=1e-5, atol=0)
    total = sum(p.numel() for p in one["params"].values())
    for s, w in zip(streamed, whole):
        assert s["held_before_initialize"] <= 4 * total // 2 + 4096  # its chunks, never the whole model
        assert w["held_before_initialize"] >= 4 * total * 0.9
        assert s["losses"] == w["losses"]
        assert_params_close(s["params"], w["params"], rtol=0)


def save_streamed(folder: str, out: str) -> dict:
    """Train 2 steps at stage 3, then save the model folder as the trainer does there: one
    parameter gathered whole at a time. Returns the most parameters ever whole during a fetch
    and the gathered state dict to compare the file with."""
    from pathlib import Path

    from zerotrain.trainer.model.build import load_model, save_model_streamed

    rank, world = rank_and_world()
    model, info = load_model(folder, "clm")
    cfg = base_config(4, 4 // world, zero_optimization={"stage": 3, "stage3_param_persistence_threshold": 0})
    engine, *_ = zerotrain.initialize(model=model, config=cfg)
    for step in range(2):
        batch = global_batch(step, 4)[rank * 2:(rank + 1) * 2]
        out_ = engine(input_ids=batch, labels=batch)
        engine.backward(out_.loss if hasattr(out_, "loss") else out_)
        engine.step()
    whole = engine.strategy.gatherer.whole
    most = [0]

    def counted(fetch):
        def run():
            t = fetch()
            most[0] = max(most[0], len(whole) + 1)  # the one just fetched was released already
            return t
        return run

    entries = [(k, shape, dtype, counted(f)) for k, shape, dtype, f in engine.module_state_entries()]
    save_model_streamed(Path(out), model, info, entries, writer=rank == 0)
    state = {k: v.detach().clone() for k, v in engine.module_state_dict().items()}
    engine.destroy()
    return {"most_whole": most[0], "state": state}


@pytest.mark.parametrize("kind", ["llama", "ours"])
def test_stage3_saves_the_model_one_parameter_at_a_time(world2, tmp_path, kind):
    from zerotrain.trainer.model.build import load_model

    _save(kind, str(tmp_path / kind))
    results = world2.run(save_streamed, str(tmp_path / kind), str(tmp_path / "saved"))
    assert all(r["most_whole"] == 1 for r in results)
    if kind == "llama":  # plain transformers reads the folder
        from transformers import AutoModelForCausalLM

        loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "saved")).state_dict()
    else:
        loaded = load_model(str(tmp_path / "saved"), "clm")[0].state_dict()
    trained = results[0]["state"]
    assert loaded.keys() == trained.keys()
    for name, value in trained.items():
        assert torch.equal(loaded[name], value), name
