"""PNG plots written beside the JSON data they show: training curves, attention heatmaps per head,
router head usage, and grouped bar charts (throughput). matplotlib with the Agg backend only."""
from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def _save(fig, png: Path, data: object) -> Path:
    png = Path(png)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110, bbox_inches="tight")
    plt.close(fig)
    png.with_suffix(".json").write_text(json.dumps(data, indent=1, default=float) + "\n")
    return png


def training_curves(run: Path) -> Path | None:
    """run/plots/training_curves.png: training loss and validation AUC per epoch, one line per fold."""
    run = Path(run)
    histories = {p.parent.name: json.loads(p.read_text()) for p in sorted(run.glob("fold-*/history.json"))}
    if not histories:
        return None
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    for fold, rows in histories.items():
        epochs = [r["epoch"] for r in rows]
        ax1.plot(epochs, [r.get("train_bce", math.nan) for r in rows], label=fold)
        ax2.plot(epochs, [r.get("valid_auc", math.nan) for r in rows], label=fold)
    ax1.set(xlabel="epoch", ylabel="training BCE", title="training loss")
    ax2.set(xlabel="epoch", ylabel="AUC", title="validation AUC")
    ax2.legend(fontsize=7)
    fig.suptitle(run.name)
    return _save(fig, run / "plots" / "training_curves.png", histories)


def color_limit(attention: np.ndarray) -> float:
    """Upper colour limit: the 98th percentile of the non-zero weights, so the first rows (a few keys,
    large weights) do not wash out the rest of the map."""
    nonzero = attention[attention > 0]
    return float(np.percentile(nonzero, 98)) if nonzero.size else 1.0


def attention_heatmaps(heads: np.ndarray, title: str, png: Path) -> Path:
    """heads: [H, L, L] attention of one learner in one layer (row = query, column = key)."""
    H = heads.shape[0]
    cols = min(H, 4)
    rows = math.ceil(H / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.6 * cols, 2.5 * rows), squeeze=False)
    for h in range(rows * cols):
        ax = axes[h // cols][h % cols]
        ax.axis("off")
        if h < H:
            ax.imshow(heads[h], cmap="viridis", vmin=0.0, vmax=color_limit(heads[h]))
            ax.set_title(f"head {h}", fontsize=8)
    fig.suptitle(title, fontsize=9)
    return _save(fig, png, {"title": title, "attention": heads.round(5).tolist()})


def router_usage(weights: list[np.ndarray], valid: np.ndarray, png: Path, title: str = "router head usage") -> Path:
    """weights: per routed layer [n, L, E]; valid: [n, L] bool. Mean weight of each expert per layer."""
    usage = np.array([(w * valid[..., None]).sum((0, 1)) / max(valid.sum(), 1) for w in weights])   # [layers, E]
    fig, ax = plt.subplots(figsize=(1 + 0.6 * usage.shape[1], 0.6 + 0.45 * usage.shape[0]))
    im = ax.imshow(usage, cmap="magma", vmin=0.0, vmax=1.0, aspect="auto")
    ax.set(xlabel="head (shared first)", ylabel="routed layer", title=title)
    for (i, j), v in np.ndenumerate(usage):
        ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7, color="white" if v < 0.6 else "black")
    fig.colorbar(im, ax=ax)
    return _save(fig, png, {"mean_weight": usage.round(4).tolist()})


def grouped_bars(values: dict[str, dict[str, float]], png: Path, ylabel: str, title: str,
                 errors: dict[str, dict[str, float]] | None = None) -> Path:
    """values[group][series] -> one bar; groups on the x axis (e.g. level -> preset -> samples/s)."""
    groups = list(values)
    series = list(dict.fromkeys(s for g in groups for s in values[g]))
    width = 0.8 / max(len(series), 1)
    fig, ax = plt.subplots(figsize=(1.5 + 1.6 * len(groups), 3.6))
    for k, name in enumerate(series):
        xs = [i + k * width for i in range(len(groups))]
        ys = [values[g].get(name, 0.0) for g in groups]
        err = [(errors or {}).get(g, {}).get(name, 0.0) for g in groups] if errors else None
        ax.bar(xs, ys, width, label=name, yerr=err, capsize=2)
    ax.set_xticks([i + width * (len(series) - 1) / 2 for i in range(len(groups))], groups)
    ax.set(ylabel=ylabel, title=title)
    ax.legend(fontsize=7, ncol=min(len(series), 5), loc="upper center", bbox_to_anchor=(0.5, -0.1), frameon=False)
    return _save(fig, png, {"values": values, "errors": errors})


def similarity_matrix(names: list[str], matrix: np.ndarray, png: Path, title: str) -> Path:
    fig, ax = plt.subplots(figsize=(1.5 + 0.8 * len(names), 1.2 + 0.7 * len(names)))
    im = ax.imshow(matrix, cmap="coolwarm", vmin=-1.0, vmax=1.0)
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    for (i, j), v in np.ndenumerate(matrix):
        if np.isfinite(v):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7)
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax)
    return _save(fig, png, {"names": names, "matrix": np.where(np.isfinite(matrix), matrix, None).tolist()})
