"""--task sft: each conversation format read, labels on the assistant's tokens checked token by
token on a known template, the cut at block_size, packing, and one line per bad input."""

from __future__ import annotations

import json

import pytest
import torch

from zerotrain.comm import Comm, ParallelState
from zerotrain.errors import ConfigError, DataError
from zerotrain.trainer.args import DataArguments, ModelArguments, build
from zerotrain.trainer.data import chat
from zerotrain.trainer.data.collate import Collator
from zerotrain.trainer.data.packing import pack
from zerotrain.trainer.data.prepare import prepare
from zerotrain.trainer.data.tokenizer import byte_tokenizer

CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
                {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": "4"}]


def render(messages, train_on_prompt=False, block_size=4096, template="chatml"):
    renderer = chat.Renderer(byte_tokenizer(), chat.template_text(template), template, train_on_prompt, block_size)
    return renderer({"messages": messages}, "messages", "row 1")


def test_only_assistant_tokens_count_token_by_token():
    ids, labels = render(CONVERSATION)
    text = ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
            "<|im_start|>assistant\n4<|im_end|>\n")
    tok = byte_tokenizer()
    assert [tok.decode([t]) for t in ids] == list(text)  # the byte tokenizer: one token per character here
    trained = [False] * len(text)
    for answer in ("Hello!<|im_end|>\n", "4<|im_end|>\n"):  # the answer and the end of its turn
        start = text.index("<|im_start|>assistant\n" + answer) + len("<|im_start|>assistant\n")
        trained[start:start + len(answer)] = [True] * len(answer)
    assert [label != -100 for label in labels] == trained
    assert all(label == tid for label, tid in zip(labels, ids) if label != -100)
    ids2, labels2 = render(CONVERSATION, train_on_prompt=True)
    assert ids2 == ids and labels2 == ids


def test_the_cut_keeps_each_label_with_its_token():
    ids, labels = render(CONVERSATION)
    short_ids, short_labels = render(CONVERSATION, block_size=70)
    assert short_ids == ids[:70] and short_labels == labels[:70]


FORMATS = {
    "messages": {"messages": CONVERSATION[1:3]},
    "sharegpt": {"system": "Be brief.", "conversations": [{"from": "human", "value": "Hi there"},
                                                          {"from": "gpt", "value": "Hello!"}]},
    "prompt_completion": {"prompt": [{"role": "user", "content": "Hi there"}],
                          "completion": [{"role": "assistant", "content": "Hello!"}]},
    "alpaca": {"instruction": "Say hello", "input": "to me", "output": "Hello!",
               "history": [["Hi there", "Hi"]]},
}
EXPECTED = {
    "messages": [("user", "Hi there"), ("assistant", "Hello!")],
    "sharegpt": [("system", "Be brief."), ("user", "Hi there"), ("assistant", "Hello!")],
    "prompt_completion": [("user", "Hi there"), ("assistant", "Hello!")],
    "alpaca": [("user", "Hi there"), ("assistant", "Hi"), ("user", "Say hello\nto me"), ("assistant", "Hello!")],
}


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_each_format_is_read(tmp_path, fmt):
    row = FORMATS[fmt]
    assert chat.detect_format(list(row), "auto", "train_file", "x") == fmt
    messages, trained = chat.to_messages(row, fmt, "row 1")
    assert [(m["role"], m["content"]) for m in messages] == EXPECTED[fmt]
    assert trained == {i for i, (role, _) in enumerate(EXPECTED[fmt]) if role == "assistant"}
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(row) + "\n" for _ in range(4)))
    data = prepare(ModelArguments(task="sft"), DataArguments(train_file=str(tmp_path / "t.jsonl"), chat_template="chatml",
                                                             validation_split_percentage=0, cache_dir=str(tmp_path / "c")),
                   0, byte_tokenizer(), 1024, Comm(ParallelState()))
    sample = data.train[0]
    answer = byte_tokenizer().decode([t for t, label in zip(sample["input_ids"], sample["labels"]) if label != -100])
    assert answer.startswith("Hi<|im_end|>\n" if fmt == "alpaca" else "Hello!<|im_end|>\n")


def test_plain_prompt_completion_needs_no_template():
    tok = byte_tokenizer()
    renderer = chat.Renderer(tok, None, None, False, 4096)
    ids, labels = renderer({"prompt": "Q: 1+1\nA:", "completion": " 2"}, "prompt_completion", "row 1")
    assert tok.decode(ids[:-1]) == "Q: 1+1\nA: 2" and ids[-1] == tok.eos_token_id
    assert [label != -100 for label in labels] == [False] * 9 + [True] * 3  # " 2" and the end of text


