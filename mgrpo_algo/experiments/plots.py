"""Figures of a comparison: one headline figure, and the details by topic.

``headline.png`` (the README's first picture) is drawn from ``summary.json`` alone: per mode the held-out
mean@k at the start and after with its 95% interval, the held-out curve during RL with its bootstrap
band, and which role lost the held-out answers, start vs after. The details (:data:`DETAILS`) are one
figure per topic, each panel with one line per mode (mean over seeds) and the held-out points beside
the training ones.

The x axis of every curve is the number of updates the policy had when the number was measured:
iteration ``i``'s training metrics (collected before its update) and a held-out evaluation after
``i`` updates share the point ``i``; the warm-started start is 0.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from .plot_attribution import attribution_bars, lost_by_role

__all__ = ["Panel", "TRAINING", "ENDINGS", "MISTAKES", "DETAILS", "HEADLINE", "SMOOTH", "moving_average",
           "headline_figure", "plot_headline", "plot_panels", "write_figures"]


class Panel(NamedTuple):
    """One panel of a detail figure: the training metric (the first of ``keys`` a mode's runs logged) per
    iteration, and the held-out figure ``held_out`` (a key of an evaluation point or of its ``mistakes``)
    at the start, after, and on the curve, times ``scale``."""

    title: str
    keys: tuple[str, ...]
    held_out: str = ""
    scale: float = 100.0


#: Training reward and accuracy. Rewards are in [0, 1] like the rates, so the panels are in percent.
TRAINING: tuple[Panel, ...] = (
    Panel("training reward, main / single (%)", ("main/reward_mean", "single/reward_mean")),
    Panel("accuracy, main / single (%)", ("main/accuracy", "single/accuracy"), "em"),
    Panel("held-out F1 (%)", (), "f1"),
    Panel("sub-agent reward R_S (%)", ("sub/reward_mean",)),
    Panel("sub-agent expert score (%)", ("sub/expert_mean",)),
)
#: The format and how episodes end (format decay): malformed turns, turn limits, sub-agents out of turns.
ENDINGS: tuple[Panel, ...] = (
    Panel("format rate, main / single (%)", ("main/format_ok", "single/format_ok")),
    Panel("sub-agent format rate (%)", ("sub/format_ok",)),
    Panel("episodes with a malformed main / single turn (%)", ("mistakes/malformed_main_episodes",),
          "malformed_main_episodes"),
    Panel("episodes ended by the turn limit (%)", ("mistakes/turn_limit_episodes",), "turn_limit_episodes"),
    Panel("sub-agents without a result (%)", ("mistakes/sub_no_result",), "sub_no_result"),
)
#: The decision mistakes of :mod:`mgrpo_env.mistakes`: the mechanism, not only the score.
MISTAKES: tuple[Panel, ...] = (
    Panel("main answers early, per decision with hops left (%)", ("mistakes/answer_early",), "answer_early"),
    Panel("episodes answered early, main / single (%)", ("mistakes/answer_early_episodes",), "answer_early_episodes"),
    Panel("reports without a visit: sub-agents / single-agent hops (%)", ("mistakes/report_without_visit",),
          "report_without_visit"),
    Panel("delegations per episode", ("mistakes/delegations",), "delegations", 1.0),
)
HEADLINE = "headline.png"
#: The detail figures, in the order report.md links them: (file, what it shows).
DETAILS: tuple[tuple[str, str], ...] = (
    ("training.png", "training reward and accuracy"),
    ("endings.png", "format and how episodes end"),
    ("mistakes.png", "decision mistakes"),
    ("attribution.png", "which role lost the held-out answers, in detail"),
)
#: Iterations in the moving average of the training lines (the paper's figures smooth the same way).
SMOOTH = 5
STYLE_NOTE = ("line: training rollouts ({smooth}-iteration mean, raw values faint); squares: held-out start and after "
              "(all questions); crosses: held-out curve ({curve} questions)")


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)  # files only; never a display
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 12, "axes.titlesize": 12, "legend.fontsize": 11})
    return plt


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


def _held_out(point: Mapping[str, Any], key: str) -> float | None:
    """An evaluation point's figure: its own key (em, f1, a curve point's rates) or its ``mistakes``'."""
    value = point[key] if key in point else (point.get("mistakes") or {}).get(key)
    return None if value is None else float(value)


