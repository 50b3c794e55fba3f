"""`zerotrain train --sequence_parallel_size S` on real gloo worlds against the same job in one
process: a 4-head GPT built from a config, ZeRO 2, blocks of 31 tokens (odd, so every full
sequence is padded at S = 2 and 4), a seqlen curriculum whose lengths are not multiples of 2.

At S = 2 the curriculum's lengths 11, 18, 24, 31 train as 10, 18, 24, 31 (below the maximum,
rounded down to a multiple of S); the one-process reference trains those lengths by a
fixed_discrete schedule, so losses, gradient norms, token counts and the eval loss must agree
within 1e-5. Its checkpoint after step 2 resumes in one process (S = 1) and on 4 ranks (S = 4):
steps 3 and 4 run at 24 and 31 tokens, which no size rounds, so their losses must equal the
S = 2 run's (the ZeRO partitions change from 2 ranks to 1 and 4; the weights are whole on every
sequence rank).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "unit" / "trainer"))
from trainer_helpers import options, train_logged  # noqa: E402

GPT = {"zerotrain_model": "gpt", "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 64}
LINEAR = {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": 5, "max_difficulty": 31,
          "schedule_type": "fixed_linear", "schedule_config": {"total_curriculum_step": 4, "difficulty_step": 1}}
ROUNDED = {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": 10, "max_difficulty": 31,
           "schedule_type": "fixed_discrete",
           "schedule_config": {"difficulty": [10, 18, 24, 31], "max_step": [1, 2, 3]}}


def _job(tmp: Path, out: str, curriculum: dict, **extra) -> dict:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "gpt.json").write_text(json.dumps(GPT))
    ds = {"zero_optimization": {"stage": 2}, "curriculum_learning": curriculum, "gradient_clipping": 1.0}
    values = dict(model_config=str(tmp / "gpt.json"), output_dir=str(tmp / out), block_size=31, max_steps=4,
                  per_device_train_batch_size=2, gradient_accumulation_steps=2, deepspeed=ds, report_to="none")
    return options(tmp, **{**values, **extra})


def _train(values: dict) -> dict:
    from zerotrain.trainer.report.banner import banner

    logged = train_logged(values)
    t = logged.pop("trainer")  # a trainer does not pickle back from a rank
    return {**logged, "banner": banner(t.engine, t.model, t.task, t.total_steps, 1)}


def sequence_job(tmp: str) -> dict:
    """On each rank: S = 2 for 4 steps, a checkpoint every 2."""
    return _train(_job(Path(tmp), "run", LINEAR, sequence_parallel_size=2, save_strategy="steps", save_steps=2))


def resumed_job(tmp: str, size: int) -> dict:
    """The S = 2 run's checkpoint-2, continued at sequence_parallel_size `size` (the config's key)."""
    tmp = Path(tmp)
    ds = {"zero_optimization": {"stage": 2}, "curriculum_learning": LINEAR, "gradient_clipping": 1.0,
          "sequence_parallel_size": size}
    return _train(_job(tmp, f"resumed{size}", LINEAR, deepspeed=ds,
                       resume_from_checkpoint=str(tmp / "run" / "checkpoint-2")))


def _close(got: list, want: list) -> None:
    assert got == pytest.approx(want, rel=1e-5)


def test_trainer_sequence_parallel_matches_one_process_and_resumes_at_one_and_four(world2, world4, tmp_path):
    ranks = world2.run(sequence_job, str(tmp_path), timeout=300)
    one = _train(_job(tmp_path / "one", "run", ROUNDED))
    assert one["seqlens"] == [10, 18, 24, 31]
    for r in ranks:
        assert r["seqlens"] == one["seqlens"]  # 11 rounded down to 10; the maximum stays 31
        _close(r["losses"], one["losses"])
        _close(r["norms"], one["norms"])
        assert r["results"]["tokens"] == one["results"]["tokens"]  # each token once, though 2 ranks read it
        _close([r["results"]["eval_loss"]], [one["results"]["eval_loss"]])
    first = ranks[0]["banner"]
    assert "sequence parallel 2 (Ulysses" in first and "1 data-parallel rank = 4 per step" in first
    assert "seqlen curriculum: lengths below max_difficulty 31 rounded down to a multiple of sequence parallel 2" \
        in first
    assert "seqlen curriculum" not in one["banner"] and "sequence parallel" not in one["banner"]
    resumed = resumed_job(str(tmp_path), 1)
    _close(resumed["losses"], ranks[0]["losses"][2:])
    _close(resumed["norms"], ranks[0]["norms"][2:])
    assert resumed["results"]["tokens"] == ranks[0]["results"]["tokens"]
    saved = ranks[0]
    for r in world4.run(resumed_job, str(tmp_path), 4, timeout=300):
        assert "sequence parallel 4 (Ulysses" in r["banner"]
        _close(r["losses"], saved["losses"][2:])
        _close(r["norms"], saved["norms"][2:])
        assert r["results"]["tokens"] == saved["results"]["tokens"]
