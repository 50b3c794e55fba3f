"""ZeRO-3 on any torch model, 2 real gloo processes against 1 process.

Stock torch layers (nn.TransformerEncoder/Decoder: layers deep-copied inside zero.Init,
nn.MultiheadAttention reading out_proj.weight itself), HF LLaMA and BERT built under
zero.Init, a tied head applied functionally in the root's forward with a frozen table, and
LoRA through peft on a zero.Init model. The reference is the same model built plainly and
trained at stage 0 in one process (same seed, so zero.Init must reproduce its init too)."""

from __future__ import annotations

import pytest
import torch

from any_models import train_model


def assert_params_close(a: dict, b: dict, rtol: float, atol: float = 1e-8) -> None:
    """Relative per tensor, with an absolute floor for tensors that stay ~0 (BERT's key bias)."""
    assert a.keys() == b.keys()
    for k in a:
        diff = (a[k] - b[k]).norm().item()
        assert diff <= rtol * b[k].norm().item() + atol, f"{k}: difference {diff:.2e}"

KINDS = ["encoder", "decoder", "tied_frozen", "llama", "bert", "lora"]


@pytest.fixture(scope="module")
def references():
    return {kind: train_model(kind, under_init=False, stage=0) for kind in KINDS}


@pytest.mark.parametrize("kind", KINDS)
def test_zero3_under_init_matches_one_process(world2, references, kind):
    ranks = world2.run(train_model, kind, True, 3)
    reference = references[kind]
    mean = [(a + b) / 2 for a, b in zip(ranks[0]["losses"], ranks[1]["losses"])]  # each rank: half the batch
    assert mean[0] == pytest.approx(reference["losses"][0], rel=1e-6)  # the same init
    assert mean == pytest.approx(reference["losses"], rel=1e-4)
    for r in ranks:
        assert r["norms"] == pytest.approx(reference["norms"], rel=1e-4)
        assert r["trainable"] == reference["trainable"]  # shapes answer whole at stage 3
    assert_params_close(ranks[0]["params"], ranks[1]["params"], rtol=0)
    assert_params_close(ranks[0]["params"], reference["params"], rtol=1e-4)


def test_zero3_encoder_built_plainly_matches_one_process(world2, references):
    ranks = world2.run(train_model, "encoder", False, 3)
    assert ranks[0]["norms"] == pytest.approx(references["encoder"]["norms"], rel=1e-4)
    assert_params_close(ranks[0]["params"], references["encoder"]["params"], rtol=1e-4)


def live_peak_with_externals(max_live: int) -> dict:
    """The encoder under zero.Init with a live-parameter budget: out_proj.weight is used by
    its parent (MultiheadAttention), so it joins that module's gathers."""
    import torch

    import zerotrain
    from any_models import SEQ, VOCAB, build
    from scenarios import rank_and_world

    rank, _ = rank_and_world()
    with zerotrain.zero.Init():
        model = build("encoder")
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 0.0,
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                    "stage3_max_live_parameters": max_live, "stage3_prefetch_bucket_size": 10**9},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}}
    engine, *_ = zerotrain.initialize(model=model, config=config)
    for step in range(3):
        ids = torch.randint(0, VOCAB, (4, SEQ), generator=torch.Generator().manual_seed(step))[rank * 2 : rank * 2 + 2]
        engine.backward(engine(ids))
        engine.step()
    schedule, gatherer = engine.strategy.schedule, engine.strategy.gatherer
    mha = model.body.layers[0].self_attn
    k = schedule._module_index[id(mha)]
    return {"peak": gatherer.peak_live_numel, "largest_module": max(schedule.owner_numel),
            "total": sum(gatherer.numel_of.values()), "live_after_step": gatherer.live_numel,
            "out_proj_joined_its_parent": any(p is mha.out_proj.weight for p in schedule.owner_params[k])}


def test_stage3_live_parameters_stay_within_the_budget_with_external_parameters(world2):
    for r in world2.run(live_peak_with_externals, 2_000):
        assert r["out_proj_joined_its_parent"]
        assert r["peak"] <= 2_000 + r["largest_module"]
        assert r["peak"] < r["total"]
        assert r["live_after_step"] == 0


def modify_on_one_rank(offload: str) -> dict:
    """Rank 1 changes a weight inside GatheredParameters(modifier_rank=1); every rank must see it."""
    import torch

    import zerotrain
    from scenarios import rank_and_world, tiny_gpt

    rank, _ = rank_and_world()
    model = tiny_gpt()
    zero = {"stage": 3, "stage3_param_persistence_threshold": 0}
    if offload != "none":
        zero["offload_param"] = {"device": offload}
    engine, *_ = zerotrain.initialize(model=model, config={
        "train_micro_batch_size_per_gpu": 2, "gradient_clipping": 0.0, "zero_optimization": zero,
        "optimizer": {"type": "SGD", "params": {"lr": 0.0}}})
    target = model.blocks[0].fc.weight
    with zerotrain.zero.GatheredParameters([target], modifier_rank=1):
        if rank == 1:
            target.data.fill_(0.5)
    ids = torch.arange(16).reshape(1, 16) % 8
    engine.backward(engine(ids, labels=ids))
    engine.step()  # lr 0: the step writes the fp32 masters back; they must hold the change too
    with zerotrain.zero.GatheredParameters([target]):
        seen = target.detach().clone()
    return {"all_half": bool((seen == 0.5).all()), "numel": seen.numel()}


@pytest.mark.parametrize("offload", ["none", "cpu"])
def test_gathered_parameters_modifier_rank_reaches_every_rank(world2, offload):
    for r in world2.run(modify_on_one_rank, offload):
        assert r["numel"] > 0 and r["all_half"]


