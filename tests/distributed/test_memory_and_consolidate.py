"""memory_breakdown() against estimate_memory on 2 and 4 real ranks, and consolidation of
checkpoints of every stage back into the trained module's full state dict.

The tiny GPT ties its input and output embeddings, so consolidation also has to write one
parameter under two names."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file as load_safetensors

import zerotrain
from scenarios import base_config, global_batch, rank_and_world, tiny_gpt, train
from zerotrain.checkpoint.consolidate import consolidate_checkpoint
from zerotrain.checkpoint.safetensors_out import save_safetensors
from zerotrain.cli import main
from zerotrain.errors import CheckpointError, ConfigError
from zerotrain.zero.estimate import CATEGORIES, PLACES

STAGES = [0, 1, 2, 3]
PRECISIONS = ["fp32", "bf16"]
# categories each stage divides by the world size (the rest is whole on every rank)
SHARDED = {0: set(), 1: {"master_params", "optimizer_states"},
           2: {"grads", "master_params", "optimizer_states"}, 3: set(CATEGORIES)}
TIED = "lm_head.weight"


def precision_block(precision: str) -> dict:
    return {"bf16": {"enabled": True}} if precision == "bf16" else {}


def breakdowns() -> dict:
    """One optimizer step per stage and precision, then this rank's memory_breakdown()."""
    rank, world = rank_and_world()
    out = {}
    for stage in STAGES:
        for precision in PRECISIONS:
            cfg = base_config(2 * world, 2, zero_optimization={"stage": stage}, **precision_block(precision))
            engine = zerotrain.initialize(model=tiny_gpt(), config=cfg)[0]
            x = global_batch(0, 2 * world)[2 * rank : 2 * rank + 2]
            engine.backward(engine(x, labels=x))
            engine.step()
            out[(stage, precision)] = engine.memory_breakdown()
            del engine
    return out


@pytest.fixture(scope="module")
def measured(world2, world4):
    """{world_size: per-rank breakdowns}; one pool call per world size."""
    return {2: world2.run(breakdowns), 4: world4.run(breakdowns, timeout=400)}


NUM_PARAMS = sum(p.numel() for p in tiny_gpt().parameters())


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_breakdown_matches_estimate(measured, world_size, stage, precision):
    est = zerotrain.estimate_memory(NUM_PARAMS, world_size, stage, dtype=precision, optimizer="adamw")
    ranks = [r[(stage, precision)] for r in measured[world_size]]
    for rank, got in enumerate(ranks):
        assert got == ranks[0], f"rank {rank} holds different bytes than rank 0"
        for c in CATEGORIES:
            for p in PLACES:
                e, g = est[c][p], got[c][p]
                assert abs(g - e) <= 0.05 * max(e, 1), f"{c}/{p}: measured {g}, estimated {e}"
    fp32_master = precision == "bf16"
    assert (got["master_params"]["device"] > 0) == fp32_master


PAPER = {0: lambda P, N: 16 * P, 1: lambda P, N: 4 * P + 12 * P / N, 2: lambda P, N: 2 * P + 14 * P / N,
         3: lambda P, N: 16 * P / N}


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("stage", STAGES)
def test_bf16_model_states_at_the_zero_paper_numbers(measured, world_size, stage):
    """bf16 + Adam, one micro-step per step: no persistent fp32 gradient copy at any stage."""
    got = measured[world_size][0][(stage, "bf16")]
    total = sum(by_place["device"] for by_place in got.values())
    want = PAPER[stage](NUM_PARAMS, world_size)
    assert abs(total - want) <= 0.05 * want, f"stage {stage}, {world_size} ranks: {total} bytes, paper {want:.0f}"


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_sharded_categories_halve_from_two_to_four_ranks(measured, stage, precision):
    two, four = measured[2][0][(stage, precision)], measured[4][0][(stage, precision)]
    for c in CATEGORIES:
        a, b = two[c]["device"], four[c]["device"]
        if a == 0:
            assert b == 0, c
        elif c in SHARDED[stage]:
            assert b == pytest.approx(a / 2, rel=0.05), f"{c}: {a} on 2 ranks, {b} on 4"
        else:
            assert b == pytest.approx(a, rel=0.01), f"{c} should be whole on every rank: {a} vs {b}"


