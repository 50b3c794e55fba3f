"""Every user mistake ends as one `zerotrain: error:` line and exit code 2, and leaves
output_dir as it was. Run through the CLI's main() in this process (one rank): the 2-rank
path of the same errors is in test_train_cli.py."""

from __future__ import annotations

import json
import signal

import pytest

from zerotrain.cli import main


@pytest.fixture
def data(tmp_path, monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "ZEROTRAIN_ERROR_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.txt").write_text("".join(f"line {i} of some text here\n" for i in range(200)))
    (tmp_path / "rows.jsonl").write_text(json.dumps({"body": "x"}) + "\n")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "ds.json").write_text(json.dumps({"gradient_accumulation_steps": 4}))
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps({"messages": chat}) + "\n" for _ in range(20))
                                         + json.dumps({"messages": chat[:1]}) + "\n")
    (tmp_path / "broken.jinja").write_text("{% for m in messages %}{{ m.content }")
    return tmp_path


BASE = ["train", "--model_config", "gpt-tiny", "--output_dir", "out", "--max_steps", "2", "--block_size", "32",
        "--cache_dir", "cache", "--disable_tqdm", "--report_to", "none"]


@pytest.mark.parametrize("extra, message", [
    (["--train_file", "nope.txt"], "train_file nope.txt: does not exist"),
    (["--train_file", "rows.jsonl"], "train_file rows.jsonl: no column 'text'; its columns are body"),
    (["--train_file", "latin1.txt"], "train_file latin1.txt: not UTF-8 text (byte 0xe9 at offset 3)"),
    (["--train_file", "empty.txt"], "train_file empty.txt: no rows; the dataset is empty"),
    (["--train_file", "train.txt", "--block_size", "512"],
     "block_size 512 is larger than the model's 128 positions; use --block_size 128 or less"),
    (["--train_file", "train.txt", "--fp16", "--bf16"], "fp16 and bf16 are both set; choose one"),
    (["--train_file", "train.txt", "--gradient_accumulation_steps", "2", "--deepspeed", "ds.json"],
     "gradient_accumulation_steps=4 vs --gradient_accumulation_steps 2"),
    (["--train_file", "train.txt", "--model_name_or_path", "m"], "model_name_or_path and model_config both given"),
    (["--train_file", "train.txt", "--task", "mlm"], "task mlm: the zerotrain gpt model supports clm"),
    (["--train_file", "train.txt", "--eval_strategy", "steps", "--validation_split_percentage", "0"],
     "eval_strategy steps needs evaluation data"),
    (["--train_file", "train.txt", "--resume_from_checkpoint", "latest"], "no checkpoint in out"),
    (["--train_file", "chat.jsonl", "--task", "sft", "--sft_format", "openai"],
     "sft_format: should be one of auto, messages, sharegpt, prompt_completion, alpaca, got 'openai'"),
    (["--train_file", "chat.jsonl", "--task", "sft", "--chat_template", "broken.jinja"],
     "broken.jinja does not render it (TemplateSyntaxError"),
    (["--train_file", "chat.jsonl", "--task", "sft", "--chat_template", "chatml"],
     "train_file chat.jsonl row 21: no assistant turn to train on"),
    (["--train_file", "chat.jsonl", "--text_column", "messages"],
     "train_file chat.jsonl: column 'messages' holds list values"),
])
def test_bad_input_is_one_line_and_exit_code_2(data, capsys, extra, message):
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    assert main(BASE + extra) == 2
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers  # left as they were
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("zerotrain: error: ") and message in err[0], err
    assert not (data / "out").exists()


def test_existing_output_dir_is_left_untouched(data, capsys):
    assert main(BASE + ["--train_file", "train.txt", "--save_steps", "1"]) == 0
    before = {p: p.read_bytes() for p in (data / "out").rglob("*") if p.is_file()}
    capsys.readouterr()
    assert main(BASE + ["--train_file", "train.txt", "--max_steps", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "output_dir out is not empty" in err[0] and "--overwrite_output_dir" in err[0]
    assert {p: p.read_bytes() for p in (data / "out").rglob("*") if p.is_file()} == before


def test_an_options_file_with_an_unknown_key(data, capsys):
    (data / "run.yaml").write_text("output_dir: out\ntrain_file: train.txt\nlearning_rte: 0.1\n")
    assert main(["train", "run.yaml"]) == 2
    assert capsys.readouterr().err.strip() == \
        "zerotrain: error: learning_rte: unknown option, did you mean learning_rate?"
