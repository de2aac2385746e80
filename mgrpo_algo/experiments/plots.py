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

__all__ = ["PANELS", "MISTAKE_PANELS", "SMOOTH", "moving_average", "plot_curves"]

#: (title, metric keys tried in order: a mode plots the first one its runs logged). Rewards are in
#: [0, 1] like the rates, so every panel is in percent.
PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("training reward, main / single (%)", ("main/reward_mean", "single/reward_mean")),
    ("training accuracy, main / single (%)", ("main/accuracy", "single/accuracy")),
    ("format rate, main / single (%)", ("main/format_ok", "single/format_ok")),
    ("sub-agent reward R_S (%)", ("sub/reward_mean",)),
    ("sub-agent expert score (%)", ("sub/expert_mean",)),
    ("sub-agent format rate (%)", ("sub/format_ok",)),
)
#: The mechanism, not only the score: the decision mistakes of :mod:`mgrpo_env.mistakes` per
#: iteration (training rollouts), with the held-out rate before and after as large markers.
#: (title, training metric keys, held-out key in an eval point's ``mistakes``, scale).
MISTAKE_PANELS: tuple[tuple[str, tuple[str, ...], str, float], ...] = (
    ("main answers early, per decision with hops left (%)", ("mistakes/answer_early",), "answer_early", 100.0),
    ("episodes answered early, main / single (%)", ("mistakes/answer_early_episodes",), "answer_early_episodes", 100.0),
    ("reports without a visit: sub-agents / single-agent hops (%)", ("mistakes/report_without_visit",), "report_without_visit", 100.0),
    ("delegations per episode", ("mistakes/delegations",), "delegations", 1.0),
    # how episodes end (format decay): the main agent's malformed turns and sub-agents out of turns
    ("episodes with a malformed main / single turn (%)", ("mistakes/malformed_main_episodes",), "malformed_main_episodes", 100.0),
    ("sub-agents without a result (%)", ("mistakes/sub_no_result",), "sub_no_result", 100.0),
)
#: Iterations in the moving average of the training panels (the paper's figures smooth the same way).
SMOOTH = 5


def _mean_by_step(series: Sequence[Sequence[tuple[int, float]]]) -> tuple[list[int], list[float]]:
    """Average several (step, value) series at each step (seeds may miss a step: mean of those present)."""
    by_step: dict[int, list[float]] = defaultdict(list)
    for points in series:
        for step, value in points:
            by_step[step].append(value)
    steps = sorted(by_step)
    return steps, [sum(by_step[s]) / len(by_step[s]) for s in steps]


def moving_average(values: Sequence[float], window: int = SMOOTH) -> list[float]:
    """Trailing moving average: point i is the mean of values[max(0, i - window + 1) : i + 1]."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    out = []
    for i in range(len(values)):
        part = values[max(0, i - window + 1): i + 1]
        out.append(sum(part) / len(part))
    return out


def plot_curves(runs: Mapping[str, Sequence[Mapping[str, Any]]], path: str | Path) -> Path:
    """Write the curves PNG: six training panels (moving average over :data:`SMOOTH` iterations, the
    raw values faint behind), the held-out accuracy (mean@k) after 0, ..., N updates, and the decision
    mistakes (:data:`MISTAKE_PANELS`: per iteration, and held-out before and after).

    ``runs[mode]`` is one dict per seed: ``history`` (the trainer's per-iteration metric dicts),
    ``eval`` (before/after points ``{"step", "em", "f1", "mistakes"?}`` on the full held-out set) and ``curve``
    (the same on ``eval.curve_limit`` questions during training, possibly empty).
    """
    import matplotlib

    matplotlib.use("Agg", force=True)  # files only; never a display
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    rows = -(-(8 + len(MISTAKE_PANELS)) // 4)  # six training panels, two held-out ones, then the mistakes
    fig, axes = plt.subplots(rows, 4, figsize=(20, 4 * rows), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[8 + len(MISTAKE_PANELS):]:
        ax.axis("off")
    for ax, (title, keys, held_out, scale) in zip(flat[8:], MISTAKE_PANELS, strict=False):
        for i, (mode, seeds) in enumerate(runs.items()):
            key = keys[0]
            series = [[(int(h["iteration"]), float(h[key]) * scale) for h in s["history"] if key in h] for s in seeds]
            if any(series):
                steps, values = _mean_by_step(series)
                ax.plot(steps, values, "-", color=f"C{i}", alpha=0.25, linewidth=1)
                ax.plot(steps, moving_average(values), "-", color=f"C{i}", label=f"{mode} (training)")
            points = [[(p["step"], float(p["mistakes"][held_out]) * scale) for p in s["eval"]
                       if (p.get("mistakes") or {}).get(held_out) is not None] for s in seeds]
            if any(points):
                steps, values = _mean_by_step(points)
                ax.plot(steps, values, "s--", color=f"C{i}", markersize=8, label=f"{mode} (held-out)")
            curve = [[(p["step"], float(p[held_out]) * scale) for p in s.get("curve", []) if p.get(held_out) is not None]
                     for s in seeds]
            if any(curve):
                steps, values = _mean_by_step(curve)
                ax.plot(steps, values, "x:", color=f"C{i}", alpha=0.7, label=f"{mode} (held-out curve subset)")
        ax.set_title(title)
    for ax, (title, keys) in zip(flat, PANELS, strict=False):
        for i, (mode, seeds) in enumerate(runs.items()):
            key = next((k for k in keys if any(k in h for s in seeds for h in s["history"])), None)
            if key is None:
                continue
            series = [[(int(h["iteration"]), float(h[key]) * 100) for h in s["history"] if key in h] for s in seeds]
            steps, values = _mean_by_step(series)
            ax.plot(steps, values, "-", color=f"C{i}", alpha=0.25, linewidth=1)
            ax.plot(steps, moving_average(values), "-", color=f"C{i}", label=f"{mode} ({key.split('/')[0]})")
        ax.set_title(title)
    for ax, metric in zip(flat[6:8], ("em", "f1"), strict=True):
        for i, (mode, seeds) in enumerate(runs.items()):
            color = f"C{i}"
            steps, values = _mean_by_step([[(p["step"], p[metric] * 100) for p in s["eval"]] for s in seeds])
            ax.plot(steps, values, "o-", color=color, label=f"{mode}")
            curve = [[(p["step"], p[metric] * 100) for p in s.get("curve", [])] for s in seeds]
            if any(curve):
                steps, values = _mean_by_step(curve)
                ax.plot(steps, values, "x--", color=color, alpha=0.6, label=f"{mode} (curve subset)")
        label = "accuracy (mean@k)" if metric == "em" else "F1"
        ax.set_title(f"held-out {label} (%), 0 updates = warm start")
    for ax in flat:
        ax.set_xlabel("updates")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out
