"""Curriculum + progressive layer drop + token budget on 2 real gloo processes against a
1-process reference, for every ZeRO stage zerotrain has (new stages join automatically).

Equal results need every rank to cut to the same length and drop the same blocks at the
same step; per-rank randomness in the masks would make the ranks' gradients disagree with
the reference (and send ZeRO-3 gathers out of step)."""

from __future__ import annotations

import pytest
import torch

import zerotrain
import zerotrain.zero
from asserts import assert_params_close
from megatron_lr import golden_lrs
from scenarios import global_batch, rank_and_world
from zerotrain.models import GPT, GPTConfig
from zerotrain.features.engine_methods import tokens_consumed

SEQ, VOCAB, BATCH = 16, 64, 4
# lengths 8, 8, 8, then 16: 3 x 32 + 5 x 64 tokens = 8 optimizer steps
BUDGET = 3 * BATCH * 8 + 5 * BATCH * 16


def features(stage: int, micro: int, ga: int = 1) -> dict:
    return {
        "train_batch_size": BATCH, "train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": ga,
        "gradient_clipping": 0.0,
        # threshold 0: under stage 3 every block really is gathered before use and released after,
        # so a rank that dropped different blocks would issue different collectives
        "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}},
        "curriculum_learning": {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": 8, "max_difficulty": SEQ,
                                "schedule_type": "fixed_linear",
                                "schedule_config": {"total_curriculum_step": 4, "difficulty_step": 8}},
        "progressive_layer_drop": {"enabled": True, "theta": 0.3, "gamma": 0.3},
        "token_budget": {"train_tokens": BUDGET, "lr_decay_tokens": BUDGET - 64, "warmup_steps": 2,
                         "lr_decay_style": "cosine", "min_lr": 1e-4},
    }


def train_with_features(config: dict) -> dict:
    """Train until the token budget stops it; each rank takes its slice of the global batch."""
    rank, _ = rank_and_world()
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=4, n_head=2, bias=False))
    block_runs = [0]
    for block in model.blocks:
        block.register_forward_hook(lambda m, a, o: block_runs.__setitem__(0, block_runs[0] + 1))
    engine, *_ = zerotrain.initialize(model=model, config=config)
    micro, ga = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    thetas, tokens, lrs, forwards = [], [], [], 0
    while not engine.should_stop():
        mine = global_batch(engine.global_steps, BATCH)[rank * micro * ga : (rank + 1) * micro * ga]
        for m in range(ga):
            x = mine[m * micro : (m + 1) * micro]
            engine.backward(engine(x, labels=x))
            engine.step()
            forwards += 1
        thetas.append(engine.get_pld_theta())
        tokens.append(tokens_consumed(engine))
        lrs.append(engine.get_lr()[0])
    params = {k: v.detach().float().clone() for k, v in engine.module_state_dict().items()}
    return {"params": params, "thetas": thetas, "tokens": tokens, "lrs": lrs,
            "block_runs": block_runs[0], "forwards": forwards}


@pytest.mark.parametrize("stage", sorted(zerotrain.zero.STRATEGIES))
@pytest.mark.parametrize("micro,ga", [(2, 1), (1, 2)], ids=["plain", "accumulation"])
def test_two_ranks_match_one_process(world2, stage, micro, ga):
    ranks = world2.run(train_with_features, features(stage, micro, ga))
    reference = train_with_features(features(stage, BATCH))
    assert reference["tokens"] == [32, 64, 96, 160, 224, 288, 352, 416]  # cut lengths, stop at the budget
    golden = golden_lrs([32, 32, 32, 64, 64, 64, 64, 64], max_lr=3e-3, min_lr=1e-4, decay_tokens=BUDGET - 64,
                        style="cosine", warmup_steps=2)
    assert reference["lrs"] == pytest.approx(golden[1:], rel=1e-12, abs=0)  # Megatron-DeepSpeed's, every step
    assert reference["block_runs"] < 4 * len(reference["tokens"])  # layers were dropped
    for r in ranks:
        assert r["tokens"] == reference["tokens"]  # summed over both ranks
        assert r["thetas"] == reference["thetas"]
        assert r["lrs"] == pytest.approx(reference["lrs"], rel=1e-12)
        assert r["block_runs"] == reference["block_runs"] * r["forwards"] // len(reference["tokens"])
    assert_params_close(ranks[0]["params"], ranks[1]["params"], rtol=0)
    assert_params_close(ranks[0]["params"], reference["params"])


# ---- the sampling curriculum: each rank its slice of the same batches, resumed alike --------
def curriculum_sampling(folder: str) -> dict:
    """6 micro-batches from the curriculum loader, and the last 3 again after a resume from
    the checkpoint saved after the first 3."""
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
              "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "data_efficiency": curriculum_block(folder)}
    data = [torch.tensor([float(i)]) for i in range(40)]

    def start():
        engine, _, loader, _ = zerotrain.initialize(model=torch.nn.Linear(1, 1), config=config, training_data=data)
        return engine, iter(loader)

    engine, it = start()
    seen = [next(it).view(-1).long().tolist() for _ in range(3)]
    engine.save_checkpoint(f"{folder}/ck")
    seen += [next(it).view(-1).long().tolist() for _ in range(3)]
    engine, it = start()
    engine.load_checkpoint(f"{folder}/ck")
    return {"seen": seen, "resumed": [next(it).view(-1).long().tolist() for _ in range(3)]}


def curriculum_block(folder: str) -> dict:
    return {"enabled": True, "seed": 9, "data_sampling": {"enabled": True, "curriculum_learning": {
        "enabled": True, "data_cluster_path": f"{folder}/clusters", "curriculum_metrics": {"m": {
            "index_to_sample_path": f"{folder}/i2s", "index_to_metric_path": f"{folder}/i2m",
            "difficulty_type": "value", "clustering_type": "schedule_based", "min_difficulty": 2,
            "max_difficulty": 9, "schedule_type": "fixed_linear",
            "schedule_config": {"total_curriculum_step": 4, "difficulty_step": 1}}}}}}


def test_curriculum_sampler_two_ranks_take_slices_and_resume(world2, tmp_path):
    import numpy as np

    from zerotrain.config import load_config
    from zerotrain.data.curriculum_sampler import CurriculumSampler
    from zerotrain.data.indexed import write_indexed

    vals = np.random.default_rng(4).integers(0, 10, 40)
    write_indexed(str(tmp_path / "i2s"), [np.nonzero(vals == v)[0] for v in np.unique(vals)], np.uint8)
    write_indexed(str(tmp_path / "i2m"), [[v] for v in np.unique(vals)], np.uint8)
    ranks = world2.run(curriculum_sampling, str(tmp_path))
    de = load_config({"train_batch_size": 4, "data_efficiency": curriculum_block(str(tmp_path))}).data_efficiency
    one = list(CurriculumSampler(de, 40, 4, 0, 1, 1, write_clusters=False))[:6]  # the same global batch of 4
    assert [ranks[0]["seen"][i] + ranks[1]["seen"][i] for i in range(6)] == one
    assert all(r["resumed"] == r["seen"][3:] for r in ranks)