def offload_breakdowns(nvme_path: str) -> dict:
    """As `breakdowns`, with the optimizer (and at stage 3 the parameters) offloaded."""
    rank, world = rank_and_world()
    out = {}
    for stage in (1, 2, 3):
        for precision in PRECISIONS:
            for device in ("cpu", "nvme"):
                zero = {"stage": stage, "offload_optimizer": {"device": device, "nvme_path": nvme_path}}
                if stage == 3:
                    zero["offload_param"] = {"device": device, "nvme_path": nvme_path}
                cfg = base_config(2 * world, 2, zero_optimization=zero, **precision_block(precision))
                engine = zerotrain.initialize(model=tiny_gpt(), config=cfg)[0]
                x = global_batch(0, 2 * world)[2 * rank : 2 * rank + 2]
                engine.backward(engine(x, labels=x))
                engine.step()
                out[(stage, precision, device)] = engine.memory_breakdown()
                del engine
    return out


def test_offloaded_breakdown_matches_estimate(world2, tmp_path):
    """On this CPU-only machine the host is also the compute device (compute_on_host)."""
    ranks = world2.run(offload_breakdowns, str(tmp_path))
    for (stage, precision, device), got in ranks[0].items():
        param = device if stage == 3 else "none"
        est = zerotrain.estimate_memory(NUM_PARAMS, 2, stage, dtype=precision, offload_optimizer=device,
                                        offload_param=param, compute_on_host=True)
        for c in CATEGORIES:
            for p in PLACES:
                e, g = est[c][p], got[c][p]
                assert abs(g - e) <= 0.05 * max(e, 1), f"stage {stage} {precision} {device}: {c}/{p} {g} vs {e}"
        if device == "nvme":  # ZeRO-Infinity: the masters go to the files with their optimizer state
            assert got["optimizer_states"]["nvme"] > 0 and got["optimizer_states"]["host"] == 0
            assert got["master_params"]["nvme"] > 0 and got["master_params"]["host"] == 0


# ---- consolidation ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def trained(world2, tmp_path_factory):
    """Lazily trained 2-rank runs with a checkpoint after the last step, by (stage, precision)."""
    cache = {}

    def get(stage: int, precision: str):
        if (stage, precision) not in cache:
            folder = tmp_path_factory.mktemp(f"ckpt_s{stage}_{precision}")
            cfg = base_config(4, 2, zero_optimization={"stage": stage}, **precision_block(precision))
            ranks = world2.run(train, cfg, 3, 4, save=(str(folder), 3))
            cache[(stage, precision)] = folder, ranks[0]["params"]
        return cache[(stage, precision)]

    return get


def _layout_records_ties(folder) -> bool:
    from zerotrain.checkpoint.store import load_file, resolve_checkpoint

    return bool(load_file(resolve_checkpoint(folder), "model_states.pt")["layout"].get("aliases"))


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_consolidate_equals_trained_module(trained, stage, precision):
    folder, module = trained(stage, precision)  # module: engine.module_state_dict(), as fp32
    full = consolidate_checkpoint(folder)
    assert all(t.dtype == torch.float32 for t in full.values())
    for name, value in full.items():
        assert value.shape == module[name].shape, name
        if precision == "fp32":
            assert torch.equal(value, module[name]), name
        else:  # the fp32 master; the module holds its bf16 cast
            assert torch.equal(value.to(torch.bfloat16).float(), module[name]), name
    if precision == "bf16":  # the masters were used, not the rounded module weights
        assert any(not torch.equal(full[k], module[k]) for k in full)
    if TIED in full:  # one parameter, one tensor
        assert full[TIED] is full["wte.weight"]
    assert set(full) == set(module)  # every name, tied aliases included (layout["aliases"])
    assert _layout_records_ties(folder)


