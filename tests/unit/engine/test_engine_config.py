"""engine.config holds the values that run, and the config keys that act on the engine do:
the notice, dataloader_drop_last, fp16.auto_cast, curriculum_type, the model-derived stage-3
values, hjson and duplicate keys through initialize(config=path)."""

from __future__ import annotations

import json

import pytest
import torch
from engine_helpers import SEQ, VOCAB, config, mlp, tiny_gpt

import zerotrain
from zerotrain.errors import ConfigError
from zerotrain.features.curriculum import CurriculumFeature
from zerotrain.features.engine_methods import curriculum_seqlen


def test_stage2_defaults_are_the_values_in_force():
    engine, _, _, _ = zerotrain.initialize(model=mlp(), config=config(zero_optimization={"stage": 2}))
    zero = engine.config.zero_optimization
    assert zero.overlap_comm is True and zero.reduce_bucket_size == 2**21
    assert engine.strategy.reducer.max_in_flight == 2  # overlapping
    engine.destroy()
    small = config(zero_optimization={"stage": 2, "overlap_comm": False, "reduce_bucket_size": 16})
    engine, _, _, _ = zerotrain.initialize(model=mlp(), config=small)
    assert engine.strategy.reducer.max_in_flight == 1
    assert len(engine.strategy.reducer.buckets) > 1  # 16-element buckets over 83 parameters
    engine.destroy()


def test_stage3_writes_back_what_it_derived_from_the_model():
    engine, _, _, _ = zerotrain.initialize(model=tiny_gpt(), config=config(zero_optimization={"stage": 3}))
    zero = engine.config.zero_optimization
    assert zero.prefetch_bucket_size == engine.strategy.schedule.prefetch_numel > 0
    assert zero.max_reuse_distance == engine.strategy.schedule.reuse_numel == zero.prefetch_bucket_size
    assert zero.settled["prefetch_bucket_size"].startswith("zerotrain default: about two typical modules")
    engine.destroy()
    given = config(zero_optimization={"stage": 3, "stage3_prefetch_bucket_size": 1234})
    engine, _, _, _ = zerotrain.initialize(model=tiny_gpt(), config=given)
    zero = engine.config.zero_optimization
    assert zero.prefetch_bucket_size == engine.strategy.schedule.prefetch_numel == 1234 and zero.max_reuse_distance == 1234
    assert "prefetch_bucket_size" not in zero.settled
    engine.destroy()


def test_notice_names_every_key_with_no_effect(zerotrain_log):
    cfg = config(zero_optimization={"stage": 1, "contiguous_gradients": True, "round_robin_gradients": True},
                 dump_state=True, amp={"enabled": False}, _comment="mine",
                 zero_allow_untested_optimizer=True)
    engine, _, _, _ = zerotrain.initialize(model=mlp(), config=cfg)
    lines = [r.getMessage() for r in zerotrain_log.records if "no effect" in r.getMessage()]
    assert len(lines) == 1
    for key in ("_comment", "dump_state", "amp", "zero_allow_untested_optimizer",
                "zero_optimization.contiguous_gradients", "zero_optimization.round_robin_gradients"):
        assert key in lines[0]
    engine.destroy()
    zerotrain_log.clear()
    engine, _, _, _ = zerotrain.initialize(model=mlp(), config=config())
    assert not [r for r in zerotrain_log.records if "no effect" in r.getMessage()]
    engine.destroy()


def test_offload_param_below_stage_3_is_named_not_refused(zerotrain_log):
    cfg = config(zero_optimization={"stage": 2, "offload_param": {"device": "cpu"}})
    engine, _, _, _ = zerotrain.initialize(model=mlp(), config=cfg)  # DeepSpeed ignores it too
    assert any("zero_optimization.offload_param (stage 2)" in r.getMessage() for r in zerotrain_log.records)
    assert engine.memory_breakdown()["params"]["host"] == 0
    engine.destroy()


@pytest.mark.parametrize("drop,batches", [(False, 4), (True, 3)])
def test_dataloader_drop_last(drop, batches):
    data = [torch.randn(6) for _ in range(7)]
    _, _, loader, _ = zerotrain.initialize(model=mlp(), config=config(dataloader_drop_last=drop), training_data=data)
    sizes = [len(b) for b in loader]
    assert len(sizes) == batches and (sizes[-1] == 1) is (not drop)


