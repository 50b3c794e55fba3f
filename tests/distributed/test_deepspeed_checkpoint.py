"""A checkpoint DeepSpeed 0.19.8 wrote (tests/fixtures/deepspeed_zero2_bf16_2ranks: ZeRO 2, bf16,
2 ranks) resumes in zerotrain, read without DeepSpeed, and continues as DeepSpeed's own resume."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "deepspeed_zero2_bf16_2ranks"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())


def resume(folder: str, stage: int, **model) -> dict:
    """On every rank: zerotrain at `stage` loads the folder and trains DeepSpeed's next steps."""
    import zerotrain
    from scenarios import rank_and_world
    from zerotrain.models import GPT, GPTConfig

    rank, world = rank_and_world()
    spec = dict(EXPECTED["model"], **model)
    torch.manual_seed(spec.pop("seed") + 1)  # other initial weights: the checkpoint must replace them
    model = GPT(GPTConfig(**spec))
    config = dict(EXPECTED["config"], train_micro_batch_size_per_gpu=4 // world, zero_optimization={"stage": stage})
    engine, *_ = zerotrain.initialize(model=model, config=config)
    path, client = engine.load_checkpoint(folder)
    losses, start = [], engine.global_steps
    for step in range(start, start + len(EXPECTED["next_losses_resumed"])):
        g = torch.Generator().manual_seed(1000 + step)
        x = torch.randint(0, spec["vocab_size"], (4, spec["n_positions"]), generator=g)
        x = x[rank * 4 // world : (rank + 1) * 4 // world]
        loss = engine(x, labels=x)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    engine.destroy()
    return {"start": start, "losses": losses, "client": client, "lr": engine.get_lr()[0]}


def relative(ranks: list[dict]) -> float:
    mean = [sum(step) / len(step) for step in zip(*(r["losses"] for r in ranks))]
    return max(abs(a - b) / abs(b) for a, b in zip(mean, EXPECTED["next_losses_resumed"]))


@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_zero2_checkpoint_continues_as_deepspeed_does(world2, stage):
    ranks = world2.run(resume, str(FIXTURE), stage)
    assert [r["start"] for r in ranks] == [EXPECTED["k"]] * 2
    assert ranks[0]["client"] == {"run": "deepspeed_checkpoints.py", "k": EXPECTED["k"]}
    assert relative(ranks) <= 1e-5


def _copy(tmp_path: Path) -> Path:
    folder = tmp_path / "ds"
    shutil.copytree(FIXTURE, folder)
    return folder


def test_wrong_deepspeed_input_is_one_line(tmp_path):
    from zerotrain.checkpoint.deepspeed import load_ds_file

    folder = _copy(tmp_path)
    step = folder / "global_step3"
    (step / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt").rename(tmp_path / "rank1.pt")
    with pytest.raises(Exception, match=r"optimizer file of data-parallel rank 1 is missing \(2 ranks wrote"):
        resume(str(folder), 2)
    (tmp_path / "rank1.pt").rename(step / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt")

    with pytest.raises(Exception, match=r"a DeepSpeed checkpoint of another model: blocks.0.fc.weight \[64, 16\] "
                                        r"there, \[128, 32\] here"):
        resume(str(folder), 2, n_embd=32)

    states = load_ds_file(step / "mp_rank_00_model_states.pt")  # memory-mapped: replace the file, never rewrite it

    def rewrite(obj):
        torch.save(obj, tmp_path / "new.pt")
        (tmp_path / "new.pt").replace(step / "mp_rank_00_model_states.pt")

    rewrite(dict(states, ds_version="0.9.2"))
    with pytest.raises(Exception, match=r"written by DeepSpeed 0.9.2; zerotrain reads the checkpoint format of "
                                        r"DeepSpeed 0.19.x"):
        resume(str(folder), 2)

    class Planted:  # a pickle that would run code on load
        def __reduce__(self):
            return (shutil.rmtree, (str(tmp_path / "victim"),))

    (tmp_path / "victim").mkdir()
    rewrite(dict(states, planted=Planted()))
    with pytest.raises(Exception, match=r"refused to unpickle shutil.rmtree"):
        resume(str(folder), 2)
    assert (tmp_path / "victim").is_dir()
