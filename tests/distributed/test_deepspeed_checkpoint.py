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


# ---- a DeepSpeed pipeline folder (tests/fixtures/deepspeed_pipe2_zero1: 2 stages, ZeRO 1) ---------
PIPE = FIXTURE.parent / "deepspeed_pipe2_zero1"
PIPE_EXPECTED = json.loads((PIPE / "expected.json").read_text())
PIPE0 = FIXTURE.parent / "deepspeed_pipe2_zero0"  # the same run at ZeRO 0
PIPE0_EXPECTED = json.loads((PIPE0 / "expected.json").read_text())
SIZES = {"vocab": 32, "seq": 8, "embd": 16, "layers": 2}  # the fixture's model


def resume_pipeline(folder: str, stages: int, **sizes) -> dict:
    """zerotrain loads the folder into a PipelineModule of `stages` stages (0: a plain model of
    the same layers, pipe_scenarios.Reference) and trains DeepSpeed's next steps."""
    import zerotrain
    from pipe_scenarios import Reference, gpt_loss, layer_specs
    from zerotrain.pipe import PipelineModule

    sizes = dict(SIZES, **sizes)
    expected = json.loads((Path(folder) / "expected.json").read_text())
    torch.manual_seed(1)  # other initial weights than DeepSpeed's: the checkpoint must replace them
    if stages:
        model = PipelineModule(layer_specs(**sizes), num_stages=stages, loss_fn=gpt_loss,
                               partition_method="type:PreLNBlock")
    else:
        model = Reference(**sizes)
    engine, *_ = zerotrain.initialize(model=model, config=expected["config"])
    path, client = engine.load_checkpoint(folder)
    losses, start = [], engine.global_steps
    for step in range(start, start + len(expected["next_losses_resumed"])):
        g = torch.Generator().manual_seed(1000 + step)
        rows = torch.randint(0, sizes["vocab"], (4, sizes["seq"]), generator=g)
        pairs = [(rows[i : i + 1], rows[i : i + 1]) for i in range(4)]
        if stages:
            losses.append(engine.train_batch(iter(pairs)).item())
            continue
        total = 0.0
        for x, y in pairs:
            loss = engine(x, labels=y)
            engine.backward(loss)
            engine.step()
            total += loss.item() / 4
        losses.append(total)
    engine.destroy()
    return {"start": start, "losses": losses, "client": client}


def pipe_relative(losses: list[float], expected: dict = PIPE_EXPECTED) -> float:
    want = expected["next_losses_resumed"]
    return max(abs(a - b) / abs(b) for a, b in zip(losses, want))


def test_deepspeed_pipeline_checkpoint_continues_on_any_stage_count_and_as_a_plain_model(world2):
    """DeepSpeed's layer_* files and per-stage optimizer files: on 2 stages as DeepSpeed had, on
    1 stage, and into a plain model of the same layers (paired in layer order)."""
    two = world2.run(resume_pipeline, str(PIPE), 2)
    assert [r["start"] for r in two] == [PIPE_EXPECTED["k"]] * 2
    assert two[0]["client"] == {"run": "deepspeed_checkpoints.py", "k": PIPE_EXPECTED["k"]}
    assert pipe_relative(two[0]["losses"]) <= 1e-5
    for stages in (1, 0):
        assert pipe_relative(resume_pipeline(str(PIPE), stages)["losses"]) <= 1e-5


def test_deepspeed_zero0_pipeline_checkpoint_continues_on_2_stages_and_as_a_plain_model(world2):
    """At ZeRO 0 DeepSpeed names no parameters: each stage's torch optimizer state, by index,
    is placed by the layer files' shapes (checkpoint/deepspeed_pipe.zero0_names)."""
    two = world2.run(resume_pipeline, str(PIPE0), 2)
    assert [r["start"] for r in two] == [PIPE0_EXPECTED["k"]] * 2
    assert two[0]["client"] == {"run": "deepspeed_checkpoints.py", "k": PIPE0_EXPECTED["k"]}
    assert pipe_relative(two[0]["losses"], PIPE0_EXPECTED) <= 1e-5
    assert pipe_relative(resume_pipeline(str(PIPE0), 0)["losses"], PIPE0_EXPECTED) <= 1e-5


