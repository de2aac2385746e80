"""Curves of a comparison: one PNG, one panel per quantity, one line per mode (mean over seeds).

The x axis of every panel is the number of updates the policy had when the number was measured:
iteration ``i``'s training metrics (collected before its update) and a held-out evaluation after
``i`` updates share the point ``i``; the warm-started start is 0.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["PANELS", "plot_curves"]

#: (title, metric keys tried in order: a mode plots the first one its runs logged).
PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("reward (main / single)", ("main/reward_mean", "single/reward_mean")),
    ("train accuracy (main / single)", ("main/accuracy", "single/accuracy")),
    ("sub-agent reward", ("sub/reward_mean",)),
    ("sub-agent expert score", ("sub/expert_mean",)),
)


def _mean_by_step(series: Sequence[Sequence[tuple[int, float]]]) -> tuple[list[int], list[float]]:
    """Average several (step, value) series at each step (seeds may miss a step: mean of those present)."""
    by_step: dict[int, list[float]] = defaultdict(list)
    for points in series:
        for step, value in points:
            by_step[step].append(value)
    steps = sorted(by_step)
    return steps, [sum(by_step[s]) / len(by_step[s]) for s in steps]


def plot_curves(runs: Mapping[str, Sequence[Mapping[str, Any]]], path: str | Path) -> Path:
    """Write the curves PNG.

    ``runs[mode]`` is one dict per seed: ``history`` (the trainer's per-iteration metric dicts),
    ``eval`` (before/after points ``{"step", "em", "f1"}`` on the full held-out set) and ``curve``
    (the same on ``eval.curve_limit`` questions during training, possibly empty).
    """
    import matplotlib

    matplotlib.use("Agg", force=True)  # files only; never a display
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(2, 3, figsize=(15, 8), squeeze=False)
    flat = list(axes.flat)
    for ax, (title, keys) in zip(flat, PANELS, strict=False):
        for mode, seeds in runs.items():
            key = next((k for k in keys if any(k in h for s in seeds for h in s["history"])), None)
            if key is None:
                continue
            series = [[(int(h["iteration"]), float(h[key])) for h in s["history"] if key in h] for s in seeds]
            steps, values = _mean_by_step(series)
            ax.plot(steps, values, "o-", label=f"{mode} ({key.split('/')[0]})", markersize=3)
        ax.set_title(title)
    for ax, metric in zip(flat[4:], ("em", "f1"), strict=True):
        for i, (mode, seeds) in enumerate(runs.items()):
            color = f"C{i}"
            steps, values = _mean_by_step([[(p["step"], p[metric]) for p in s["eval"]] for s in seeds])
            ax.plot(steps, values, "o-", color=color, label=f"{mode}")
            curve = [[(p["step"], p[metric]) for p in s.get("curve", [])] for s in seeds]
            if any(curve):
                steps, values = _mean_by_step(curve)
                ax.plot(steps, values, "x--", color=color, alpha=0.6, label=f"{mode} (curve subset)")
        ax.set_title(f"held-out {metric.upper()} (0 updates = warm start)")
    for ax in flat:
        ax.set_xlabel("updates")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out
