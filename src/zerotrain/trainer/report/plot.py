"""One PNG of a run from its metrics.jsonl: every curve against optimizer steps (left column)
and against trained tokens (right column).

    row 1  training loss and eval loss
    row 2  learning rate
    row 3+ one row per number the engine's features logged (a curriculum's seqlen, layer
           drop's pld_theta, ...), whatever the features are
"""

from __future__ import annotations

from pathlib import Path

from .metrics_log import read_metrics

# what every training record holds; anything else numeric in one came from a feature
_STANDARD = {"step", "epoch", "tokens", "loss", "lr", "grad_norm", "tokens_per_s", "loss_scale"}


def token_label(value: float, _pos=None) -> str:
    """A tick of the tokens axis in a few characters: 0, 500, 2.5k, 20k, 1.0M, 150M, 2.0B
    (matplotlib's default prints every digit, and seven-digit ticks run into each other)."""
    for size, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            scaled = value / size
            return f"{scaled:.0f}{suffix}" if abs(scaled) >= 10 else f"{scaled:.1f}{suffix}"
    return f"{value:g}"


def _series(records: list[dict], key: str) -> tuple[list, list, list]:
    rows = [r for r in records if key in r and r[key] is not None]
    return [r["step"] for r in rows], [r.get("tokens", 0) for r in rows], [r[key] for r in rows]


def lr_axis(ax, lrs: list) -> None:
    """The LR from 0 to its peak, with plain tick labels: an axis fitted to the values, with an
    offset, makes 1.50e-4 -> 1.47e-4 fill the panel like a full decay."""
    ax.set_ylabel("learning rate")
    ax.ticklabel_format(axis="y", style="sci", scilimits=(0, 0), useOffset=False)
    top = max((v for v in lrs if v is not None), default=0.0)
    ax.set_ylim(0.0, top * 1.05 if top > 0 else 1.0)


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    from ...errors import DataError

    records = read_metrics(run_dir)
    if not any("loss" in r for r in records):
        raise DataError(f"{Path(run_dir) / 'metrics.jsonl'}: no training loss logged yet")
    out = Path(out) if out else Path(run_dir) / "plot.png"
    extra = sorted({k for r in records if "loss" in r for k, v in r.items()
                    if k not in _STANDARD and isinstance(v, (int, float)) and not isinstance(v, bool)})
    rows = 2 + len(extra)
    fig, axes = plt.subplots(rows, 2, figsize=(11, 3.2 * rows), squeeze=False)
    for col, (xi, xlabel) in enumerate(((0, "optimizer step"), (1, "tokens trained"))):
        ax = axes[0][col]
        for key, label, style in (("loss", "train loss", "-"), ("eval_loss", "eval loss", "o-")):
            s = _series(records, key)
            if s[2]:
                ax.plot(s[xi], s[2], style, label=label, markersize=3)
        ax.set_ylabel("loss")
        ax.legend()
        s = _series(records, "lr")
        axes[1][col].plot(s[xi], s[2], color="tab:green")
        lr_axis(axes[1][col], s[2])
        for row, key in enumerate(extra, start=2):
            s = _series(records, key)
            axes[row][col].plot(s[xi], s[2], color="tab:purple")
            axes[row][col].set_ylabel(key)
        for r in range(rows):
            axes[r][col].grid(alpha=0.3)
            if xi == 1:
                axes[r][col].xaxis.set_major_locator(MaxNLocator(nbins=6))
                axes[r][col].xaxis.set_major_formatter(FuncFormatter(token_label))
        axes[rows - 1][col].set_xlabel(xlabel)
    fig.suptitle(f"zerotrain run: {Path(run_dir).resolve().name}")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
