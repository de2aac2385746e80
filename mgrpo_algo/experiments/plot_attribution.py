"""Figures of :mod:`mgrpo_env.attribution`'s held-out figures (``summary.json``'s ``attribution``): which role
lost the answers, start vs after, per mode.

A bar is a column of :func:`columns`: the start once where every mode started from the same models (the
hierarchy's modes share their start evaluation, so their start figures are equal), else per mode, then each
mode after RL.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mgrpo_env.attribution import OUTCOMES

__all__ = ["LOST_CAUSES", "columns", "lost_by_role", "attribution_bars"]

#: The held-out answers lost, by role and cause (outcome key, label, colour: the main agent's in blues,
#: the sub-agents' in oranges). "no answer" (the main agent ended without one) is named above each bar.
LOST_CAUSES: tuple[tuple[str, str, str], ...] = (
    ("outcome/main_not_asked", "main: never asked a needed hop", "#1f4e79"),
    ("outcome/main_combine", "main: failed to combine right reports", "#6fa8dc"),
    ("outcome/sub_wrong", "sub-agents: reported a hop wrong", "#b45f06"),
    ("outcome/sub_no_result", "sub-agents: no result", "#f6b26b"),
)
OUTCOME_LABELS = {"right": "right", "no_answer": "no answer (main)", "main_combine": "failed to combine (main)",
                  "main_not_asked": "never asked a hop (main)", "sub_wrong": "reported wrong (sub)",
                  "sub_no_result": "no result (sub)"}
DELEGATION_LABELS = (("delegation/asks_hop", "delegations asking a needed hop"),
                     ("delegation/other_relation", "... another relation"),
                     ("delegation/other_entity", "... another entity"),
                     ("exact_hop/right", "hop asked exactly: reported right"),
                     ("exact_hop/no_result", "hop asked exactly: no result"))


def columns(attribution: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, Mapping[str, Any]]]:
    """(label, rates) per bar: the start once when every mode's start rates are equal, else each mode's
    start, then each mode after RL.

    >>> same = {"right": 0.1}
    >>> [name for name, _ in columns({"a": {"start": same, "after": {}}, "b": {"start": same, "after": {}}})]
    ['start', 'a after', 'b after']
    """
    starts = [a["start"] for a in attribution.values()]
    shared = all(s == starts[0] for s in starts)
    out: list[tuple[str, Mapping[str, Any]]] = [("start", starts[0])] if shared else [
        (f"{mode} start", a["start"]) for mode, a in attribution.items()]
    return out + [(f"{mode} after", a["after"]) for mode, a in attribution.items()]


def _pct(value: Any) -> float:
    return 0.0 if value is None else float(value) * 100


def lost_by_role(ax: Any, attribution: Mapping[str, Mapping[str, Any]]) -> None:
    """Stacked bars: the share of held-out answers each role lost, by cause (:data:`LOST_CAUSES`), per
    column; above each bar the answers right and those never given."""
    cols = columns(attribution)
    x = list(range(len(cols)))
    bottom = [0.0] * len(cols)
    for key, label, color in LOST_CAUSES:
        values = [_pct(rates.get(key)) for _, rates in cols]
        bars = ax.bar(x, values, bottom=bottom, color=color, label=label, width=0.6)
        ax.bar_label(bars, labels=[f"{v:.0f}" if v >= 4 else "" for v in values], label_type="center",
                     color="white" if color.startswith("#1") or color.startswith("#b") else "black", fontsize=11)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    for i, (_, rates) in enumerate(cols):
        ax.annotate(f"right {_pct(rates.get('outcome/right')):.0f}\nno answer {_pct(rates.get('outcome/no_answer')):.0f}",
                    (i, bottom[i]), xytext=(0, 4), textcoords="offset points", ha="center", va="bottom", fontsize=10)
    ax.set_xticks(x, [name.replace(" after", "\nafter RL") for name, _ in cols])
    ax.set_ylim(0, 100)
    ax.set_ylabel("% of held-out answers")
    ax.set_title("held-out answers lost, by the role that lost them (first loss in solving order; hierarchy modes)")
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    ax.grid(axis="y", alpha=0.3)


def _color(name: str, modes: list[str]) -> str:
    """A column's colour: a mode's after in the mode's colour (as in every curve), a start in grey, the
    reference in near-black."""
    mode = name.removesuffix(" after")
    if name.endswith(" after") and mode in modes:
        return f"C{modes.index(mode)}"
    return "0.65" if name.endswith("start") and "(" not in name else "0.2"


def _grouped(ax: Any, rows: list[tuple[str, str]], cols: list[tuple[str, Mapping[str, Any]]], title: str,
             modes: list[str]) -> None:
    """Horizontal grouped bars: one group per row key, one bar per column (at most four)."""
    height = 0.8 / len(cols)
    for j, (name, rates) in enumerate(cols):
        y = [i + (j - (len(cols) - 1) / 2) * height for i in range(len(rows))]
        values = [_pct(rates.get(key)) for key, _ in rows]
        bars = ax.barh(y, values, height=height, color=_color(name, modes), label=name)
        ax.bar_label(bars, labels=[f"{v:.0f}" for v in values], padding=2, fontsize=9)
    ax.set_yticks(range(len(rows)), [label for _, label in rows])
    ax.invert_yaxis()
    ax.set_xlim(0, 105)
    ax.set_xlabel("%")
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)


def attribution_bars(plt: Any, summary: Mapping[str, Any]) -> Any:
    """The attribution in detail (a figure): every outcome, the delegations and the reports of exactly asked
    hops, and the answers right per question kind; the columns of :func:`columns` and the reference start
    (``eval.reference``, where evaluated)."""
    cols = columns(summary["attribution"])
    reference = (summary.get("reference") or {}).get("attribution")
    if reference:
        cols.append((f"{summary['reference'].get('name', 'reference')} (start)", reference))
    kinds = sorted({key.split("/")[1] for _, rates in cols for key in rates
                    if key.startswith("outcome/") and key.count("/") == 2})
    modes = list(summary["modes"])
    fig, axes = plt.subplots(1, 3, figsize=(17, 6))
    _grouped(axes[0], [(f"outcome/{o}", OUTCOME_LABELS.get(o, o)) for o in OUTCOMES], cols, "held-out outcomes (%)",
             modes)
    _grouped(axes[1], list(DELEGATION_LABELS), cols, "delegations and exactly asked hops (%)", modes)
    _grouped(axes[2], [(f"outcome/{kind}/right", kind) for kind in kinds], cols, "answers right per question kind (%)",
             modes)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper right", ncol=len(labels))
    fig.suptitle("which role lost the held-out answers, in detail", x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    return fig
