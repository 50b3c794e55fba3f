"""A DeepSpeed-style script of our own, its import line changed, started on 2 ranks by
`zerotrain launch` with the `deepspeed` launcher's options: every helper it calls works, and the
launcher passes --local_rank as DeepSpeed's does."""

import json
import shutil
from pathlib import Path

from e2e_helpers import ok, zerotrain

HERE = Path(__file__).parent
CONFIG = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2},
          "activation_checkpointing": {"synchronize_checkpoint_boundary": True}}


def test_a_deepspeed_script_runs_on_two_ranks_through_launch(tmp_path):
    shutil.copy(HERE / "ds_style_script.py", tmp_path / "train.py")
    (tmp_path / "ds.json").write_text(json.dumps(CONFIG))
    out = tmp_path / "ckpt"
    proc = ok(zerotrain(tmp_path, "launch", "--num_gpus", "2", "train.py", "--deepspeed", "--deepspeed_config",
                        "ds.json", "--out", str(out), "--steps", "2"))
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    for r, seen in enumerate(ranks):
        assert seen["rank"] == r and seen["world"] == 2 and seen["local_rank_arg"] == seen["local_rank"] == r
        assert seen["sum"] == 3.0 and seen["gathered"] == [0.0, 1.0] and seen["token"] == 42.0
        assert seen["global_steps"] == 2 and len(seen["losses"]) == 4 and seen["checkpointing"]
        assert seen["optimizer"] == "AdamW"
    assert (out / "latest").read_text().strip() == "global_step2"
    logs = proc.stdout
    assert logs.count("zerotrain: Net, ") == 1  # initialize's summary, rank 0 only
    assert "2 processes on 1 node | ZeRO stage 2" in logs and "batch: 2 per process x 2 accumulation" in logs
    assert logs.count("micro-step 3 loss") == 1 and "[Rank 0] micro-step 0 loss" in logs  # log_dist(ranks=[0])
    assert logs.count("after save | MA ") == 1 and "all_reduce" in logs
