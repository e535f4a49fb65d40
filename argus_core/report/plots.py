"""PNG figures for ``argus diagnose --plot DIR`` (matplotlib, headless Agg backend)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from argus_core.detect.diagnose import Diagnosis


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_plots(diagnosis: Diagnosis, directory: str | Path) -> list[Path]:
    """Write iteration.png, phases.png and l3_scores.png into ``directory``; return the paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    plt = _pyplot()
    paths = [_iteration(diagnosis, directory / "iteration.png", plt),
             _phase_heatmap(diagnosis, directory / "phases.png", plt),
             _l3_scores(diagnosis, directory / "l3_scores.png", plt)]
    return [p for p in paths if p is not None]


def _iteration(d: Diagnosis, path: Path, plt) -> Path:
    fig, ax = plt.subplots(figsize=(9, 3.5))
    ax.plot(d.l1.steps, d.l1.iteration_s, lw=1.2, label="iteration time (max over ranks)")
    ax.plot(d.l1.steps, d.l1.baseline_s, lw=0.8, ls="--", color="grey", label="rolling median")
    if d.l1.spikes:
        s = np.array([s for s, _ in d.l1.spikes])
        idx = np.searchsorted(d.l1.steps, s)
        ax.scatter(s, d.l1.iteration_s[idx], color="orange", zorder=3, label="spike")
    for i, (step, ratio) in enumerate(d.l1.regressions):
        ax.axvline(step, color="red", lw=1, label="regression onset" if i == 0 else None)
        ax.annotate(f"x{ratio:.2f}", (step, ax.get_ylim()[1]), color="red", va="top")
    ax.set_xlabel("step")
    ax.set_ylabel("seconds")
    finite = d.l1.iteration_s[np.isfinite(d.l1.iteration_s)]
    if len(finite) and finite.max() > 5 * finite.min():
        ax.set_yscale("log")
    ax.set_title(f"L1 iteration time, job {d.job}")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _phase_heatmap(d: Diagnosis, path: Path, plt) -> Path | None:
    fig = phase_figure(d, plt)
    if fig is None:
        return None
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def phase_figure(d: Diagnosis, plt):
    """The L2 heatmap: each rank's phase time over its group peers', on a log scale centred
    on 1x and reaching the largest ratio, so 25x and 2x do not look alike (None: no data)."""
    ratios = d.l2.ratios
    if ratios is None or ratios.size == 0:
        return None
    from matplotlib.colors import Normalize

    shown = ratios[:64]
    log_ratios = np.log2(np.clip(np.nan_to_num(shown, nan=1.0), 1 / 1024, 1024))
    reach = max(1.0, float(np.abs(log_ratios).max()))  # at least 0.5x .. 2x
    fig, ax = plt.subplots(figsize=(1.2 + 0.9 * ratios.shape[1],
                                    1.5 + 0.22 * min(len(d.matrix.ranks), 64)))
    image = ax.imshow(log_ratios, aspect="auto", cmap="RdBu_r",
                      norm=Normalize(vmin=-reach, vmax=reach))
    ax.set_xticks(range(ratios.shape[1]), d.matrix.phase_names, rotation=45, ha="right")
    ax.set_yticks(range(len(shown)), [str(r) for r in d.matrix.ranks[:64]], fontsize=7)
    ax.set_ylabel("rank")
    ax.set_title("L2 phase time / group peers' median")
    ticks = np.arange(-np.floor(reach), np.floor(reach) + 1)
    bar = fig.colorbar(image, ax=ax, shrink=0.8, ticks=ticks)
    bar.ax.set_yticklabels([f"{2.0 ** t:g}x" for t in ticks])
    fig.tight_layout()
    return fig


def _l3_scores(d: Diagnosis, path: Path, plt) -> Path | None:
    s = d.scores
    if s is None or len(s) == 0 or not np.isfinite(s.score).any():
        return None
    fig, ax = plt.subplots(figsize=(9, 3.5))
    finite = np.isfinite(s.score)
    ax.scatter(s.rank[finite], s.score[finite], s=8, alpha=0.5, color="grey", label="rank x kernel")
    kept = {(f.rank, f.kernel, f.stream) for f in d.l3}
    final = np.array([(int(r), s.names[k], int(st)) in kept for r, k, st in
                      zip(s.rank, s.kernel, s.stream, strict=True)], dtype=bool)
    excused = s.flagged & ~final
    if excused.any():
        ax.scatter(s.rank[excused], s.score[excused], s=16, color="orange",
                   label="collective of a waiting rank (excused)")
    if final.any():
        ax.scatter(s.rank[final], s.score[final], s=22, color="red", label="straggler")
    ax.set_yscale("symlog", linthresh=0.1)
    ax.set_xlabel("rank")
    ax.set_ylabel("score (extra time vs healthy peers)")
    ax.set_title("L3 kernel scores (directional W1)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