def chunk_bytes_under_init(dtype_name: str) -> list[tuple[str, int, int]]:
    """(name, bytes its chunk's storage holds, bytes the chunk needs) of a GPT built under
    zero.Init in `dtype`, whose weights were initialised through module.apply (glued, cut)."""
    import torch

    import zerotrain
    from scenarios import tiny_gpt

    with zerotrain.zero.Init(dtype=getattr(torch, dtype_name)):
        model = tiny_gpt()
    return [(n, p.zt_chunk.untyped_storage().nbytes(), p.zt_chunk.numel() * p.zt_chunk.element_size())
            for n, p in model.named_parameters()]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_init_chunks_hold_only_themselves(world2, dtype):
    """A chunk must be a copy: a view of the whole parameter would keep all of it alive."""
    for rank in world2.run(chunk_bytes_under_init, dtype):
        for name, held, needed in rank:
            assert held == needed, f"{name}: its chunk keeps {held} bytes alive for {needed}"


def generate_between_steps(stage: int) -> dict:
    """Train a step, "generate" (three forwards of a growing prefix) inside
    unwrap_model_for_generation, train two more steps; each rank its half of the batch."""
    import torch

    import zerotrain
    from scenarios import global_batch, rank_and_world, tiny_gpt

    rank, world = rank_and_world()
    model = tiny_gpt()
    engine, *_ = zerotrain.initialize(model=model, config={
        "train_batch_size": 4, "gradient_clipping": 0.0, "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
        "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0}})
    strategy = engine.strategy if stage == 3 else None

    def whole_numels() -> list[int]:
        with torch._C.DisableTorchFunctionSubclass():  # what the tensors hold, nothing gathered
            return [p.numel() for p in model.parameters()]

    def train_step(step: int) -> float:
        mine = global_batch(step, 4)[rank * 4 // world : (rank + 1) * 4 // world]
        loss = engine(mine, labels=mine)
        engine.backward(loss)
        engine.step()
        return loss.item()

    losses = [train_step(0)]
    prompt, logits, whole_inside = torch.arange(6).reshape(1, 6) % 8, [], []
    with zerotrain.zero.unwrap_model_for_generation(engine) as unwrapped, torch.no_grad():
        for n in range(3):
            logits.append(unwrapped(prompt[:, : 4 + n])[0, -1].clone())
            whole_inside.append(whole_numels())  # the module hooks released nothing
    after = whole_numels()
    losses += [train_step(1), train_step(2)]
    return {"losses": losses, "logits": logits, "whole_inside": whole_inside, "after": after,
            "full": [p.numel() for p in model.parameters()], "returned_engine": unwrapped is engine,
            "live_after": strategy.gatherer.live_numel if strategy else 0}


def test_unwrap_model_for_generation_gathers_once_and_training_goes_on(world2):
    reference = generate_between_steps(0)
    ranks = world2.run(generate_between_steps, 3)
    for r in ranks:
        assert r["returned_engine"]
        assert all(inside == r["full"] for inside in r["whole_inside"])
        assert all(n == 0 for n in r["after"]) and r["live_after"] == 0  # released on exit
        for mine, ref in zip(r["logits"], reference["logits"]):
            assert torch.allclose(mine, ref, rtol=1e-5, atol=1e-6)
    mean = [(a + b) / 2 for a, b in zip(ranks[0]["losses"], ranks[1]["losses"])]
    assert mean == pytest.approx(reference["losses"], rel=1e-5)  # the next passes trained as before


def modify_without_modifier_rank(built_under_init: bool) -> dict:
    """Only rank 0 changes a weight inside GatheredParameters(modifier_rank=None), and reads it
    back inside the block (the pattern DeepSpeed's zero_to_fp32 tests use)."""
    import warnings

    import torch

    import zerotrain
    from scenarios import rank_and_world, tiny_gpt

    rank, _ = rank_and_world()
    if built_under_init:
        with zerotrain.zero.Init():
            model = tiny_gpt()
    else:
        model = tiny_gpt()
        zerotrain.initialize(model=model, config={"train_batch_size": 2, "zero_optimization": {"stage": 3},
                                                  "optimizer": {"type": "SGD", "params": {"lr": 0.1}}})
    target = model.blocks[0].fc.weight
    with zerotrain.zero.GatheredParameters([target]):
        before = target.detach().clone()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with zerotrain.zero.GatheredParameters([target]):
            if rank == 0:
                with torch.no_grad():
                    target.add_(1.0)
            seen_inside = bool(torch.equal(target.detach(), before + (1.0 if rank == 0 else 0.0)))
    found = [str(w.message) for w in caught if issubclass(w.category, zerotrain.errors.GatheredModificationWarning)]
    with zerotrain.zero.GatheredParameters([target]):
        unchanged = bool(torch.equal(target.detach(), before))
    return {"warning": found[0] if len(found) == 1 else None, "inside": seen_inside, "unchanged": unchanged}


@pytest.mark.parametrize("built_under_init", [True, False])
def test_a_change_without_modifier_rank_warns_on_every_rank_and_is_discarded(world2, built_under_init):
    for r in world2.run(modify_without_modifier_rank, built_under_init):
        assert r["warning"] and "discarded" in r["warning"] and "modifier_rank=<rank>" in r["warning"]
        # an engine names the parameter; under zero.Init alone only its shape is known
        assert ("blocks.0.fc.weight" in r["warning"]) != built_under_init, r["warning"]
        assert r["inside"]  # the change is readable inside the block, as DeepSpeed's tests read it
        assert r["unchanged"]  # partitioned again as it was: rank 0's change is not kept
