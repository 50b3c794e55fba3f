"""What rank 0 shows while training: a progress bar and the final summary table.

    train  37%|████▍       | 150/400 [00:41<01:08, 3.6step/s, loss=3.12, lr=8.1e-04, tok/s=9.4k, seqlen=96, pld_theta=0.87]

Without a terminal (or with --disable_tqdm) the bar is off and each logging step prints one
line instead, so logs stay readable in files and CI.
"""

from __future__ import annotations

import sys


def _short(value) -> str:
    if isinstance(value, float):
        if value != 0 and (abs(value) < 1e-2 or abs(value) >= 1e5):
            return f"{value:.2e}"
        return f"{value:.4g}"
    return str(value)


def _rate(value: float) -> str:
    return f"{value / 1000:.1f}k" if value >= 1000 else f"{value:.0f}"


class Progress:
    def __init__(self, total_steps: int, initial: int, enabled: bool, use_bar: bool):
        self.enabled = enabled
        self.bar = None
        if enabled and use_bar and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total_steps, initial=initial, desc="train", unit="step", dynamic_ncols=True)

    def step(self, fields: dict) -> None:
        if self.bar is not None:
            self.bar.update(1)
            if fields:
                self.bar.set_postfix_str(", ".join(f"{k}={v}" for k, v in fields.items()), refresh=False)

    def log(self, record: dict) -> None:
        """A logging-step or eval record: the bar's postfix, or a printed line without a bar."""
        if not self.enabled:
            return
        if self.bar is None:
            print(" ".join(f"{k}={_short(v)}" for k, v in record.items()), flush=True)
        elif "eval_loss" in record:
            self.bar.write(" ".join(f"{k}={_short(v)}" for k, v in record.items()))

    @staticmethod
    def postfix(record: dict, extra=()) -> dict:
        """Loss, lr and tok/s of a logging record, plus the `extra` keys (what features report)."""
        out = {}
        for key in ("loss", "lr", "tokens_per_s", *extra):
            if key in record:
                value = record[key]
                out["tok/s" if key == "tokens_per_s" else key] = _rate(value) if key == "tokens_per_s" else _short(value)
        return out

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def summary_table(rows: list[tuple[str, object]]) -> str:
    width = max(len(k) for k, _ in rows)
    values = [_short(v) if isinstance(v, float) else str(v) for _, v in rows]
    vwidth = max(len(v) for v in values)
    line = "+" + "-" * (width + 2) + "+" + "-" * (vwidth + 2) + "+"
    body = [f"| {k.ljust(width)} | {v.ljust(vwidth)} |" for (k, _), v in zip(rows, values)]
    return "\n".join([line, *body, line])