def test_packing_keeps_examples_apart():
    packed = pack({"input_ids": [[1, 2, 3], [4, 5], [6, 7, 8, 9]], "labels": [[1, 2, 3], [-100, 5], [6, 7, 8, 9]]}, 6)
    assert packed["input_ids"] == [[1, 2, 3, 4, 5], [6, 7, 8, 9]]
    assert packed["position_ids"] == [[0, 1, 2, 0, 1], [0, 1, 2, 3]]
    assert packed["labels"] == [[-100, 2, 3, -100, 5], [-100, 7, 8, 9]]
    batch = Collator("sft", 0)([{k: v[i] for k, v in packed.items()} for i in range(2)])
    assert "attention_mask" not in batch and batch["position_ids"].tolist() == [[0, 1, 2, 0, 1], [0, 1, 2, 3, 0]]
    assert batch["labels"][1].tolist() == [-100, 7, 8, 9, -100]


def test_a_packed_example_sees_only_itself_in_an_hf_model():
    from zerotrain.trainer.loop.step import forward_inputs, forward_keys
    from zerotrain.trainer.model.build import build_model

    model, _ = build_model(None, "llama-tiny", "sft", byte_tokenizer())
    a, b = torch.randint(0, 250, (1, 7)), torch.randint(0, 250, (1, 5))
    batch = {"input_ids": torch.cat([a, b], 1), "position_ids": torch.cat([torch.arange(7), torch.arange(5)])[None]}
    with torch.no_grad():
        packed = model(**forward_inputs(batch, forward_keys(model), "cpu")).logits
        alone = model(input_ids=b).logits
    assert torch.allclose(packed[0, 7:], alone[0], atol=1e-5)


def write(tmp_path, rows, name="t.jsonl"):
    (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(tmp_path / name)


def sft_prepare(tmp_path, rows, task="sft", **data):
    args = {"train_file": write(tmp_path, rows), "validation_split_percentage": 0, "cache_dir": str(tmp_path / "c"),
            "chat_template": "chatml" if task == "sft" else None, **data}
    return prepare(ModelArguments(task=task), DataArguments(**args), 0, byte_tokenizer(), 1024, Comm(ParallelState()))


def one_line(err) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


def test_bad_inputs_are_one_line_each(tmp_path):
    good = {"messages": CONVERSATION}
    with pytest.raises(ConfigError) as err:
        build({"output_dir": "o", "task": "sft", "sft_format": "sharegtp"})
    assert "sft_format: should be one of" in one_line(err) and "did you mean sharegpt?" in one_line(err)
    (tmp_path / "broken.jinja").write_text("{% for m in messages %}{{ m.content }")
    with pytest.raises(DataError) as err:
        sft_prepare(tmp_path, [good], chat_template=str(tmp_path / "broken.jinja"))
    assert "train_file" in one_line(err) and "row 1" in one_line(err) and "does not render it" in one_line(err)
    with pytest.raises(DataError) as err:
        sft_prepare(tmp_path, [good, {"messages": CONVERSATION[:2]}], overwrite_cache=True)
    assert "row 2: no assistant turn to train on" in one_line(err)
    with pytest.raises(DataError) as err:
        sft_prepare(tmp_path, [{"conversations": [{"from": "robot", "value": "x"}]}], overwrite_cache=True)
    assert "conversations[0].from: unknown role 'robot'" in one_line(err)
    with pytest.raises(DataError) as err:
        sft_prepare(tmp_path, [{"question": "x"}], overwrite_cache=True)
    assert "no conversation columns for --task sft" in one_line(err) and "its columns are question" in one_line(err)
    with pytest.raises(ConfigError) as err:
        sft_prepare(tmp_path, [good], chat_template=None, overwrite_cache=True)
    assert "the tokenizer has no chat template" in one_line(err) and "--chat_template chatml" in one_line(err)
    (tmp_path / "counts.jinja").write_text("{{ messages | length }}{% for m in messages %}{{ m.content }}{% endfor %}")
    with pytest.raises(DataError) as err:
        sft_prepare(tmp_path, [good], chat_template=str(tmp_path / "counts.jinja"), overwrite_cache=True)
    assert "renders the turns before message 2 differently" in one_line(err)
    with pytest.raises(DataError) as err:  # a list where text belongs: not trained on its repr
        sft_prepare(tmp_path, [good], task="clm", text_column="messages", overwrite_cache=True)
    assert "column 'messages' holds list values" in one_line(err) and "--task sft" in one_line(err)


def test_conversations_with_no_assistant_token_in_block_size_are_left_out_and_said_so(tmp_path):
    long = {"messages": [{"role": "user", "content": "x" * 200}, {"role": "assistant", "content": "ok"}]}
    data = sft_prepare(tmp_path, [{"messages": CONVERSATION}] * 3 + [long], block_size=128)
    assert len(data.train) == 3 and data.notes == [
        "train_file: 1 conversation left out: no assistant token within block_size 128"]
