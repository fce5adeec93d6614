"""Figures: the needle heatmap (depth x length), score vs length, perplexity vs length."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np

from longctx.storage import atomic


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend (imported on first use: heavy, and only
    the figures need it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(fig, path: Path) -> Path:
    """Write `fig` to `path` whole or not at all (a temporary sibling renamed; a failed write
    is one line naming the file) and close it."""
    try:
        with atomic.result_file(path) as tmp:
            fig.savefig(tmp, format="png", dpi=120)  # the temporary's name has no .png to infer it from
    finally:
        pyplot().close(fig)
    return Path(path)


def needle_heatmap(grid: dict, path: Path, title: str = "") -> Path:
    """grid = {"depths": [...], "lengths": [...], "scores": [[score per length] per depth]}."""
    plt = pyplot()

    data = np.array([[np.nan if x is None else x for x in row] for row in grid["scores"]], dtype=float)
    fig, ax = plt.subplots(figsize=(1.2 + 0.9 * len(grid["lengths"]), 1.0 + 0.42 * len(grid["depths"])))
    im = ax.imshow(data, cmap="RdYlGn", vmin=0, vmax=100, aspect="auto")
    ax.set_xticks(range(len(grid["lengths"])), [str(L) for L in grid["lengths"]])
    ax.set_yticks(range(len(grid["depths"])), [f"{d:.0%}" for d in grid["depths"]])
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("needle depth")
    for i in range(data.shape[0]):
        for j in range(data.shape[1]):
            if not np.isnan(data[i, j]):
                ax.text(j, i, f"{data[i, j]:.0f}", ha="center", va="center", fontsize=8)
    fig.colorbar(im, ax=ax, label="score")
    ax.set_title(title or "needle in a haystack")
    fig.tight_layout()
    return save_png(fig, path)


def score_curves(summary: dict, path: Path, max_position: Optional[int] = None) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, t in summary["tasks"].items():
        xs = sorted(int(L) for L in t["scores"])
        ax.plot(xs, [t["scores"][str(L)] for L in xs], marker="o", label=name)
    if summary.get("average_by_length"):
        xs = sorted(int(L) for L in summary["average_by_length"])
        ax.plot(xs, [summary["average_by_length"][str(L)] for L in xs], "k--", lw=2, label="average")
    ax.axhline(summary["threshold"], color="grey", lw=0.8, ls=":")
    if max_position:
        ax.axvline(max_position, color="red", lw=0.8, ls=":", label="max_position_embeddings")
    ax.set_xscale("log", base=2)
    ax.set_ylim(-3, 103)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("score")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return save_png(fig, path)


def ppl_curve(ppl: dict, path: Path, max_position: Optional[int] = None) -> Path:
    plt = pyplot()
    rows = ppl["rows"]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([r["length"] for r in rows], [r["ppl"] for r in rows], marker="o")
    if max_position:
        ax.axvline(max_position, color="red", lw=0.8, ls=":", label="max_position_embeddings")
        ax.legend(fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("perplexity")
    ax.set_title("perplexity vs context length")
    fig.tight_layout()
    return save_png(fig, path)
