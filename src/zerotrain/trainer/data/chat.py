"""--task sft: conversations and instructions -> token ids, with the loss on the assistant's tokens.

    row (one of the formats below) ─► messages [{role, content}, ...] + which turns are trained
        ─► the chat template's text (the tokenizer's own, --chat_template FILE or a built-in)
        ─► token ids and their character offsets ─► labels: the id where the token starts
           inside a trained assistant turn, else -100 (--train_on_prompt: every token)
        ─► cut at block_size (ids and labels together)

    format             columns                                   trained
    messages           messages: [{role, content}]               every assistant turn
    sharegpt           conversations: [{from, value}] (+ system)  every gpt turn
    prompt_completion  prompt, completion (text or messages)     the completion
    alpaca             instruction, input, output (+ system, history: [[q, a]])   output (and history answers)

An assistant turn spans from where the template's text for the turns before it, with the
generation prompt, ends to where its text for the turns up to it ends: rendering prefixes is
what finds the boundaries, whatever the template's markup. A template whose earlier turns
change when later ones follow cannot be cut that way and is refused.
"""

from __future__ import annotations

from pathlib import Path

from ...errors import ConfigError, DataError

# Our own renderings of common layouts, for tokenizers without a template.
BUILTIN_TEMPLATES = {
    "chatml": ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
               "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"),
    "llama3": ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
               "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
               "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"),
    "alpaca": ("{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] }}\n\n"
               "{% elif m['role'] == 'user' %}### Instruction:\n{{ m['content'] }}\n\n"
               "{% else %}### Response:\n{{ m['content'] }}{{ eos_token }}\n\n{% endif %}{% endfor %}"
               "{% if add_generation_prompt %}### Response:\n{% endif %}"),
}
FORMAT_COLUMNS = {"messages": ("messages",), "sharegpt": ("conversations",),
                  "prompt_completion": ("prompt", "completion"), "alpaca": ("instruction", "output")}
_SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                   "model": "assistant", "system": "system", "observation": "tool", "tool": "tool",
                   "function_call": "assistant"}


# ---- which template ----------------------------------------------------------------------
def check_chat_template(value: str | None) -> None:
    template_text(value)


def template_text(value: str | None) -> str | None:
    """--chat_template: a built-in's text, a Jinja file's text, or None (the tokenizer's own)."""
    if value is None:
        return None
    if value in BUILTIN_TEMPLATES:
        return BUILTIN_TEMPLATES[value]
    path = Path(value).expanduser()
    if not path.is_file():
        from ...errors import did_you_mean

        raise ConfigError(f"chat_template {value!r}: neither a built-in ({', '.join(BUILTIN_TEMPLATES)}) nor an "
                          f"existing Jinja file{did_you_mean(value, BUILTIN_TEMPLATES)}")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"chat_template {path}: cannot read ({e})") from None


# ---- rows -> messages --------------------------------------------------------------------
def detect_format(columns: list[str], requested: str, what: str, path: str) -> str:
    if requested != "auto":
        missing = [c for c in FORMAT_COLUMNS[requested] if c not in columns]
        if missing:
            raise DataError(f"{what} {path}: sft_format {requested} needs column {missing[0]!r}; its columns are "
                            f"{', '.join(columns)}")
        return requested
    for fmt, needed in FORMAT_COLUMNS.items():
        if all(c in columns for c in needed):
            return fmt
    raise DataError(f"{what} {path}: no conversation columns for --task sft (messages, conversations, "
                    f"prompt + completion, or instruction + output); its columns are {', '.join(columns)}")


