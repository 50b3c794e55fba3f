"""`zerotrain train` end to end: 2 processes through torchrun, in subprocesses, tiny settings.

A 2-rank job costs ~15-20 s here (process start and imports dominate), so each test covers
several options at once:

    resume       clm, GPT, ZeRO-1, save_total_limit, a seqlen curriculum with the LR set by tokens
                 (equal to Megatron-DeepSpeed's at every step); killed mid-run, resumed with plain torchrun
    mlm -> cls   BERT MLM with ZeRO-2, layer drop, line_by_line + group_by_length, then a
                 classifier with ZeRO-0 initialised from it (init_from) on CSV data
    lora         HF LLaMA from a local folder, LoRA with ZeRO-3 and gradient checkpointing, merge-lora
    child error  a data error found inside the ranks ends as one line and exit code 2
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from e2e_helpers import COMMON, WORDS, env, metrics, ok, state, text_file, wait_for_no_process_with, zerotrain
from megatron_lr import golden_lrs


def test_killed_run_resumes_to_the_same_losses(tmp_path):
    text_file(tmp_path / "train.txt", 600)
    curriculum = {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": 32, "max_difficulty": 128,
                  "schedule_type": "fixed_linear", "schedule_config": {"total_curriculum_step": 12, "difficulty_step": 32}}
    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 1}, "curriculum_learning": curriculum,
                                                  "train_micro_batch_size_per_gpu": "auto"}))
    args = ["--model_config", "gpt-small", "--train_file", "train.txt", "--block_size", "128", "--max_steps", "30",
            "--save_steps", "4", "--save_total_limit", "2", "--deepspeed", "ds.json", "--learning_rate", "2e-3",
            "--lr_decay_tokens", "20000", "--warmup_steps", "3", "--lr_decay_style", "cosine", "--min_lr", "1e-4",
            "--eval_strategy", "steps", "--eval_steps", "10", *COMMON]
    ok(zerotrain(tmp_path, "train", "--nproc_per_node", "2", "--output_dir", "full", *args))

    # the same run, killed (SIGKILL to the whole job) once its first checkpoint exists
    job = subprocess.Popen([sys.executable, "-m", "zerotrain", "train", "--nproc_per_node", "2", "--output_dir", "cut",
                            *args], cwd=tmp_path, env=env(tmp_path), stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 240
    while not (tmp_path / "cut" / "latest").exists() and job.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    os.killpg(job.pid, signal.SIGKILL)
    job.wait()
    # the ranks (torchrun puts each in a session of its own) go down with the launcher
    assert wait_for_no_process_with(tmp_path, "--output_dir", "cut"), "orphaned ranks kept training"
    killed_at = max(r["step"] for r in metrics(tmp_path / "cut"))
    assert killed_at < 30, "the job finished before it could be killed"

    # resumed with plain torchrun, into the same folder
    ok(subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                       "-m", "zerotrain", "train", "--output_dir", "cut",
                       "--resume_from_checkpoint", "latest", *args],
                      cwd=tmp_path, env=env(tmp_path), capture_output=True, text=True, timeout=300))
    full, cut = metrics(tmp_path / "full"), metrics(tmp_path / "cut")
    assert [r["step"] for r in cut if "loss" in r] == list(range(1, 31))
    assert [r["loss"] for r in cut if "loss" in r] == [r["loss"] for r in full if "loss" in r]
    tokens = [r["tokens"] for r in full if "loss" in r]
    golden = golden_lrs([b - a for a, b in zip([0] + tokens, tokens)], max_lr=2e-3, min_lr=1e-4, decay_tokens=20000,
                        style="cosine", warmup_steps=3)
    for run in (full, cut):  # the token counter and the LR came back with the checkpoint
        assert [r["lr"] for r in run if "loss" in r] == pytest.approx(golden[1:], rel=1e-12, abs=0)
        assert [r["tokens"] for r in run if "loss" in r] == tokens
    assert len(set(tokens[i] - tokens[i - 1] for i in range(1, 30))) > 2 and tokens[-2] > 20000
    assert state(tmp_path / "cut")["eval_loss"] == state(tmp_path / "full")["eval_loss"]
    # save_total_limit 2 keeps the newest two; the last step always gets one, and with the final
    # evaluation it is also the best (test_rotation_keeps_the_best_checkpoint: an older best stays)
    assert sorted(p.name for p in (tmp_path / "cut").glob("checkpoint-*")) == ["checkpoint-28", "checkpoint-30"]
    assert state(tmp_path / "cut")["best_checkpoint"] == "cut/checkpoint-30"


def test_mlm_with_layer_drop_then_classifier_from_its_encoder(tmp_path):
    text_file(tmp_path / "train.txt", 300)
    (tmp_path / "mlm.json").write_text(json.dumps({
        "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"},
        "progressive_layer_drop": {"enabled": True, "theta": 0.5, "gamma": 0.1}}))
    ok(zerotrain(tmp_path, "train", "--nproc_per_node", "2", "--model_config", "bert-tiny", "--task", "mlm",
                 "--train_file", "train.txt", "--output_dir", "mlm", "--line_by_line", "--group_by_length",
                 "--block_size", "64", "--max_steps", "12", "--deepspeed", "mlm.json", "--learning_rate", "1e-3",
                 "--eval_strategy", "epoch", "--num_train_epochs", "1", *COMMON))
    last = [r for r in metrics(tmp_path / "mlm") if "loss" in r][-1]
    assert last["pld_theta"] < 0.9 and "eval_accuracy" in state(tmp_path / "mlm")
    assert 0 < state(tmp_path / "mlm")["eval_perplexity"] < 300

    rng = random.Random(1)
    rows = ["text,label"] + [f"{'good' if (y := rng.randint(0, 1)) else 'bad'} {' '.join(rng.sample(WORDS, 5))},"
                             f"{'pos' if y else 'neg'}" for _ in range(160)]
    (tmp_path / "cls.csv").write_text("\n".join(rows) + "\n")
    proc = ok(zerotrain(tmp_path, "train", "--nproc_per_node", "2", "--model_config", "bert-tiny", "--task",
                        "classification", "--init_from", "mlm", "--train_file", "cls.csv", "--output_dir", "cls",
                        "--validation_split_percentage", "20", "--max_steps", "30", "--learning_rate", "3e-3",
                        "--eval_strategy", "steps", "--eval_steps", "15", "--block_size", "64", *COMMON))
    assert "missing keys (newly initialised): pooler.weight, pooler.bias, classifier.weight" in proc.stdout
    final = state(tmp_path / "cls")
    assert final["eval_accuracy"] > 0.9 and final["eval_f1"] > 0.9  # "good"/"bad" decides the label


def test_lora_on_an_hf_model_with_zero3_and_gradient_checkpointing(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    from zerotrain.trainer.data.tokenizer import byte_tokenizer

    tok = byte_tokenizer()
    base = tmp_path / "base"
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      pad_token_id=tok.pad_token_id)
    LlamaForCausalLM(cfg).save_pretrained(str(base))
    tok.save_pretrained(str(base))
    rows = [json.dumps({"text": " ".join(random.Random(i).choices(WORDS, k=12))}) for i in range(200)]
    (tmp_path / "train.jsonl").write_text("\n".join(rows) + "\n")
    (tmp_path / "z3.json").write_text(json.dumps({"zero_optimization": {"stage": 3,
                                                                        "stage3_param_persistence_threshold": 0}}))
    proc = ok(zerotrain(tmp_path, "train", "--nproc_per_node", "2", "--model_name_or_path", "base",
                        "--train_file", "train.jsonl", "--output_dir", "lora", "--lora_rank", "4",
                        "--lora_target_modules", "q_proj,v_proj", "--deepspeed", "z3.json", "--gradient_checkpointing",
                        "--block_size", "32", "--max_steps", "8", "--learning_rate", "1e-2",
                        "--validation_split_percentage", "10", *COMMON))
    # 2 layers x (q_proj: A 4 x 64 + B 64 x 4; v_proj: A 4 x 64 + B 32 x 4, 2 kv heads of 16)
    assert "LoRA rank 4 on q_proj, v_proj: 1,792 trainable of" in proc.stdout
    out = tmp_path / "lora"
    assert (out / "adapter_model.safetensors").is_file() and not (out / "model.safetensors").is_file()
    losses = [r["loss"] for r in metrics(out) if "loss" in r]
    assert losses[-1] < losses[0]
    ok(zerotrain(tmp_path, "merge-lora", "lora", "--output_dir", "merged"))
    assert (tmp_path / "merged" / "model.safetensors").is_file() and (tmp_path / "merged" / "config.json").is_file()

    # the merged model scores the eval set as the adapter run did (same cached eval set, one process)
    code = ("import json, sys; from zerotrain.trainer.args import build; from zerotrain.trainer import Trainer;"
            "from zerotrain.trainer.data.prepare import prepare; from zerotrain.trainer.model.build import load_model;"
            "from zerotrain.trainer.data.tokenizer import load_tokenizer; from zerotrain.comm import Comm, ParallelState;"
            "m, d, t = build({'model_name_or_path': 'merged', 'train_file': 'train.jsonl', 'output_dir': 'ev',"
            " 'block_size': 32, 'validation_split_percentage': 10, 'cache_dir': 'cache', 'report_to': 'none'});"
            "tok = load_tokenizer(None, 'merged'); data = prepare(m, d, 42, tok, 64, Comm(ParallelState()));"
            "model, info = load_model('merged', 'clm');"
            "print(json.dumps(Trainer(model, t, data.train, data.eval, tokenizer=tok, model_info=info).evaluate()))")
    proc = ok(subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env(tmp_path), capture_output=True,
                             text=True, timeout=300))
    merged = json.loads(proc.stdout.strip().splitlines()[-1])
    assert merged["eval_loss"] == pytest.approx(state(out)["eval_loss"], rel=1e-4)


def test_an_error_inside_the_ranks_is_one_line_and_exit_code_2(tmp_path):
    text_file(tmp_path / "train.txt", 50)
    (tmp_path / "val.txt").write_bytes(b"fine\n\xc3\x28 broken\n")
    proc = zerotrain(tmp_path, "train", "--nproc_per_node", "2", "--model_config", "gpt-tiny", "--train_file",
                     "train.txt", "--validation_file", "val.txt", "--output_dir", "out", "--max_steps", "2", *COMMON)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        "zerotrain: error: validation_file val.txt: not UTF-8 text (byte 0xc3 at offset 5); convert the file to UTF-8"]
    assert "Traceback" not in proc.stdout and not (tmp_path / "out").exists()
