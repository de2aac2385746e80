"""The comparison's report: the table, the checks computed from intervals, report.md.

Every figure comes from ``summary.json`` (written by :func:`mgrpo_algo.experiments.compare.run_compare`);
nothing here runs a model. Accuracy is **mean@k** (share correct over ``eval.samples`` samples per
question, averaged over questions; with one greedy sample it is plain EM), greedy EM beside it when
the evaluation samples. A check passes only when the lower bound of its paired 95% bootstrap interval
clears the target (:mod:`mgrpo_algo.experiments.intervals`), so a lucky ordering is not read as a result.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from mgrpo_env.tool_health import backend_failure_line

from ..core.modes import MODES
from .percent import interval_text
from .percent import pct as _pct
from .plots import DETAILS, HEADLINE
from .report_attribution import attribution_checks, attribution_section

__all__ = ["DIFFERENCES", "differences", "format_table", "verdict", "markdown", "history_means", "interval_text",
           "mistake_checks", "MISTAKE_NAMES", "ending_checks", "ENDING_NAMES"]


def differences(modes: Sequence[str] | None = None) -> tuple[tuple[str, str, str], ...]:
    """The differences whose paired intervals the report shows, (name, minuend, subtrahend), read
    from the mode table (``mgrpo_algo.core.modes.MODES``): each mode's after - start ("start" is the
    mode's own start evaluation), then each mode against its ``compare_to``, then M-GRPO against the
    ``eval.reference`` start ("reference", when one is evaluated)."""
    names = MODES.names() if modes is None else tuple(modes)
    own = tuple((f"{m}: after - start", m, "start") for m in names)
    pairs = tuple((f"after: {m} - {MODES[m].compare_to}", m, MODES[m].compare_to)
                  for m in names if m in MODES and MODES[m].compare_to)
    return own + pairs + (("after: mgrpo - reference", "mgrpo", "reference"),)


#: The differences of the registered modes at import (a mode registered later: call :func:`differences`).
DIFFERENCES = differences()


def _pm(stats: Mapping[str, Mapping[str, float]], key: str, sign: bool = False) -> str:
    mean = stats["mean"].get(key)
    if mean is None or math.isnan(mean):
        return "-"
    return f"{_pct(mean, sign)} ± {stats['std'][key] * 100:.1f}"


def format_table(summary: Mapping[str, Any]) -> str:
    """The markdown table: mean@k (percent, mean ± population std over seeds), the paired interval of
    after - start pooled over seeds, greedy EM, the start's pass@k, rollouts, rollouts per minute, minutes."""
    k = int(summary.get("eval", {}).get("samples", 1))
    intervals = summary.get("intervals", {})
    lines = [
        f"| mode | start mean@{k} | after mean@{k} | Δ [95% CI] | start greedy | after greedy | start pass@{k} "
        "| rollouts | rollouts/min | minutes |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for mode, r in summary["results"].items():
        m = r["mean"]
        minutes = (m["train_seconds"] + m["eval_seconds"]) / 60
        per_min = m.get("rollouts_per_minute")
        lines.append(
            f"| {mode} | {_pm(r, 'before_em')} | {_pm(r, 'after_em')} | {interval_text(intervals.get(f'{mode}: after - start'))} "
            f"| {_pm(r, 'before_greedy')} | {_pm(r, 'after_greedy')} | {_pm(r, 'before_pass_k')} | {m['rollouts']:.0f} "
            f"| {'-' if per_min is None else f'{per_min:.0f}'} | {minutes:.1f} |"
        )
    return "\n".join(lines)


def _interval_check(intervals: Mapping[str, Any], name: str, check: str, target: float = 0.0,
                    point_target: float | None = None) -> dict[str, Any]:
    """Pass when the interval's lower bound is above ``target`` (and, with ``point_target``, the point
    estimate reaches it); None when the difference was not computed (a mode not run)."""
    iv = intervals.get(name)
    if not iv:
        return {"check": check, "passed": None, "figures": "not run"}
    passed = iv["low"] > target and (point_target is None or iv["diff"] >= point_target)
    n = int(iv["questions"])
    return {"check": check, "passed": bool(passed),
            "figures": f"{interval_text(iv)} points, {n} questions, {iv['confidence'] * 100:.0f}% paired bootstrap"}


def verdict(summary: Mapping[str, Any], rise_points: float = 10.0) -> dict[str, Any]:
    """The checks of the comparison, each computed from its paired interval (see the module docstring).

    ``rise_held``: M-GRPO's after - start is >= ``rise_points`` and its interval is above 0.
    ``order_held``: the intervals of mgrpo - frozen-sub and frozen-sub - single-agent are both above 0.
    Either is None where a mode the claim needs was not run.
    """
    intervals = summary.get("intervals", {})
    results = summary["results"]
    k = int(summary.get("eval", {}).get("samples", 1))
    rise = _interval_check(intervals, "mgrpo: after - start",
                           f"M-GRPO's held-out mean@{k} rises >= {rise_points:.0f} points over its start, 95% interval above 0",
                           point_target=rise_points / 100)
    above = _interval_check(intervals, "after: mgrpo - frozen-sub", f"after training, mgrpo > frozen-sub in mean@{k} (interval above 0)")
    below = _interval_check(intervals, "after: frozen-sub - single-agent",
                            f"after training, frozen-sub > single-agent in mean@{k} (interval above 0)")
    checks = [rise, above, below, _delegation_check(results), *mistake_checks(summary), *ending_checks(summary),
              *_reference_checks(summary), *attribution_checks(summary)]
    order_held = None if None in (above["passed"], below["passed"]) else bool(above["passed"] and below["passed"])
    sentences = []
    if rise["passed"] is not None:
        sentences.append(f"M-GRPO's held-out mean@{k} changed by {interval_text(intervals['mgrpo: after - start'])} points "
                         f"(after - start, 95% interval) over its start, so the +{rise_points:.0f} point rise "
                         f"{'held' if rise['passed'] else 'did not hold'}.")
    if order_held is not None:
        sentences.append(f"The order mgrpo > frozen-sub > single-agent {'held' if order_held else 'did not hold'} "
                         f"(mgrpo - frozen-sub {interval_text(intervals['after: mgrpo - frozen-sub'])}, frozen-sub - "
                         f"single-agent {interval_text(intervals['after: frozen-sub - single-agent'])} points).")
    return {"order_held": order_held, "rise_held": rise["passed"], "checks": checks, "text": " ".join(sentences)}


#: The mistake kinds the checks read (mgrpo_env.mistakes), with the words the report uses for them.
MISTAKE_NAMES = {
    "answer_early": "main answers early (per decision with hops left)",
    "answer_early_episodes": "episodes answered early (main / single)",
    "report_without_visit": "reports without a visit (sub-agents / single-agent hops)",
}
#: Which side of the hierarchy makes each kind: frozen-sub cannot train the "sub" ones away.
MISTAKE_SIDE = {"answer_early": "main", "answer_early_episodes": "main", "report_without_visit": "sub"}


def _change_text(change: Mapping[str, float] | None) -> str:
    return "n/a" if not change else interval_text(change)


def mistake_checks(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The mechanism: each mistake rate falls under M-GRPO (interval below 0), and the sub-agents'
    falls not under frozen-sub (its interval is not below 0). None where a mode was not run."""
    mistakes = summary.get("mistakes") or {}
    checks = []
    for kind in ("answer_early", "report_without_visit"):
        change = (mistakes.get("mgrpo") or {}).get("change", {}).get(kind)
        check = f"under M-GRPO, held-out '{MISTAKE_NAMES[kind]}' falls (interval below 0)"
        checks.append({"check": check, "passed": None if not change else bool(change["high"] < 0),
                       "figures": "not run" if not change else f"{_change_text(change)} points"})
    change = (mistakes.get("frozen-sub") or {}).get("change", {}).get("report_without_visit")
    checks.append({"check": "under frozen-sub, the sub-agents' 'reports without a visit' does not fall (interval not below 0)",
                   "passed": None if not change else bool(change["high"] >= 0),
                   "figures": "not run" if not change else f"{_change_text(change)} points"})
    return checks


#: How episodes end (mgrpo_env.mistakes.ENDING_RATE_KEYS), with the words the report uses for them.
ENDING_NAMES = {
    "malformed_main_episodes": "episodes with a malformed main / single turn",
    "malformed_main_turns": "malformed main / single turns",
    "malformed_sub_turns": "malformed sub-agent turns",
    "sub_no_result": "sub-agents without a result (out of turns)",
    "turn_limit_episodes": "episodes ending at the main / single turn limit",
    "answered_accuracy": "accuracy of the answered episodes",
}


def ending_checks(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Format kept: under M-GRPO the held-out share of episodes with a malformed main turn, and of
    sub-agents without a result, do not rise (the change's interval is not above 0). None where M-GRPO
    was not run."""
    change = ((summary.get("mistakes") or {}).get("mgrpo") or {}).get("change", {})
    checks = []
    for kind in ("malformed_main_episodes", "sub_no_result"):
        c = change.get(kind)
        checks.append({"check": f"under M-GRPO, held-out '{ENDING_NAMES[kind]}' does not rise (interval not above 0)",
                       "passed": None if not c else bool(c["low"] <= 0),
                       "figures": "not run" if not c else f"{_change_text(c)} points"})
    return checks


def _endings_section(summary: Mapping[str, Any]) -> list[str]:
    """Each mode's held-out endings at the start and after RL (per role), with the change's interval."""
    rows = []
    for mode, m in (summary.get("mistakes") or {}).items():
        for kind, name in ENDING_NAMES.items():
            start, after = (m.get("start") or {}).get(kind), (m.get("after") or {}).get(kind)
            if start is None and after is None:
                continue
            rows.append(f"| {mode} | {name} | {_pct(start)} | {_pct(after)} | {_change_text((m.get('change') or {}).get(kind))} |")
    if not rows:
        return []
    return ["## How held-out episodes end", "",
            "Format, not decisions: malformed turns per role, sub-agents that ran out of turns without a result, "
            "episodes that never answered, and how often an answered episode was right. Counted and compared "
            "as the mistakes above (after - start, paired interval over questions, points).", "",
            "| mode | rate | start | after | change [95% CI] |", "|---|---|---:|---:|---|", *rows, ""]


def _reference_checks(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """M-GRPO after RL against the reference start (``eval.reference``, e.g. the oracle clone)."""
    reference = summary.get("reference")
    diff = (summary.get("intervals") or {}).get("after: mgrpo - reference")
    if not reference or not diff:
        return []
    k = int(summary.get("eval", {}).get("samples", 1))
    return [{"check": f"after RL, M-GRPO's mean@{k} is above the reference start's ({reference['name']}: "
                      f"{reference['mean_k'] * 100:.1f}) (interval above 0)",
             "passed": bool(diff["low"] > 0), "figures": f"{interval_text(diff)} points"}]


def _mistakes_section(summary: Mapping[str, Any]) -> list[str]:
    """Each mode's held-out mistake rates at the start and after RL, with the change's interval."""
    mistakes = summary.get("mistakes") or {}
    rows = []
    for mode, m in mistakes.items():
        for kind, name in MISTAKE_NAMES.items():
            start, after = (m.get("start") or {}).get(kind), (m.get("after") or {}).get(kind)
            if start is None and after is None:
                continue
            rows.append(f"| {mode} | {name} | {_pct(start)} | {_pct(after)} | {_change_text((m.get('change') or {}).get(kind))} |")
        start, after = (m.get("start") or {}).get("delegations"), (m.get("after") or {}).get("delegations")
        if start is not None:
            rows.append(f"| {mode} | delegations per episode | {start:.2f} | {after:.2f} | |")
    if not rows:
        return []
    return ["## Decision mistakes (held-out)", "",
            "What RL should remove from a start cloned from an imperfect teacher (`mgrpo_env.mistakes`): the "
            "main agent answering with hops left, and reports made without visiting a page. Rates over every "
            "held-out sample, pooled over seeds; the change is after - start with a paired bootstrap interval "
            "over questions (points). Frozen-sub cannot train its sub-agents, so their rate should stay.", "",
            "| mode | mistake | start | after | change [95% CI] |", "|---|---|---:|---:|---|", *rows, ""]


def _delegation_check(results: Mapping[str, Any]) -> dict[str, Any]:
    """The hierarchy's main agent delegates during RL (else M-GRPO and frozen-sub are the same run)."""
    check = "the main agent delegates during RL (mean sub-agents per rollout d_k > 0)"
    rows = [r for m in ("mgrpo", "frozen-sub") if m in results for r in results[m].get("per_seed", [])]
    if not rows:
        return {"check": check, "passed": None, "figures": "no hierarchy mode was run"}
    d_k = statistics.fmean(r.get("d_k_mean", 0.0) for r in rows)
    return {"check": check, "passed": d_k > 0, "figures": f"d_k {d_k:.2f} (mean over iterations and runs)"}


def history_means(history: Sequence[Mapping[str, Any]], key: str) -> tuple[float, float]:
    """The mean of ``key`` over the first and over the last quarter of the iterations (NaN when absent)."""
    values = [float(h[key]) for h in history if isinstance(h.get(key), (int, float))]
    if not values:
        return float("nan"), float("nan")
    n = max(1, len(values) // 4)
    return statistics.fmean(values[:n]), statistics.fmean(values[-n:])


def _sub_agents_paragraph(summary: Mapping[str, Any]) -> list[str]:
    """Why frozen-sub can lose, in this run's numbers: what the sub-agents earned early and late."""
    results = summary["results"]
    rows = []
    for mode in ("mgrpo", "frozen-sub"):
        if mode not in results:
            continue
        runs = results[mode]["per_seed"]
        first = statistics.fmean(r["sub_reward"][0] for r in runs)
        last = statistics.fmean(r["sub_reward"][1] for r in runs)
        e_first = statistics.fmean(r["sub_expert"][0] for r in runs)
        e_last = statistics.fmean(r["sub_expert"][1] for r in runs)
        rows.append(f"| {mode} | {first:.3f} -> {last:.3f} | {e_first:.3f} -> {e_last:.3f} |")
    if not rows:
        return []
    return [
        "## The sub-agents",
        "",
        "Frozen-sub trains only the main agent; its sub-agents keep the warm start's skill, so every hop they "
        "get wrong stays wrong. M-GRPO also trains the sub-agents on their own group-relative advantages "
        "(R_S: format, the main agent's correctness, the expert score of their report). Sub-agent reward "
        "R_S and expert score, mean over the first and the last quarter of the iterations:",
        "",
        "| mode | R_S first -> last | expert first -> last |",
        "|---|---|---|",
        *rows,
    ]


def _intervals_section(summary: Mapping[str, Any]) -> list[str]:
    intervals = summary.get("intervals", {})
    rows = [f"| {name} | {interval_text(intervals[name])} | {int(intervals[name]['questions'])} |"
            for name, _, _ in differences() if name in intervals]
    if not rows:
        return []
    k = int(summary.get("eval", {}).get("samples", 1))
    return ["## Paired differences", "",
            f"Per question, the share correct of its {k} sample(s), pooled over seeds; the difference of two "
            "evaluations on the same questions, with a percentile bootstrap over questions (points).", "",
            "| difference | points [95% CI] | questions |", "|---|---|---:|", *rows, ""]


def _reference_section(summary: Mapping[str, Any]) -> list[str]:
    reference = summary.get("reference")
    if not reference:
        return []
    k = int(summary.get("eval", {}).get("samples", 1))
    diff = (summary.get("intervals") or {}).get("after: mgrpo - reference")
    return ["## Reference start", "",
            f"`{reference['path']}` ({reference['name']}), evaluated once like the starts: mean@{k} "
            f"{reference['mean_k'] * 100:.1f}, pass@{k} {reference['pass_k'] * 100:.1f}"
            + (f"; M-GRPO after RL minus it: {interval_text(diff)} points." if diff else "."), ""]


def markdown(summary: Mapping[str, Any]) -> str:
    """report.md of a comparison summary."""
    e, b = summary["eval"], summary["budget"]
    n = len(summary["seeds"])
    how = "greedy" if e["temperature"] == 0 else f"temperature {e['temperature']}"
    greedy = " Greedy EM (one sample per question) beside it." if e["temperature"] > 0 and e.get("greedy", True) else ""
    failures = summary.get("tool_backend_failures") or {}
    lines = [
        f"# mgrpo compare: {summary['scenario']}, {n} seed{'s' * (n > 1)}",
        "",
        *([f"**{backend_failure_line(failures)}**", ""] if failures else []),
        f"Held-out split `{e['split']}`, {e['limit'] or 'all'} questions x {e['samples']} sample(s), {how}: "
        f"mean@{e['samples']} is the share correct over the samples, averaged over questions.{greedy} "
        f"Every run: {b['iterations']} iterations x {b['questions_per_iteration']} questions x {b['group_size']} "
        f"rollouts = {b['rollouts']} rollouts, from the same warm-started models. Percent, mean ± population "
        "std over seeds; Δ is after - start pooled over seeds with its paired 95% bootstrap interval; "
        "rollouts/min counts training only; minutes = training + evaluation per run.",
        "",
        format_table(summary),
        "",
        summary["verdict"]["text"],
        "",
        "## Checks (each from its interval: pass only when the lower bound clears the target)",
        "",
        "| check | result | figures |",
        "|---|---|---|",
        *[f"| {c['check']} | {'n/a' if c['passed'] is None else 'pass' if c['passed'] else 'FAIL'} | {c['figures']} |"
          for c in summary["verdict"].get("checks", [])],
        "",
        *_intervals_section(summary),
        *_mistakes_section(summary),
        *_endings_section(summary),
        *_reference_section(summary),
        *attribution_section(summary),
        *_sub_agents_paragraph(summary),
        "",
        backend_failure_line(failures) + ".",
        "",
        *_figures_section(summary),
        "Reproduce:",
        "",
        "```bash",
        summary["reproduce"],
        "```",
    ]
    if summary.get("command"):
        lines += ["", f"Ran as: `{summary['command']}`"]
    lines += _provenance_section(summary)
    return "\n".join(lines) + "\n"


def _figures_section(summary: Mapping[str, Any]) -> list[str]:
    """The headline figure, and a link to each detail figure (``plots.DETAILS``; the attribution one only
    where the summary has attribution)."""
    details = [(name, what) for name, what in DETAILS if name != "attribution.png" or summary.get("attribution")]
    return [f"![held-out mean@k start and after, the held-out curve, the answers lost by each role]({HEADLINE})", "",
            "The details, by topic: " + "; ".join(f"[{what}]({name})" for name, what in details) + ".", ""]


def _provenance_section(summary: Mapping[str, Any]) -> list[str]:
    """The machine and kernels each process ran on (a figure that differs elsewhere is traced from here)."""
    from ..core.kernels import describe

    prov = summary.get("provenance")
    if not prov:
        return []
    rows = [f"- controller: {describe(prov['controller'])}"]
    rows += [f"- {key} runs: {describe(state)}" for key, state in prov.get("groups", {}).items()]
    env = {k: v for k, v in prov["controller"]["env"].items() if v is not None}
    settings = ", ".join(f"`{k}={v}`" for k, v in env.items()) or "none"
    return ["", "## Machine and kernels", "", *rows, "", f"Kernel settings in the environment: {settings}."]
