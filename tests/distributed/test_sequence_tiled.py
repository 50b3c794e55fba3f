"""ALST's tiled pieces through sequence parallelism: zerotrain's GPT (GPTConfig mlp_tiles,
loss_tiles; ZeRO 0 and 3) and an HF LLaMA (tile_model, through DeepSpeed's names, whose
loader adapter hands the engine shift_labels) train the same at S = 2 on a real
gloo world with the feed-forward over 3 tiles and the loss over 2 as without tiles: per-step
losses and gradient norms within 1e-6, final weights within 1e-5. One process
(S = 1) alike. The weights' looser bound: AdamW moves an element whose gradient is zero but
for rounding by up to a learning-rate step (measured: 2 elements of the GPT's 512 position
embeddings at 3.7e-6 of the largest, the rest within 9e-7). sp_scenarios.py holds the runs."""

from __future__ import annotations

import pytest
import torch

import sp_scenarios as ss

STEPS, TILES = 3, (3, 2)


def _same(tiled: dict, plain: dict) -> None:
    assert tiled["losses"] == pytest.approx(plain["losses"], rel=1e-6)
    assert tiled["norms"] == pytest.approx(plain["norms"], rel=1e-6)
    for k, v in plain["params"].items():
        assert torch.allclose(tiled["params"][k], v, rtol=1e-5, atol=1e-5 * v.abs().max().item()), k


def two_rank_cases() -> dict:
    runs = {}
    for name, stage, hf, alst in (("gpt", 0, None, 0), ("gpt_stage3", 3, None, 0), ("llama_alst", 0, (2, "sdpa"), 2)):
        cfg = ss.config(2, 1, stage, sequence=0 if alst else 2)
        runs[name] = [ss.train(cfg, STEPS, hf=hf, alst=alst, tiles=t) for t in ((1, 1), TILES)]
    return runs


def test_tiling_changes_nothing_at_s1_and_s2(world2):
    for hf in (None, (2, "sdpa")):
        _same(*[ss.train(ss.config(2, 1, 0), STEPS, hf=hf, tiles=t) for t in (TILES, (1, 1))])
    ranks = world2.run(two_rank_cases, timeout=300)
    for r in ranks:
        for name, (plain, tiled) in r.items():
            assert plain["losses"] == ranks[0][name][0]["losses"]
            _same(tiled, plain)