def test_wrong_deepspeed_pipeline_input_is_one_line(tmp_path):
    folder = tmp_path / "pipe"
    shutil.copytree(PIPE, folder)
    step = folder / "global_step3"
    with pytest.raises(Exception, match=r"pipeline checkpoint of 15 parameters, this model has 21; it is of another "
                                        r"model"):
        resume_pipeline(str(folder), 0, layers=3)
    with pytest.raises(Exception, match=r"checkpoint of another model: 1.pos.weight \[8, 16\] there, \[8, 24\] here"):
        resume_pipeline(str(folder), 1, embd=24)
    (step / "layer_03-model_states.pt").rename(tmp_path / "layer_03.pt")
    with pytest.raises(Exception, match=r"no layer_\*-model_states.pt file holds 3.fc.weight \(6 parameter"):
        resume_pipeline(str(folder), 1)
    (tmp_path / "layer_03.pt").rename(step / "layer_03-model_states.pt")
    (step / "mp_rank_01_model_states.pt").unlink()
    with pytest.raises(Exception, match=r"mp_rank_01_model_states.pt is missing \(2 pipeline stages wrote"):
        resume_pipeline(str(folder), 1)
    shutil.copytree(PIPE0, tmp_path / "zero0")
    (tmp_path / "zero0" / "global_step3" / "layer_03-model_states.pt").unlink()
    with pytest.raises(Exception, match=r"stage 1's optimizer state of a DeepSpeed ZeRO 0 pipeline checkpoint does not "
                                        r"fit its layer files \(parameter 2 of shape \[48, 16\]\)"):
        resume_pipeline(str(tmp_path / "zero0"), 1)


# ---- a DeepSpeed AutoTP folder (tests/fixtures/deepspeed_autotp2_zero1: 2 tensor ranks, ZeRO 1) ----
AUTOTP = FIXTURE.parent / "deepspeed_autotp2_zero1"
AUTOTP_EXPECTED = json.loads((AUTOTP / "expected.json").read_text())


def resume_autotp(folder: str, tensor: int, **sizes) -> dict:
    """zerotrain loads DeepSpeed's AutoTP folder into the same HF LLaMA, split over `tensor`
    ranks (1: a plain model), and trains DeepSpeed's next steps on the same 2 rows a step."""
    from transformers import LlamaConfig, LlamaForCausalLM

    import zerotrain
    from scenarios import rank_and_world

    rank, world = rank_and_world()
    dp = world // tensor
    sizes = dict(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                 num_key_value_heads=2, max_position_embeddings=8) | sizes
    torch.manual_seed(1)  # other initial weights than DeepSpeed's: the checkpoint must replace them
    config = dict(AUTOTP_EXPECTED["config"], train_batch_size=2, train_micro_batch_size_per_gpu=2 // dp,
                  tensor_parallel={"autotp_size": tensor})
    engine, *_ = zerotrain.initialize(model=LlamaForCausalLM(LlamaConfig(**sizes)), config=config)
    path, client = engine.load_checkpoint(folder)
    losses, start, d = [], engine.global_steps, rank // tensor
    for step in range(start, start + len(AUTOTP_EXPECTED["next_losses_resumed"])):
        g = torch.Generator().manual_seed(1000 + step)
        x = torch.randint(0, 32, (4, 8), generator=g)[:2][d * 2 // dp : (d + 1) * 2 // dp]
        loss = engine(x, labels=x).loss
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    engine.destroy()
    return {"start": start, "losses": losses}


def autotp_relative(losses: list[float]) -> float:
    want = AUTOTP_EXPECTED["next_losses_resumed"]
    return max(abs(a - b) / abs(b) for a, b in zip(losses, want))


def test_deepspeed_autotp_checkpoint_continues_on_tensor_ranks_and_as_a_plain_model(world2):
    """DeepSpeed's per-tensor-rank pieces, cut as its record says (rows, or columns for o_proj and
    down_proj, whole norms and embedding): on 2 tensor ranks as DeepSpeed had, and whole in 1 process."""
    two = world2.run(resume_autotp, str(AUTOTP), 2)
    assert [r["start"] for r in two] == [AUTOTP_EXPECTED["k"]] * 2
    assert autotp_relative(two[0]["losses"]) <= 1e-5
    assert autotp_relative(resume_autotp(str(AUTOTP), 1)["losses"]) <= 1e-5


def test_wrong_deepspeed_autotp_input_is_one_line(tmp_path):
    folder = tmp_path / "autotp"
    shutil.copytree(AUTOTP, folder)
    with pytest.raises(Exception, match=r"checkpoint of another model: lm_head.weight \[32, 16\] there, \[32, 24\] "
                                        r"here"):
        resume_autotp(str(folder), 1, hidden_size=24)
    (folder / "global_step2" / "mp_rank_01_model_states.pt").unlink()
    with pytest.raises(Exception, match=r"mp_rank_01_model_states.pt is missing \(2 tensor ranks wrote"):
        resume_autotp(str(folder), 1)