def _draw(ax: Any, panel: Panel, runs: Mapping[str, Sequence[Mapping[str, Any]]]) -> None:
    """One panel: per mode (colour) the training line, the held-out start and after, the curve."""
    for i, (mode, seeds) in enumerate(runs.items()):
        color = f"C{i}"
        key = next((k for k in panel.keys if any(k in h for s in seeds for h in s["history"])), None)
        if key is not None:
            series = [[(int(h["iteration"]), float(h[key]) * panel.scale) for h in s["history"] if key in h] for s in seeds]
            steps, values = _mean_by_step(series)
            ax.plot(steps, values, "-", color=color, alpha=0.2, linewidth=1)
            ax.plot(steps, moving_average(values), "-", color=color, label=mode)
        if not panel.held_out:
            continue
        for source, style in (("eval", "s--"), ("curve", "x:")):
            points = [[(p["step"], v * panel.scale) for p in s.get(source, [])
                       if (v := _held_out(p, panel.held_out)) is not None] for s in seeds]
            if any(points):
                steps, values = _mean_by_step(points)
                ax.plot(steps, values, style, color=color, markersize=7 if source == "eval" else 6,
                        label=None if key is not None or source == "curve" else mode)
    ax.set_title(panel.title)


def plot_panels(runs: Mapping[str, Sequence[Mapping[str, Any]]], panels: Sequence[Panel], path: str | Path, *,
                title: str, curve_questions: int | None = None) -> Path:
    """One detail figure: ``panels`` in rows of three, one legend entry per mode.

    ``runs[mode]`` is one dict per seed: ``history`` (the trainer's per-iteration metric dicts), ``eval``
    (start and after points ``{"step", "em", "f1", "mistakes"?}`` on the whole held-out set) and ``curve``
    (the points on ``eval.curve_limit`` questions, possibly empty).
    """
    from matplotlib.ticker import MaxNLocator

    plt = _pyplot()
    cols = min(3, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 4.2 * rows + 0.8), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[len(panels):]:
        ax.axis("off")
    for ax, panel in zip(flat, panels, strict=False):
        _draw(ax, panel, runs)
        ax.set_xlabel("updates")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylim(0, max(ax.get_ylim()[1], 1.0))  # every figure is >= 0; a flat 0 line sits on the axis
        ax.grid(alpha=0.3)
    handles, labels = flat[0].get_legend_handles_labels()
    for ax in flat[1:len(panels)]:  # the modes of every panel, once: a mode may log some metrics only
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if label not in labels:
                handles.append(h)
                labels.append(label)
    if labels:
        fig.legend(handles, labels, loc="upper right", ncol=len(labels))
    note = STYLE_NOTE.format(smooth=SMOOTH, curve=curve_questions or "the curve's")
    fig.suptitle(f"{title}\n{note}", x=0.01, ha="left", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.93 if rows > 1 else 0.86))
    return _save(fig, plt, path)


def _save(fig: Any, plt: Any, path: str | Path) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def _accuracy_panel(ax: Any, summary: Mapping[str, Any]) -> None:
    """Per mode, held-out mean@k at the start and after with 95% error bars; the reference as a band."""
    accuracy = summary.get("accuracy") or {}
    modes = list(summary["modes"])
    for i, mode in enumerate(modes):
        mean = summary["results"][mode]["mean"]
        values = [mean["before_em"] * 100, mean["after_em"] * 100]
        x = [0 + (i - (len(modes) - 1) / 2) * 0.08, 1 + (i - (len(modes) - 1) / 2) * 0.08]
        bounds = [accuracy.get(mode, {}).get(side) for side in ("start", "after")]
        if all(bounds):
            err = [[v - b["low"] * 100 for v, b in zip(values, bounds, strict=True)],
                   [b["high"] * 100 - v for v, b in zip(values, bounds, strict=True)]]
            ax.errorbar(x, values, yerr=err, fmt="o-", color=f"C{i}", capsize=5, label=mode)
        else:
            ax.plot(x, values, "o-", color=f"C{i}", label=mode)
    ref = (summary.get("reference") or {})
    band = accuracy.get("reference", {}).get("after")
    if ref.get("em") is not None:
        ax.axhline(ref["em"] * 100, color="0.4", linestyle="--", label=f"{ref.get('name', 'reference')} (start)")
        if band:
            ax.axhspan(band["low"] * 100, band["high"] * 100, color="0.6", alpha=0.15)
    k = summary.get("eval", {}).get("samples", 1)
    questions = next((a["start"]["questions"] for a in accuracy.values() if "start" in a), None)
    ax.set_xticks([0, 1], ["start", "after RL"])
    ax.set_xlim(-0.4, 1.4)
    ax.set_ylim(bottom=0)
    ax.grid(axis="y", alpha=0.3)
    ax.set_title(f"held-out mean@{k} (%), 95% interval" + (f"\n{int(questions)} questions x {k}" if questions else ""))
    ax.legend(loc="lower right")


