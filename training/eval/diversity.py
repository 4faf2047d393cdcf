"""Attention-pattern analysis across methods (the RouterKT paper's case study and Table 3).

For one dataset of a reproduce results directory: take each method's fold-0 checkpoint, the same
50 test learners (sampled with a fixed seed), and the attention of the LAST knowledge-retriever
layer. Then
- between methods: Spearman correlation and SSIM of the head-averaged maps, per learner, averaged;
- within a method: the mean similarity between its own heads (lower = more diverse heads);
- heatmaps of a few learners, methods side by side.
Writes OUT/<dataset>/diversity/{diversity.json, diversity.md, similarity_spearman.png,
similarity_ssim.png, heatmaps_learner<k>.png}.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from training.eval.analysis import attention_and_routing, head_similarity, pairwise_similarity


def _retriever_maps(model, seqs, rows: np.ndarray) -> list[np.ndarray] | None:
    """[H, n, n] attention of the last retriever layer for each learner, trimmed to its length;
    None for a model without attention (DKT)."""
    out = []
    for row in rows:
        maps, _ = attention_and_routing(model, seqs, np.array([row]))
        names = [k for k in maps if k.startswith("retriever")]
        if not names:
            return None
        out.append(maps[names[-1]][0])
    return out


def analyse(results: Path, dataset: str, methods: list[str], n_learners: int = 50, seed: int = 0) -> Path:
    """Compare the attention of `methods` on `dataset` (see the module's docstring); returns diversity.md."""
    results = Path(results)
    out = results / dataset / "diversity"
    out.mkdir(parents=True, exist_ok=True)
    available = [m for m in methods if (results / dataset / m / "fold-0" / "meta.json").exists()]
    if len(available) < 2:
        raise ValueError(f"need at least two finished methods in {results / dataset}, found {available}")
    per_method, rows = _method_maps(results / dataset, available, n_learners, seed)
    if len(per_method) < 2:
        raise ValueError(f"need at least two finished attention models in {results / dataset}, "
                         f"found {list(per_method)}")
    averaged = {m: [heads.mean(0) for heads in maps] for m, maps in per_method.items()}
    pairs = pairwise_similarity(averaged)
    heads = {m: head_similarity(maps) for m, maps in per_method.items()}
    names = list(averaged)
    matrices = _similarity_matrices(names, pairs, out, dataset, len(rows))
    _heatmaps(averaged, names, min(2, len(rows)), dataset, out)
    (out / "diversity.md").write_text(_table(dataset, len(rows), names, matrices, heads))
    (out / "diversity.json").write_text(json.dumps({
        "dataset": dataset, "learners": int(len(rows)), "methods": names,
        "pairwise": {f"{a}|{b}": v for (a, b), v in pairs.items()}, "heads": heads}, indent=1) + "\n")
    return out / "diversity.md"


def _method_maps(folder: Path, methods: list[str], n_learners: int,
                 seed: int) -> tuple[dict[str, list[np.ndarray]], np.ndarray]:
    """Each method's retriever maps (methods without attention left out) over the same test learners of
    fold 0 (same data, same folds), and those learners' rows."""
    from training.checkpoint import load_checkpoint
    from training.training_run import prepare
    per_method: dict[str, list[np.ndarray]] = {}
    rows = seqs = None
    for method in methods:
        ckpt = load_checkpoint(folder / method / "fold-0")
        if seqs is None:                       # the same learners for every method (same data, same folds)
            _, _, all_seqs, folds = prepare(ckpt.config)
            seqs = all_seqs.select_learners(folds[0].test)
            rng = np.random.default_rng(seed)
            candidates = np.nonzero(seqs.lengths >= 10)[0]
            rows = rng.choice(candidates, size=min(n_learners, len(candidates)), replace=False)
        maps = _retriever_maps(ckpt.model, seqs, rows)
        if maps is not None:
            per_method[method] = maps
    return per_method, rows


def _similarity_matrices(names: list[str], pairs: dict, out: Path, dataset: str,
                         learners: int) -> dict[str, np.ndarray]:
    """The methods x methods matrix of each metric (1 on the diagonal), each plotted to
    similarity_<metric>.png."""
    from training import plots
    matrices = {}
    for metric in ("spearman", "ssim"):
        mat = np.eye(len(names))
        for (a, b), v in pairs.items():
            i, j = names.index(a), names.index(b)
            mat[i, j] = mat[j, i] = v[metric]
        matrices[metric] = mat
        plots.similarity_matrix(names, mat, out / f"similarity_{metric}.png",
                                f"{dataset}: {metric} between methods' retriever attention ({learners} learners)")
    return matrices


def _heatmaps(averaged: dict[str, list[np.ndarray]], names: list[str], learners: int, dataset: str,
              out: Path) -> None:
    """heatmaps_learner<k>.png: the head-averaged map of learner k, methods side by side."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from training import plots
    for k in range(learners):
        fig, axes = plt.subplots(1, len(names), figsize=(2.6 * len(names), 2.8), squeeze=False)
        for ax, m in zip(axes[0], names):
            ax.imshow(averaged[m][k], cmap="viridis", vmin=0.0, vmax=plots.color_limit(averaged[m][k]))
            ax.set_title(m, fontsize=8)
            ax.axis("off")
        fig.suptitle(f"{dataset}: last retriever layer, head mean, test learner sample {k}", fontsize=9)
        fig.savefig(out / f"heatmaps_learner{k}.png", dpi=110, bbox_inches="tight")
        plt.close(fig)


def _table(dataset: str, learners: int, names: list[str], matrices: dict[str, np.ndarray], heads: dict) -> str:
    """diversity.md: each method's mean similarity to the others and between its own heads, then every pair."""
    lines = [f"Dataset {dataset}, {learners} test learners of fold 0, last knowledge-retriever layer.", "",
             "| method | mean Spearman to other methods | mean SSIM to other methods "
             "| Spearman between own heads | SSIM between own heads |",
             "|---|---|---|---|---|"]
    for i, m in enumerate(names):
        others = [j for j in range(len(names)) if j != i]
        lines.append(f"| {m} | {np.nanmean(matrices['spearman'][i, others]):.3f} "
                     f"| {np.mean(matrices['ssim'][i, others]):.3f} "
                     f"| {heads[m]['spearman']:.3f} | {heads[m]['ssim']:.3f} |")
    lines += ["", "Pairwise (Spearman / SSIM):", "", "| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for i, a in enumerate(names):
        lines.append(f"| {a} | " + " | ".join(f"{matrices['spearman'][i, j]:.2f} / {matrices['ssim'][i, j]:.2f}"
                                             for j in range(len(names))) + " |")
    return "\n".join(lines) + "\n"