def test_consolidate_errors(trained, tmp_path):
    folder, _ = trained(2, "fp32")
    with pytest.raises(CheckpointError, match="does not exist"):
        consolidate_checkpoint(tmp_path / "nowhere")
    with pytest.raises(CheckpointError, match="no .*latest|latest.*does not exist"):
        consolidate_checkpoint(tmp_path)
    with pytest.raises(CheckpointError):
        consolidate_checkpoint(folder, tag="global_step99")
    # a rank file gone, whether or not the manifest still lists it
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    tag = (broken / "latest").read_text().strip()
    (broken / tag / "optim_rank1.pt").unlink()
    with pytest.raises(CheckpointError, match="optim_rank1.pt: missing"):
        consolidate_checkpoint(broken)
    manifest = json.loads((broken / tag / "manifest.json").read_text())
    del manifest["files"]["optim_rank1.pt"]
    (broken / tag / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="optim_rank1.pt: missing"):
        consolidate_checkpoint(broken / tag)


def test_consolidate_cli_end_to_end(trained, tmp_path, capsys):
    folder, module = trained(3, "bf16")
    out = tmp_path / "export"
    cmd = [sys.executable, "-m", "zerotrain.cli", "consolidate", str(folder), str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)  # the one real process
    assert done.returncode == 0, done.stderr
    assert "model.safetensors" in done.stdout
    written = load_safetensors(out / "model.safetensors")
    expected = consolidate_checkpoint(folder)
    assert written.keys() == expected.keys()
    assert all(torch.equal(written[k], expected[k]) for k in expected)
    assert not [p.name for p in out.iterdir() if p.name != "model.safetensors"]  # no temp left behind
    # the same command in-process: refusals are one line and exit status 2
    assert main(["consolidate", str(folder), str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--overwrite" in err[0]
    assert main(["consolidate", str(folder), str(out), "--overwrite"]) == 0
    assert main(["consolidate", str(tmp_path / "nothing"), str(tmp_path / "x.safetensors")]) == 2
    assert capsys.readouterr().err.startswith("zerotrain: error:")
    assert not (tmp_path / "x.safetensors").exists()


# ---- one process: buffers, frozen parameters, ties, writing --------------------------------

class WithBuffers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(16, 8)
        self.body = torch.nn.Linear(8, 8)
        self.frozen = torch.nn.Linear(8, 8)
        self.frozen.requires_grad_(False)
        self.head = torch.nn.Linear(8, 16, bias=False)
        self.head.weight = self.emb.weight
        self.register_buffer("scale", torch.full((8,), 0.5))
        self.register_buffer("count", torch.tensor(3))

    def forward(self, x, labels):
        h = self.frozen(torch.tanh(self.body(self.emb(x)))) * self.scale
        return torch.nn.functional.cross_entropy(self.head(h).flatten(0, 1), labels.flatten())


@pytest.mark.parametrize("stage", STAGES)
def test_consolidate_buffers_frozen_and_tied_one_process(tmp_path, stage):
    cfg = base_config(2, 2, zero_optimization={"stage": stage}, bf16={"enabled": True})
    engine = zerotrain.initialize(model=WithBuffers(), config=cfg)[0]
    for step in range(2):
        x = global_batch(step, 2)[:, :4] % 16
        engine.backward(engine(x, labels=x))
        engine.step()
    engine.save_checkpoint(tmp_path)
    module = engine.module_state_dict()
    full = consolidate_checkpoint(tmp_path)
    assert full["count"].dtype == torch.int64 and full["count"].item() == 3
    assert torch.equal(full["scale"], module["scale"].float())
    assert torch.equal(full["frozen.weight"], module["frozen.weight"].float())
    for k in full:
        assert torch.equal(full[k].to(module[k].dtype), module[k]), k
    assert full.keys() == module.keys() and full["head.weight"] is full["emb.weight"]
    target = save_safetensors(full, tmp_path / "w.safetensors")
    back = load_safetensors(target)
    assert back.keys() == full.keys() and all(torch.equal(back[k], full[k]) for k in full)
    with pytest.raises(ConfigError, match="--overwrite"):
        save_safetensors(full, target)
    save_safetensors(full, target, overwrite=True)
