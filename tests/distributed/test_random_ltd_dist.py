"""Random-LTD on 2 real gloo processes against 1 process, at every ZeRO stage zerotrain has.

Equal results need each sample to keep the same tokens whichever rank and micro-batch it lands
on: the kept tokens are keyed by the sample's place in the global batch (rank r of 2 takes
samples r, r + 2, ... as a DistributedSampler deals them), never by per-rank randomness."""

from __future__ import annotations

import torch

import zerotrain
import zerotrain.zero
from asserts import assert_params_close
from scenarios import global_batch, rank_and_world
from zerotrain.models import GPT, GPTConfig

SEQ, VOCAB, BATCH, STEPS = 16, 64, 4, 5


def ltd_config(stage: int, micro: int, ga: int) -> dict:
    return {
        "train_batch_size": BATCH, "train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": ga,
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}},
        "data_efficiency": {"enabled": True, "seed": 7, "data_routing": {"enabled": True, "random_ltd": {
            "enabled": True, "total_layer_num": 4, "random_ltd_layer_num": 2, "random_ltd_layer_id": [1, 2],
            "model_mask_name": None, "model_type": "decoder", "hidden_state_order": "batch_seq_dim",
            "random_ltd_schedule": {"min_value": 6, "max_value": SEQ, "schedule_type": "fixed_linear",
                                    "schedule_config": {"require_steps": 4, "seq_per_step": 2}}}}},
    }


def train_ltd(cases: list[tuple[int, int, int]]) -> list[dict]:
    """Each case (stage, micro, ga): STEPS steps; rank r trains samples r, r + N, ... of each global batch."""
    rank, world = rank_and_world()
    out = []
    for stage, micro, ga in cases:
        torch.manual_seed(0)
        model = GPT(GPTConfig(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=4, n_head=2, bias=False))
        engine, *_ = zerotrain.initialize(model=model, config=ltd_config(stage, micro, ga))
        losses = []
        for _ in range(STEPS):
            mine = global_batch(engine.global_steps, BATCH)[rank::world]
            step_loss = 0.0
            for m in range(ga):
                x = mine[m * micro: (m + 1) * micro]
                loss = engine(x, labels=x)
                engine.backward(loss)
                engine.step()
                step_loss += loss.item() / ga
            losses.append(step_loss)
        feature = engine.features[0]
        out.append({"params": {k: v.detach().float().clone() for k, v in engine.module_state_dict().items()},
                    "losses": losses, "layer_tokens": feature.layer_tokens,
                    "consumed": engine.random_ltd_scheduler.state["consumed_layer_tokens"]})
        engine.destroy()
    return out


def test_two_ranks_match_one_process_at_every_stage(world2):
    stages = sorted(zerotrain.zero.STRATEGIES)
    # accumulation (one sample per micro-batch) at the first and the last stage only: it tests the
    # micro-batch's place in the step, which no stage changes
    cases = [(stage, 2, 1) for stage in stages] + [(stages[0], 1, 2), (stages[-1], 1, 2)]
    ranks = world2.run(train_ltd, cases)
    references = {stage: r for stage, r in zip(stages, train_ltd([(stage, BATCH, 1) for stage in stages]))}
    for i, (stage, micro, ga) in enumerate(cases):
        ref = references[stage]
        assert ref["layer_tokens"] == BATCH * sum((SEQ * 2 + r * 2) // 4 for r in (6, 8, 10, 12, 16))
        assert ref["consumed"] == BATCH * sum(r * 2 + SEQ * 2 for r in (6, 8, 10, 12, 16))
        for r in ranks:
            assert r[i]["layer_tokens"] == ref["layer_tokens"] and r[i]["consumed"] == ref["consumed"]
            assert_params_close(r[i]["params"], ref["params"], rtol=1e-5)
        mean = [sum(r[i]["losses"][s] for r in ranks) / len(ranks) for s in range(STEPS)]
        torch.testing.assert_close(torch.tensor(mean), torch.tensor(ref["losses"]), atol=1e-5, rtol=0)


# ---- through the pipeline engine ------------------------------------------------------------------
def pipe_ltd_config(**extra) -> dict:
    """pipe_scenarios' GPT (4 PreLNBlocks), 2 micro-batches a step, random-LTD in blocks 1 and 2."""
    import pipe_scenarios as ps

    cfg = ps.config(4, 2, 0, curriculum=False, pld=False, gradient_clipping=0.0, **extra)
    cfg["data_efficiency"] = ltd_config(0, 2, 2)["data_efficiency"]
    return cfg


def pipeline_ltd(schedules: list[tuple[str, int, str, int]]) -> dict:
    """Each (schedule, virtual stages, placement, activation_checkpoint_interval): STEPS steps."""
    import pipe_scenarios as ps

    out = {}
    for name, virtual, placement, every in schedules:
        cfg = pipe_ltd_config(pipeline={"schedule": name, "virtual_stages": virtual,
                                        "activation_checkpoint_interval": every})
        run = ps.pipeline_run(cfg, STEPS, virtual_stages=virtual, placement=placement)
        out[name, every] = {"losses": run["losses"], "params": ps.to_reference_names(run["params"])}
    return out


def test_two_pipeline_stages_match_one_process(world2):
    import pipe_scenarios as ps

    schedules = [("1f1b", 1, "loop", 0), ("gpipe", 1, "loop", 2), ("interleaved_1f1b", 2, "loop", 0)]
    ranks = world2.run(pipeline_ltd, schedules)
    ref = ps.reference_run(pipe_ltd_config(), STEPS)
    plain = ps.reference_run(ps.config(4, 2, 0, curriculum=False, pld=False, gradient_clipping=0.0), STEPS)
    assert abs(ref["losses"][0] - plain["losses"][0]) > 1e-3  # tokens are dropped at step 0
    for key in ranks[0]:
        torch.testing.assert_close(torch.tensor(ranks[0][key]["losses"]), torch.tensor(ref["losses"]), rtol=1e-5,
                                   atol=0)
        whole = {**ranks[0][key]["params"], **ranks[1][key]["params"]}  # each stage's layers
        assert_params_close(whole, {k: v for k, v in ref["params"].items() if k in whole}, rtol=1e-5)
        assert len(whole) == len(ref["params"])
