"""--task sft end to end (~25 s): an HF LLaMA with a chat template in its tokenizer, ShareGPT
conversations, LoRA on ZeRO-3 over 2 processes, packing and a sequence-length curriculum."""

from __future__ import annotations

import json
import random

from e2e_helpers import COMMON, metrics, ok, state, zerotrain

from zerotrain.trainer.data.chat import BUILTIN_TEMPLATES

WORDS = "red green blue one two three cat dog sun moon".split()


def test_sft_with_lora_zero3_two_processes_packing_and_curriculum(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    from zerotrain.trainer.data.tokenizer import byte_tokenizer

    tok = byte_tokenizer()
    tok.chat_template = BUILTIN_TEMPLATES["chatml"]  # the tokenizer's own template: apply_chat_template uses it
    base = tmp_path / "base"
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                 pad_token_id=tok.pad_token_id)).save_pretrained(str(base))
    tok.save_pretrained(str(base))
    rng = random.Random(0)
    rows = []
    for _ in range(160):  # the answer repeats the question backwards: learnable from the prompt alone
        words = rng.sample(WORDS, 3)
        rows.append({"conversations": [{"from": "human", "value": " ".join(words)},
                                       {"from": "gpt", "value": " ".join(reversed(words))}]})
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "z3.json").write_text(json.dumps({
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
        "curriculum_learning": {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": 64,
                                "max_difficulty": "auto", "schedule_type": "fixed_linear",
                                "schedule_config": {"total_curriculum_step": 6, "difficulty_step": 8}}}))
    proc = ok(zerotrain(tmp_path, "train", "--nproc_per_node", "2", "--task", "sft", "--model_name_or_path", "base",
                        "--train_file", "chat.jsonl", "--output_dir", "sft", "--lora_rank", "8", "--lora_target",
                        "q_proj,v_proj", "--deepspeed", "z3.json", "--packing", "--cutoff_len", "128",
                        "--max_steps", "16", "--learning_rate", "1e-2", "--validation_split_percentage", "10",
                        "--save_steps", "8", *COMMON))
    assert "2 processes on 1 node | ZeRO stage 3" in proc.stdout
    recs = [r for r in metrics(tmp_path / "sft") if "loss" in r]
    assert recs[0]["seqlen"] < recs[-1]["seqlen"] == 128  # the curriculum cut the packed blocks from the end
    assert recs[-1]["loss"] < recs[0]["loss"]
    final = state(tmp_path / "sft")
    assert 1 < final["eval_perplexity"] < recs[0]["loss"] ** 10
    for folder in (tmp_path / "sft", tmp_path / "sft" / "checkpoint-16"):  # adapter + tokenizer with its template
        assert (folder / "adapter_model.safetensors").is_file() and not (folder / "model.safetensors").is_file()
        saved = (folder / "tokenizer_config.json").read_text() + \
            ((folder / "chat_template.jinja").read_text() if (folder / "chat_template.jinja").is_file() else "")
        assert "<|im_start|>" in saved
