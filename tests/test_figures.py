"""The comparison's figures (mgrpo_algo.experiments.plots): what each headline panel draws, read back from the
matplotlib objects and checked against a summary made by hand; every panel has at most four series."""

from __future__ import annotations

import pytest

from mgrpo_algo.experiments.plot_attribution import LOST_CAUSES, columns
from mgrpo_algo.experiments.plots import headline_figure, plot_panels, write_figures

START = {"outcome/right": 0.10, "outcome/no_answer": 0.08, "outcome/main_not_asked": 0.55, "outcome/main_combine": 0.08,
         "outcome/sub_wrong": 0.13, "outcome/sub_no_result": 0.06, "outcome/chain/right": 0.2}
AFTER = {"outcome/right": 0.24, "outcome/no_answer": 0.01, "outcome/main_not_asked": 0.41, "outcome/main_combine": 0.12,
         "outcome/sub_wrong": 0.11, "outcome/sub_no_result": 0.11, "outcome/chain/right": 0.5}


def _interval(mean: float, low: float, high: float) -> dict:
    return {"mean": mean, "low": low, "high": high, "questions": 224.0, "confidence": 0.95}


def _curve(start: float, middle: float, end: float) -> list[dict]:
    return [{"step": s, "em": em, "em_low": em - 0.05, "em_high": em + 0.04, "f1": em, "episodes": 400.0}
            for s, em in ((0, start), (25, middle), (50, end))]


def _summary() -> dict:
    rows = {"mgrpo": (0.10, 0.24, _curve(0.10, 0.20, 0.24)), "frozen-sub": (0.10, 0.19, _curve(0.10, 0.15, 0.19)),
            "single-agent": (0.12, 0.32, _curve(0.12, 0.25, 0.32))}
    return {
        "modes": list(rows), "eval": {"samples": 4, "curve_limit": 100, "every": 25},
        "results": {m: {"mean": {"before_em": b, "after_em": a}, "per_seed": [{"curve": c}]} for m, (b, a, c) in rows.items()},
        "accuracy": {"mgrpo": {"start": _interval(0.10, 0.07, 0.13), "after": _interval(0.24, 0.20, 0.29)},
                     "frozen-sub": {"start": _interval(0.10, 0.07, 0.13), "after": _interval(0.19, 0.15, 0.23)},
                     "single-agent": {"start": _interval(0.12, 0.09, 0.15), "after": _interval(0.32, 0.27, 0.37)},
                     "reference": {"after": _interval(0.25, 0.21, 0.30)}},
        "reference": {"name": "oracle-warm-start", "em": 0.25, "attribution": START},
        "attribution": {"mgrpo": {"start": START, "after": AFTER}, "frozen-sub": {"start": START, "after": START}},
    }


def test_the_headline_draws_the_summarys_numbers_with_at_most_four_series_a_panel():
    summary = _summary()
    accuracy, curve, lost = headline_figure(summary).axes
    # start -> after per mode, the error bars from the intervals (percent)
    line, _, (segments,) = accuracy.containers[0].lines  # mgrpo's: the first drawn
    assert list(line.get_ydata()) == pytest.approx([10.0, 24.0])
    assert [tuple(s[:, 1]) for s in segments.get_segments()] == [pytest.approx((7.0, 13.0)), pytest.approx((20.0, 29.0))]
    assert accuracy.get_legend_handles_labels()[1] == ["oracle-warm-start (start)", "mgrpo", "frozen-sub", "single-agent"]
    # the curve: each mode's points, and its band from em_low to em_high at every step
    # the curve: one line and one band a mode, three series (the target: at most four a panel; the other two
    # panels' four legend entries are checked exactly below)
    assert curve.get_legend_handles_labels()[1] == ["mgrpo", "frozen-sub", "single-agent"]
    assert len(curve.get_lines()) == 3 and len(curve.collections) == 3
    lines = {ln.get_label(): ln for ln in curve.get_lines()}
    assert list(lines["single-agent"].get_ydata()) == pytest.approx([12.0, 25.0, 32.0])
    band = curve.collections[2].get_paths()[0].vertices  # single-agent's: the third band drawn
    for step, em in ((0, 12.0), (25, 25.0), (50, 32.0)):
        ys = band[band[:, 0] == step][:, 1]
        assert min(ys) == pytest.approx(em - 5.0) and max(ys) == pytest.approx(em + 4.0)
    # lost by role: the start once (both hierarchy modes share it), then each mode after; one series a cause
    assert [t.get_text() for t in lost.get_xticklabels()] == ["start", "mgrpo\nafter RL", "frozen-sub\nafter RL"]
    heights = [round(p.get_height(), 6) for p in lost.patches]
    causes = ("outcome/main_not_asked", "outcome/main_combine", "outcome/sub_wrong", "outcome/sub_no_result")
    assert heights == [55.0, 41.0, 55.0, 8.0, 12.0, 8.0, 13.0, 11.0, 13.0, 6.0, 11.0, 6.0]  # START, AFTER, START per cause
    assert [key for key, _, _ in LOST_CAUSES] == list(causes)
    assert lost.get_legend_handles_labels()[1] == [
        "main: never asked a needed hop", "main: failed to combine right reports", "sub-agents: reported a hop wrong",
        "sub-agents: no result"]


def test_columns_keep_each_start_when_the_modes_started_apart():
    apart = {"a": {"start": {"outcome/right": 0.1}, "after": {}}, "b": {"start": {"outcome/right": 0.2}, "after": {}}}
    assert [name for name, _ in columns(apart)] == ["a start", "b start", "a after", "b after"]


def test_a_detail_panel_has_one_legend_entry_per_mode_and_its_held_out_points(tmp_path):
    runs = {"mgrpo": [{"history": [{"iteration": i, "main/accuracy": 0.1 * i} for i in range(3)],
                       "eval": [{"step": 0, "em": 0.1}, {"step": 3, "em": 0.3}], "curve": _curve(0.1, 0.2, 0.3)}],
            "single-agent": [{"history": [{"iteration": i, "single/accuracy": 0.2} for i in range(3)],
                              "eval": [{"step": 0, "em": 0.2}, {"step": 3, "em": 0.2}], "curve": []}]}
    from mgrpo_algo.experiments.plots import TRAINING

    path = plot_panels(runs, TRAINING[1:2], tmp_path / "acc.png", title="t")
    assert path.read_bytes()[:4] == b"\x89PNG"
    paths = write_figures(runs, {**_summary(), "modes": ["mgrpo", "single-agent"]}, tmp_path)
    assert [p.name for p in paths] == ["headline.png", "training.png", "endings.png", "mistakes.png", "attribution.png"]