def _text(value, where: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise DataError(f"{where}: should be text, got {type(value).__name__}")
    return value


def _turns(value, where: str, role_key: str, content_key: str, roles: dict | None) -> list[dict]:
    if not isinstance(value, list) or not all(isinstance(m, dict) for m in value):
        raise DataError(f"{where}: should be a list of {{{role_key}, {content_key}}} objects, got "
                        f"{type(value).__name__}")
    out = []
    for k, m in enumerate(value):
        role = m.get(role_key)
        if roles is not None:
            if role not in roles:
                raise DataError(f"{where}[{k}].{role_key}: unknown role {role!r}; expected one of {', '.join(roles)}")
            role = roles[role]
        elif not isinstance(role, str):
            raise DataError(f"{where}[{k}].{role_key}: should be a role name, got {role!r}")
        out.append({"role": role, "content": _text(m.get(content_key), f"{where}[{k}].{content_key}")})
    return out


def plain_pair(row: dict, fmt: str) -> tuple[str, str] | None:
    """(prompt, completion) when both are plain text: they are joined as they are, no template."""
    if fmt == "prompt_completion" and isinstance(row["prompt"], str) and isinstance(row["completion"], str):
        return row["prompt"], row["completion"]
    return None


def to_messages(row: dict, fmt: str, where: str) -> tuple[list[dict], set[int]]:
    """(messages, the indices of the turns the loss covers)."""
    if fmt == "messages":
        messages = _turns(row["messages"], f"{where} messages", "role", "content", None)
        trained = {i for i, m in enumerate(messages) if m["role"] == "assistant"}
    elif fmt == "sharegpt":
        messages = _turns(row["conversations"], f"{where} conversations", "from", "value", _SHAREGPT_ROLES)
        if row.get("system"):
            messages = [{"role": "system", "content": _text(row["system"], f"{where} system")}] + messages
        trained = {i for i, m in enumerate(messages) if m["role"] == "assistant"}
    elif fmt == "prompt_completion":
        prompt = _turns(row["prompt"], f"{where} prompt", "role", "content", None)
        completion = _turns(row["completion"], f"{where} completion", "role", "content", None)
        messages = prompt + completion
        trained = {i for i in range(len(prompt), len(messages)) if messages[i]["role"] == "assistant"}
    else:  # alpaca
        messages = [{"role": "system", "content": _text(row["system"], f"{where} system")}] if row.get("system") else []
        for k, pair in enumerate(row.get("history") or []):
            if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                raise DataError(f"{where} history[{k}]: should be a [question, answer] pair")
            messages += [{"role": "user", "content": _text(pair[0], f"{where} history[{k}][0]")},
                         {"role": "assistant", "content": _text(pair[1], f"{where} history[{k}][1]")}]
        query = _text(row["instruction"], f"{where} instruction")
        extra = _text(row.get("input"), f"{where} input")
        messages += [{"role": "user", "content": f"{query}\n{extra}" if extra else query},
                     {"role": "assistant", "content": _text(row["output"], f"{where} output")}]
        trained = {i for i, m in enumerate(messages) if m["role"] == "assistant"}
    if not trained:
        raise DataError(f"{where}: no assistant turn to train on; every conversation needs at least one")
    return messages, trained


# ---- messages -> ids and labels ----------------------------------------------------------
class Renderer:
    """Renders conversations with one template and labels their tokens."""

    def __init__(self, tokenizer, template: str | None, template_name: str | None, train_on_prompt: bool,
                 block_size: int):
        self.tokenizer, self.template, self.train_on_prompt, self.block_size = \
            tokenizer, template, train_on_prompt, block_size
        self.name = template_name or "the tokenizer's chat_template"

    def _render(self, messages: list[dict], generation: bool, where: str) -> str:
        try:
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation,
                                                      chat_template=self.template)
        except Exception as e:  # jinja2's TemplateError family, or a template's raise_exception
            detail = " ".join(str(e).split())[:160] or type(e).__name__
            raise DataError(f"{where}: {self.name} does not render it ({type(e).__name__}: {detail})") from None

    def spans(self, messages: list[dict], trained: set[int], where: str) -> tuple[str, list[tuple[int, int]]]:
        """The rendered text and the character spans of the trained turns."""
        full = self._render(messages, False, where)
        spans = []
        for i in sorted(trained):
            before = self._render(messages[:i], True, where) if i else ""
            upto = self._render(messages[: i + 1], False, where)
            if not (upto.startswith(before) and full.startswith(upto)):
                raise DataError(f"{where}: {self.name} renders the turns before message {i} differently once "
                                "later turns follow, so the assistant's tokens cannot be told apart; use a "
                                "template that renders turn by turn (e.g. --chat_template chatml)")
            spans.append((len(before), len(upto)))
        return full, spans

    def encode(self, text: str, spans: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
        enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = enc["input_ids"][: self.block_size]
        labels = []
        for tid, (start, _) in zip(ids, enc["offset_mapping"]):
            inside = self.train_on_prompt or any(a <= start < b for a, b in spans)
            labels.append(tid if inside else -100)
        return ids, labels

    def __call__(self, row: dict, fmt: str, where: str) -> tuple[list[int], list[int]]:
        pair = plain_pair(row, fmt)
        if pair is not None:  # plain text: prompt + completion + eos, the loss from the completion on
            prompt, completion = pair
            if not completion:
                raise DataError(f"{where}: empty completion; every row needs text to train on")
            text = prompt + completion + (self.tokenizer.eos_token or "")
            return self.encode(text, [(len(prompt), len(text))])
        messages, trained = to_messages(row, fmt, where)
        if self.template is None and getattr(self.tokenizer, "chat_template", None) is None:
            raise ConfigError(f"the tokenizer has no chat template to render conversations; pass --chat_template "
                              f"{' | '.join(BUILTIN_TEMPLATES)} or a Jinja file")
        text, spans = self.spans(messages, trained, where)
        return self.encode(text, spans)


def sft_tokenize_fn(tokenizer, fmt: str, template_value: str | None, train_on_prompt: bool, block_size: int,
                    what: str, path: str):
    """A batched datasets.map function (with_indices) -> input_ids, labels, length; rows whose
    trained tokens all lie past block_size come out empty (length 0) and are dropped."""
    render = Renderer(tokenizer, template_text(template_value), template_value, train_on_prompt, block_size)

    def tokenize(batch, indices):
        out = {"input_ids": [], "labels": [], "length": []}
        columns = list(batch)
        rows = batch.get("zerotrain_row", indices)  # the file's row numbers, when prepare kept them
        for k, index in enumerate(rows):
            row = {c: batch[c][k] for c in columns}
            ids, labels = render(row, fmt, f"{what} {path} row {index + 1}")
            keep = any(label != -100 for label in labels)
            out["input_ids"].append(ids if keep else [])
            out["labels"].append(labels if keep else [])
            out["length"].append(len(ids) if keep else 0)
        return out

    return tokenize
