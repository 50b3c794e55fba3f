"""`zerotrain train --tensor_parallel_size 2` on 2 processes: an HF LLaMA built from a config,
its projections split across the two ranks, evaluated, saved whole (one ~40 s job)."""

from __future__ import annotations

import json

import torch
from e2e_helpers import metrics, ok, text_file, zerotrain

LLAMA = {"model_type": "llama", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}


def _whole(pieces: list[dict]) -> dict:
    """One model's weights from the two tensor ranks' checkpoint pieces (colwise: the output
    rows, rowwise: the input columns; the rest is the same on both)."""
    out = {}
    for k, v in pieces[0].items():
        if any(p in k for p in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")):
            out[k] = torch.cat([p[k] for p in pieces], 0)
        elif any(p in k for p in ("o_proj", "down_proj")):
            out[k] = torch.cat([p[k] for p in pieces], 1)
        else:
            assert torch.equal(v, pieces[1][k]), k  # replicated: both ranks kept the same weights
            out[k] = v
    return out


def test_trainer_splits_an_hf_llama_across_tensor_ranks(tmp_path):
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    text_file(tmp_path / "train.txt", 300)
    (tmp_path / "llama.json").write_text(json.dumps(LLAMA))
    ok(zerotrain(tmp_path, "train", "--nproc_per_node", "2", "--tensor_parallel_size", "2",
                 "--model_config", "llama.json", "--train_file", "train.txt", "--output_dir", "run",
                 "--block_size", "32", "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "2",
                 "--max_steps", "4", "--logging_steps", "2", "--save_steps", "4", "--eval_strategy", "steps",
                 "--eval_steps", "4", "--disable_tqdm"))
    run = tmp_path / "run"
    state = json.loads((run / "trainer_state.json").read_text())
    # one data-parallel rank: 4 steps x 2 micro-batches x 2 samples x 32 tokens, counted once
    assert state["global_step"] == 4 and state["tokens"] == 512 and state["eval_loss"] > 0
    assert [m["step"] for m in metrics(run) if "loss" in m] == [2, 4]
    ckpt = run / "checkpoint-4"
    pieces = [torch.load(ckpt / f"tp_0{t}-model_states.pt", weights_only=True)["module"] for t in (0, 1)]
    assert pieces[0]["model.layers.0.self_attn.q_proj.weight"].shape == (32, 64)  # half the heads each
    # the tokenizer's 259 tokens do not split in two: the embedding and head stay whole (a notice says so)
    assert pieces[0]["lm_head.weight"].shape == pieces[0]["model.embed_tokens.weight"].shape == (259, 64)
    trained = LlamaForCausalLM(LlamaConfig.from_pretrained(str(run)))  # the vocabulary fit to the tokenizer
    trained.load_state_dict(_whole(pieces))
    saved = AutoModelForCausalLM.from_pretrained(str(run))  # plain transformers, one process
    x = torch.randint(0, trained.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(saved(x).logits, trained.eval()(x).logits)