class _Records(torch.nn.Module):
    """A linear layer that remembers the dtypes its forward received."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 3)
        self.seen = []

    def forward(self, x, ids=None):
        self.seen.append((x.dtype, None if ids is None else ids.dtype))
        return self.lin(x)


@pytest.mark.parametrize("auto_cast", [True, False])
def test_fp16_auto_cast(auto_cast):
    model = _Records()
    cfg = config(fp16={"enabled": True, "auto_cast": auto_cast, "loss_scale": 8})
    engine, _, _, _ = zerotrain.initialize(model=model, config=cfg)
    x, ids = torch.randn(2, 6), torch.ones(2, 3, dtype=torch.long)
    if not auto_cast:  # an fp16 model fed fp32 features fails, as without DeepSpeed's cast
        with pytest.raises(RuntimeError):
            engine(x, ids=ids)
        return
    loss = engine(x, ids=ids).float().sum()
    engine.backward(loss)
    engine.step()
    assert model.seen == [(torch.float16, torch.long)]  # floats cast, integers untouched
    engine.eval()
    with pytest.raises(RuntimeError):  # evaluation forwards are the model's own business
        engine(x)
    engine.destroy()


class _SeqModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, 4)
        self.lengths = []

    def forward(self, input_ids):
        self.lengths.append(input_ids.shape[1])
        return self.emb(input_ids).float().mean()


@pytest.mark.parametrize("kind", ["seqlen", "vocab"])
def test_curriculum_type_other_than_seqlen_moves_the_schedule_only(kind):
    model = _SeqModel()
    block = {"enabled": True, "curriculum_type": kind, "min_difficulty": 2, "max_difficulty": SEQ,
             "schedule_type": "fixed_linear", "schedule_config": {"total_curriculum_step": 4, "difficulty_step": 2}}
    engine, _, _, _ = zerotrain.initialize(model=model, config=config(curriculum_learning=block))
    for _ in range(3):
        engine.backward(engine(torch.ones(2, SEQ, dtype=torch.long)))
        engine.step()
    scheduler = engine.feature(CurriculumFeature).scheduler
    assert scheduler.get_current_difficulty() == 12  # the schedule moved in both cases (3/4 of 2 -> 16)
    assert model.lengths == ([4, 8, 12] if kind == "seqlen" else [SEQ] * 3)
    assert (curriculum_seqlen(engine) is None) is (kind != "seqlen")


def test_initialize_reads_hjson_and_refuses_duplicates(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text('{\n  // comments and trailing commas, as DeepSpeed reads files\n'
                    '  "train_micro_batch_size_per_gpu": 2,\n  "optimizer": {"type": "SGD", "params": {"lr": 0.1,},},\n}')
    engine, optimizer, _, _ = zerotrain.initialize(model=mlp(), config=str(path))
    assert engine.train_micro_batch_size_per_gpu() == 2 and optimizer.param_groups[0]["lr"] == 0.1
    engine.destroy()
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2})[:-1] + ', "train_micro_batch_size_per_gpu": 4}')
    with pytest.raises(ConfigError, match="appears twice"):
        zerotrain.initialize(model=mlp(), config=str(path))


def test_hf_template_through_initialize_uses_defaults_for_block_autos():
    cfg = {"train_micro_batch_size_per_gpu": 2, "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"},
           "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                                 "stage3_gather_16bit_weights_on_model_save": "auto", "sub_group_size": 0},
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
    engine, _, _, _ = zerotrain.initialize(model=tiny_gpt(), config=cfg)
    zero = engine.config.zero_optimization
    assert not engine.config.fp16.enabled and not engine.config.bf16.enabled
    assert zero.reduce_bucket_size == 2**21 and zero.gather_16bit_weights_on_model_save is False
    assert zero.sub_group_size == 2**20 and zero.prefetch_bucket_size == engine.strategy.schedule.prefetch_numel
    engine.destroy()
    with pytest.raises(ConfigError, match=r"^optimizer\.params\.lr is 'auto', which only the Trainer fills in"):
        zerotrain.initialize(model=mlp(), config={**cfg, "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}})
