"""Figures rendered from run histories (PNG, matplotlib's Agg backend: no display needed)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402


def _part(record: dict) -> str:
    """Which part of a run an epoch record belongs to: train (the first session), retrain (a later one), finetune."""
    if record.get("stage") == "train":
        return "retrain" if record.get("session", 1) > 1 else "train"
    return str(record.get("stage"))


def plot_validation_curves(series: list[tuple[str, str | None, list[dict]]], path: Path, title: str,
                           show_train: bool = False) -> Path | None:
    """Validation PPL against epoch for each run, one panel per group (cf. Inan et al. 2017, Fig. 2).

    ``series``: (label, group, history) with history the per-epoch records of a run; the epochs of a
    finetuning stage continue the axis after the training stage, drawn dashed, and so do those of a re-training
    session (``trainer.retrain_sessions``: Inan et al. 2017, footnote 5), drawn dotted. ``show_train``: the training
    PPL too, faint, in the same colour and style.
    """
    series = [s for s in series if s[2]]
    if not series:
        return None
    groups = list(dict.fromkeys(g for _, g, _ in series))
    fig, axes = plt.subplots(1, len(groups), figsize=(5.2 * len(groups), 4), squeeze=False)
    for ax, group in zip(axes[0], groups):
        for k, (label, g, history) in enumerate(series):
            if g != group:
                continue
            color = f"C{k % 10}"
            for part, style in (("train", "-"), ("retrain", ":"), ("finetune", "--")):
                points = [(i + 1, h["valid_ppl"]) for i, h in enumerate(history) if _part(h) == part]
                if points:
                    xs, ys = zip(*points)
                    ax.plot(xs, ys, style, marker=".", color=color, label=label if part == "train" else None, lw=1.6)
                train = [(i + 1, h["train_ppl"]) for i, h in enumerate(history)
                         if _part(h) == part and isinstance(h.get("train_ppl"), (int, float))]
                if show_train and train:  # the training PPL, faint: the gap to validation shows overfitting
                    xs, ys = zip(*train)
                    ax.plot(xs, ys, style, color=color, alpha=0.35, lw=1.0)
        ax.set_yscale("log")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("epoch")
        ax.set_ylabel("perplexity: validation (faint: training)" if show_train else "validation perplexity")
        if group:
            ax.set_title(group, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        parts = {_part(h) for _, _, hist in series for h in hist}
        legend_title = "; ".join(t for p, t in (("retrain", "dotted: re-training"), ("finetune", "dashed: finetuning"))
                                 if p in parts)
        ax.legend(fontsize=8, title=legend_title or None, title_fontsize=7)
    fig.suptitle("\n".join(textwrap.wrap(title, width=max(40, 60 * len(groups)))), fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