def _curve_panel(ax: Any, summary: Mapping[str, Any]) -> None:
    """Per mode, the held-out curve (mean over seeds) with its 95% bootstrap band (mean of the seeds' bounds)."""
    for i, mode in enumerate(summary["modes"]):
        rows = summary["results"][mode]["per_seed"]
        points = [[(p["step"], p["em"] * 100) for p in r.get("curve", [])] for r in rows]
        if not any(points):
            continue
        steps, values = _mean_by_step(points)
        ax.plot(steps, values, "o-", color=f"C{i}", markersize=4, label=mode)
        lows = [[(p["step"], p["em_low"] * 100) for p in r["curve"] if "em_low" in p] for r in rows]
        highs = [[(p["step"], p["em_high"] * 100) for p in r["curve"] if "em_high" in p] for r in rows]
        if any(lows):
            at, low = _mean_by_step(lows)
            ax.fill_between(at, low, _mean_by_step(highs)[1], color=f"C{i}", alpha=0.15, linewidth=0)
    e = summary.get("eval", {})
    ax.set_title(f"held-out mean@{e.get('samples', 1)} during RL (%), 95% band\n"
                 f"{e.get('curve_limit', '?')} questions x {e.get('samples', 1)} every {e.get('every', '?')} updates")
    ax.set_xlabel("updates")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="lower right")


def plot_headline(summary: Mapping[str, Any], path: str | Path) -> Path:
    """Write :func:`headline_figure` to ``path``."""
    plt = _pyplot()
    return _save(headline_figure(summary), plt, path)


def headline_figure(summary: Mapping[str, Any]) -> Any:
    """The headline figure from a comparison's summary: held-out mean@k start and after (95% intervals),
    the held-out curve with its band, and the held-out answers lost by each role (start vs after,
    :func:`mgrpo_algo.experiments.plot_attribution.lost_by_role`; a run without attribution leaves it out).
    Its axes in that order."""
    plt = _pyplot()
    attribution = summary.get("attribution") or {}
    fig = plt.figure(figsize=(12, 9.5 if attribution else 5))
    grid = fig.add_gridspec(2 if attribution else 1, 5)
    _accuracy_panel(fig.add_subplot(grid[0, :2]), summary)
    _curve_panel(fig.add_subplot(grid[0, 2:]), summary)
    if attribution:
        lost_by_role(fig.add_subplot(grid[1, :]), attribution)
    fig.tight_layout()
    return fig


def write_figures(runs: Mapping[str, Sequence[Mapping[str, Any]]], summary: Mapping[str, Any],
                  out: str | Path) -> list[Path]:
    """Every figure of a comparison into ``out``: :data:`HEADLINE`, then :data:`DETAILS` (the attribution
    figure only where the summary has attribution). Returns the paths written."""
    out = Path(out)
    curve = summary.get("eval", {}).get("curve_limit")
    paths = [plot_headline(summary, out / HEADLINE)]
    for (name, title), panels in zip(DETAILS, (TRAINING, ENDINGS, MISTAKES), strict=False):
        paths.append(plot_panels(runs, panels, out / name, title=title, curve_questions=curve))
    if summary.get("attribution"):
        plt = _pyplot()
        paths.append(_save(attribution_bars(plt, summary), plt, out / DETAILS[3][0]))
    return paths
