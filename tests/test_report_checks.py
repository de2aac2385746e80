"""Every check row of the comparison's report, tested by its outcome: a check passes only when its interval
clears the line, so an estimate on the right side whose interval crosses the line FAILS, the bound on the
line itself fails, and a mode not run is n/a. The rows are found by their words (not by position), and
report.md is read back line by line from a summary written by hand."""

from __future__ import annotations

import pytest

from mgrpo_algo.experiments.report import (
    MISTAKE_NAMES,
    differences,
    interval_text,
    markdown,
    mistake_checks,
    verdict,
)


def _iv(diff: float, low: float, high: float, n: int = 50) -> dict[str, float]:
    return {"diff": diff, "low": low, "high": high, "questions": float(n), "confidence": 0.95}


def _summary(intervals=None, mistakes=None, reference=None, d_k=1.0, samples=1) -> dict:
    rows = {m: {"per_seed": [{"d_k_mean": d_k}]} for m in ("mgrpo", "frozen-sub", "single-agent")}
    return {"eval": {"samples": samples}, "results": rows, "intervals": intervals or {}, "mistakes": mistakes or {},
            "reference": reference}


def _check(summary: dict, words: str) -> dict:
    """The one check row whose text contains ``words``."""
    found = [c for c in verdict(summary)["checks"] if words in c["check"]]
    assert len(found) == 1, [c["check"] for c in verdict(summary)["checks"]]
    return found[0]


RISE = "rises >= 10 points over its start"
ABOVE = "mgrpo > frozen-sub"
BELOW = "frozen-sub > single-agent"


@pytest.mark.parametrize(("name", "words"), [
    ("after: mgrpo - frozen-sub", ABOVE), ("after: frozen-sub - single-agent", BELOW)])
def test_an_order_check_passes_only_when_its_interval_is_above_zero(name, words):
    assert _check(_summary({name: _iv(0.08, 0.01, 0.15)}), words)["passed"] is True
    # the estimate is on the right side, its interval crosses 0: FAIL, and so does a bound on 0 itself
    assert _check(_summary({name: _iv(0.08, -0.01, 0.17)}), words)["passed"] is False
    assert _check(_summary({name: _iv(0.08, 0.0, 0.16)}), words)["passed"] is False
    assert _check(_summary({name: _iv(-0.05, -0.1, -0.01)}), words)["passed"] is False
    missing = _check(_summary({}), words)
    assert missing["passed"] is None and missing["figures"] == "not run"
    assert _check(_summary({name: _iv(0.08, 0.01, 0.15, n=37)}), words)["figures"] == (
        "+8.0 [+1.0, +15.0] points, 37 questions, 95% paired bootstrap")


def test_the_rise_needs_its_interval_above_zero_and_its_estimate_at_the_target():
    name = "mgrpo: after - start"
    assert _check(_summary({name: _iv(0.15, 0.02, 0.28)}), RISE)["passed"] is True
    assert _check(_summary({name: _iv(0.15, -0.02, 0.32)}), RISE)["passed"] is False  # crosses 0
    assert _check(_summary({name: _iv(0.15, 0.0, 0.30)}), RISE)["passed"] is False  # on the line
    assert _check(_summary({name: _iv(0.09, 0.02, 0.16)}), RISE)["passed"] is False  # above 0, under 10 points
    assert _check(_summary({name: _iv(0.10, 0.02, 0.18)}), RISE)["passed"] is True  # exactly 10 points
    v = verdict(_summary({name: _iv(0.15, -0.02, 0.32)}, samples=4))
    assert v["rise_held"] is False and v["order_held"] is None
    assert v["text"] == ("M-GRPO's held-out mean@4 changed by +15.0 [-2.0, +32.0] points (after - start, 95% interval) "
                         "over its start, so the +10 point rise did not hold.")
    assert "mean@4" in _check(_summary({name: _iv(0.15, 0.02, 0.28)}, samples=4), RISE)["check"]
    assert verdict(_summary({name: _iv(0.15, 0.02, 0.28)}), rise_points=20)["rise_held"] is False


def test_the_order_holds_only_when_both_gaps_pass():
    above, below = "after: mgrpo - frozen-sub", "after: frozen-sub - single-agent"
    good, crossing = _iv(0.05, 0.01, 0.09), _iv(0.05, -0.01, 0.11)
    assert verdict(_summary({above: good, below: good}))["order_held"] is True
    assert verdict(_summary({above: good, below: crossing}))["order_held"] is False
    assert verdict(_summary({above: crossing, below: good}))["order_held"] is False
    assert verdict(_summary({above: good}))["order_held"] is None
    text = verdict(_summary({above: good, below: crossing}))["text"]
    assert text == ("The order mgrpo > frozen-sub > single-agent did not hold (mgrpo - frozen-sub +5.0 [+1.0, +9.0], "
                    "frozen-sub - single-agent +5.0 [-1.0, +11.0] points).")


def _mistakes(mode: str, kind: str, change: dict | None) -> dict:
    return {mode: {"start": {}, "after": {}, "change": {kind: change}}}


@pytest.mark.parametrize("kind", ["answer_early", "report_without_visit"])
def test_a_mistake_check_under_mgrpo_passes_only_when_the_whole_interval_is_a_fall(kind):
    words = f"under M-GRPO, held-out '{MISTAKE_NAMES[kind]}' falls"
    assert _check(_summary(mistakes=_mistakes("mgrpo", kind, _iv(-0.1, -0.2, -0.01))), words)["passed"] is True
    # a fall estimated, its interval reaching above 0: FAIL; its upper bound on 0: FAIL
    crossing = _check(_summary(mistakes=_mistakes("mgrpo", kind, _iv(-0.1, -0.2, 0.01))), words)
    assert crossing["passed"] is False and crossing["figures"] == "-10.0 [-20.0, +1.0] points"
    assert _check(_summary(mistakes=_mistakes("mgrpo", kind, _iv(-0.1, -0.2, 0.0))), words)["passed"] is False
    assert _check(_summary(mistakes=_mistakes("mgrpo", kind, _iv(0.1, 0.01, 0.2))), words)["passed"] is False
    # the other kind's change, or frozen-sub's, does not stand in for it
    other = "report_without_visit" if kind == "answer_early" else "answer_early"
    assert _check(_summary(mistakes=_mistakes("mgrpo", other, _iv(-0.1, -0.2, -0.01))), words)["passed"] is None
    assert _check(_summary(mistakes=_mistakes("frozen-sub", kind, _iv(-0.1, -0.2, -0.01))), words)["passed"] is None
    missing = _check(_summary(mistakes=_mistakes("mgrpo", kind, None)), words)
    assert missing == {"check": f"{words} (interval below 0)", "passed": None, "figures": "not run"}


def test_the_frozen_sub_check_fails_only_when_its_sub_agents_mistake_surely_falls():
    words = "under frozen-sub, the sub-agents' 'reports without a visit' does not fall"
    kind = "report_without_visit"
    assert _check(_summary(mistakes=_mistakes("frozen-sub", kind, _iv(0.02, -0.05, 0.09))), words)["passed"] is True
    assert _check(_summary(mistakes=_mistakes("frozen-sub", kind, _iv(-0.03, -0.08, 0.0))), words)["passed"] is True
    surely = _check(_summary(mistakes=_mistakes("frozen-sub", kind, _iv(-0.05, -0.1, -0.01))), words)
    assert surely["passed"] is False and surely["figures"] == "-5.0 [-10.0, -1.0] points"
    # M-GRPO's fall is not frozen-sub's
    assert _check(_summary(mistakes=_mistakes("mgrpo", kind, _iv(-0.05, -0.1, -0.01))), words)["passed"] is None
    assert len(mistake_checks({})) == 3 and all(c["passed"] is None for c in mistake_checks({"mistakes": None}))


def test_the_reference_check_reads_the_interval():
    reference = {"name": "oracle-warm-start", "path": "configs/oracle-warm-start", "mean_k": 0.4567, "pass_k": 0.6}
    words = "is above the reference start's"
    name = "after: mgrpo - reference"
    passed = _check(_summary({name: _iv(0.05, 0.001, 0.1)}, reference=reference), words)
    assert passed["passed"] is True and passed["figures"] == "+5.0 [+0.1, +10.0] points"
    assert passed["check"] == ("after RL, M-GRPO's mean@1 is above the reference start's (oracle-warm-start: 45.7) "
                               "(interval above 0)")
    # a point estimate above 0 is not enough (it was, before the planner issue): the interval must clear 0
    assert _check(_summary({name: _iv(0.05, 0.0, 0.1)}, reference=reference), words)["passed"] is False
    assert _check(_summary({name: _iv(-0.001, -0.1, 0.1)}, reference=reference), words)["passed"] is False
    # no reference evaluated, or no difference computed: no row at all
    assert not [c for c in verdict(_summary({name: _iv(0.1, 0.0, 0.2)}))["checks"] if words in c["check"]]
    assert not [c for c in verdict(_summary({}, reference=reference))["checks"] if words in c["check"]]


def test_the_delegation_check_averages_every_hierarchy_run():
    words = "the main agent delegates during RL"
    assert _check(_summary(d_k=0.25), words) == {
        "check": "the main agent delegates during RL (mean sub-agents per rollout d_k > 0)", "passed": True,
        "figures": "d_k 0.25 (mean over iterations and runs)"}
    assert _check(_summary(d_k=0.0), words)["passed"] is False
    summary = _summary(d_k=0.0)
    summary["results"]["frozen-sub"]["per_seed"] = [{"d_k_mean": 0.5}, {"d_k_mean": 1.0}]
    assert _check(summary, words)["figures"] == "d_k 0.50 (mean over iterations and runs)"  # (0 + 0.5 + 1) / 3


def _full_summary() -> dict:
    """A summary as compare writes it, small, with every section of report.md."""
    stats = {"mean": {"before_em": 0.2, "after_em": 0.35, "before_greedy": 0.25, "after_greedy": 0.3,
                      "before_pass_k": 0.5, "rollouts": 16, "rollouts_per_minute": 8.0, "train_seconds": 60.0,
                      "eval_seconds": 30.0},
             "std": {"before_em": 0.0, "after_em": 0.05, "before_greedy": 0.0, "after_greedy": 0.1, "before_pass_k": 0.0}}
    runs = [{"sub_reward": (0.2, 0.5), "sub_expert": (0.1, 0.4), "d_k_mean": 1.5}]
    frozen = [{"sub_reward": (0.3, 0.1), "sub_expert": (0.6, 0.2), "d_k_mean": 1.5},  # means over the two seeds:
              {"sub_reward": (0.5, 0.3), "sub_expert": (0.2, 0.4), "d_k_mean": 1.5}]  # 0.4 -> 0.2, 0.4 -> 0.3
    intervals = {"mgrpo: after - start": _iv(0.15, 0.05, 0.25, 40), "after: mgrpo - frozen-sub": _iv(0.02, -0.03, 0.07, 40),
                 "after: mgrpo - reference": _iv(-0.05, -0.12, 0.02, 40)}
    summary = {
        "scenario": "wiki-hops", "seeds": [0, 1], "modes": ["mgrpo", "frozen-sub"],
        "eval": {"split": "stage2/test", "limit": 40, "samples": 4, "temperature": 1.0, "greedy": True},
        "budget": {"iterations": 2, "questions_per_iteration": 2, "group_size": 4, "rollouts": 16},
        "results": {"mgrpo": {**stats, "per_seed": runs}, "frozen-sub": {**stats, "per_seed": frozen}},
        "intervals": intervals,
        "mistakes": {"mgrpo": {"start": {"answer_early": 0.4, "report_without_visit": 0.3, "delegations": 1.25},
                               "after": {"answer_early": 0.1, "report_without_visit": 0.2, "delegations": 1.5},
                               "change": {"answer_early": _iv(-0.3, -0.4, -0.2), "report_without_visit": _iv(-0.1, -0.2, 0.01)}},
                     "frozen-sub": {"start": {"answer_early": 0.4}, "after": {"answer_early": None},
                                    "change": {"answer_early": None}}},
        "reference": {"name": "oracle-warm-start", "path": "configs/oracle-warm-start", "mean_k": 0.45, "pass_k": 0.7},
        "tool_backend_failures": {},
        "reproduce": "mgrpo compare --config out/config.yaml --seeds 2 --out out --modes mgrpo,frozen-sub",
        "command": "mgrpo compare --seeds 2",
    }
    summary["verdict"] = verdict(summary)
    return summary


def test_report_md_shows_each_check_with_its_outcome():
    lines = markdown(_full_summary()).splitlines()
    rows = {line.split(" | ")[0].removeprefix("| "): line.split(" | ")[1] for line in lines
            if line.startswith("| ") and line.count(" | ") >= 2 and not line.startswith("| mode")}
    k4 = "mean@4"
    assert rows[f"M-GRPO's held-out {k4} rises >= 10 points over its start, 95% interval above 0"] == "pass"
    assert rows[f"after training, mgrpo > frozen-sub in {k4} (interval above 0)"] == "FAIL"  # +2 [-3, +7]
    assert rows[f"after training, frozen-sub > single-agent in {k4} (interval above 0)"] == "n/a"
    assert rows["under M-GRPO, held-out 'main answers early (per decision with hops left)' falls (interval below 0)"] == "pass"
    assert rows["under M-GRPO, held-out 'reports without a visit (sub-agents / single-agent hops)' falls (interval below 0)"] == "FAIL"
    assert rows["under frozen-sub, the sub-agents' 'reports without a visit' does not fall (interval not below 0)"] == "n/a"
    assert rows[f"after RL, M-GRPO's {k4} is above the reference start's (oracle-warm-start: 45.0) "
                "(interval above 0)"] == "FAIL"
    assert ("| under M-GRPO, held-out 'main answers early (per decision with hops left)' falls (interval below 0) | pass "
            "| -30.0 [-40.0, -20.0] points |") in lines


def test_report_md_sections_line_by_line():
    summary = _full_summary()
    text = markdown(summary)
    lines = text.splitlines()
    assert lines[0] == "# mgrpo compare: wiki-hops, 2 seeds"
    assert lines[2] == (
        "Held-out split `stage2/test`, 40 questions x 4 sample(s), temperature 1.0: mean@4 is the share correct over "
        "the samples, averaged over questions. Greedy EM (one sample per question) beside it. Every run: 2 iterations "
        "x 2 questions x 4 rollouts = 16 rollouts, from the same warm-started models. Percent, mean ± population std "
        "over seeds; Δ is after - start pooled over seeds with its paired 95% bootstrap interval; rollouts/min counts "
        "training only; minutes = training + evaluation per run.")
    assert "| mgrpo | 20.0 ± 0.0 | 35.0 ± 5.0 | +15.0 [+5.0, +25.0] | 25.0 ± 0.0 | 30.0 ± 10.0 | 50.0 ± 0.0 | 16 | 8 | 1.5 |" in lines
    assert "| frozen-sub | 20.0 ± 0.0 | 35.0 ± 5.0 | - | 25.0 ± 0.0 | 30.0 ± 10.0 | 50.0 ± 0.0 | 16 | 8 | 1.5 |" in lines
    # the paired differences, in the order of differences(), each with its questions
    section = lines[lines.index("## Paired differences"):]
    assert section[2] == ("Per question, the share correct of its 4 sample(s), pooled over seeds; the difference of two "
                          "evaluations on the same questions, with a percentile bootstrap over questions (points).")
    assert section[4:9] == ["| difference | points [95% CI] | questions |", "|---|---|---:|",
                            "| mgrpo: after - start | +15.0 [+5.0, +25.0] | 40 |",
                            "| after: mgrpo - frozen-sub | +2.0 [-3.0, +7.0] | 40 |",
                            "| after: mgrpo - reference | -5.0 [-12.0, +2.0] | 40 |"]
    # the mistakes: start, after, change per mode; a rate neither side has is left out, delegations per episode
    section = lines[lines.index("## Decision mistakes (held-out)"):]
    table = section[section.index("| mode | mistake | start | after | change [95% CI] |") + 2:]
    assert table[:5] == [
        "| mgrpo | main answers early (per decision with hops left) | 40.0 | 10.0 | -30.0 [-40.0, -20.0] |",
        "| mgrpo | reports without a visit (sub-agents / single-agent hops) | 30.0 | 20.0 | -10.0 [-20.0, +1.0] |",
        "| mgrpo | delegations per episode | 1.25 | 1.50 | |",
        "| frozen-sub | main answers early (per decision with hops left) | 40.0 | - | n/a |",
        "",
    ]
    assert ("## Reference start\n\n`configs/oracle-warm-start` (oracle-warm-start), evaluated once like the starts: "
            "mean@4 45.0, pass@4 70.0; M-GRPO after RL minus it: -5.0 [-12.0, +2.0] points.\n") in text
    assert "| mgrpo | 0.200 -> 0.500 | 0.100 -> 0.400 |" in lines and "| frozen-sub | 0.400 -> 0.200 | 0.400 -> 0.300 |" in lines
    assert lines[-1] == "Ran as: `mgrpo compare --seeds 2`"
    assert "tool backend failures: none." in lines and "```bash" in lines and summary["reproduce"] in lines
    assert not any(line.startswith("**WARNING") for line in lines)
    # a failing backend is said at the top, in bold
    summary["tool_backend_failures"] = {"search": 3}
    assert markdown(summary).splitlines()[2].startswith("**WARNING: tool backend failures: search 3")


def test_report_md_of_a_greedy_single_seed_run_without_extras():
    summary = _full_summary()
    summary.update(seeds=[0], command=None, reference=None, mistakes={},
                   eval={"split": "stage2/test", "limit": 0, "samples": 1, "temperature": 0.0, "greedy": True})
    del summary["intervals"]["after: mgrpo - reference"]
    summary["verdict"] = verdict(summary)
    text = markdown(summary)
    assert text.startswith("# mgrpo compare: wiki-hops, 1 seed\n")
    assert "Held-out split `stage2/test`, all questions x 1 sample(s), greedy: mean@1 is the share correct over the " \
           "samples, averaged over questions. Every run:" in text
    assert "## Decision mistakes" not in text and "## Reference start" not in text and "Ran as:" not in text
    assert text.endswith("```\n")


def test_interval_text_and_the_differences_of_the_mode_table():
    assert interval_text(None) == "-" and interval_text({}) == "-"
    assert interval_text(_iv(0.123, -0.0449, float("nan"))) == "+12.3 [-4.5, -]"
    assert differences(["mgrpo", "single-agent"]) == (
        ("mgrpo: after - start", "mgrpo", "start"), ("single-agent: after - start", "single-agent", "start"),
        ("after: mgrpo - frozen-sub", "mgrpo", "frozen-sub"), ("after: mgrpo - reference", "mgrpo", "reference"))
    assert differences()[:3] == tuple((f"{m}: after - start", m, "start") for m in ("mgrpo", "frozen-sub", "single-agent"))


TAIL = """## Paired differences

Per question, the share correct of its 4 sample(s), pooled over seeds; the difference of two evaluations on the \
same questions, with a percentile bootstrap over questions (points).

| difference | points [95% CI] | questions |
|---|---|---:|
| mgrpo: after - start | +15.0 [+5.0, +25.0] | 40 |
| after: mgrpo - frozen-sub | +2.0 [-3.0, +7.0] | 40 |
| after: mgrpo - reference | -5.0 [-12.0, +2.0] | 40 |

## Decision mistakes (held-out)

What RL should remove from a start cloned from an imperfect teacher (`mgrpo_env.mistakes`): the main agent \
answering with hops left, and reports made without visiting a page. Rates over every held-out sample, pooled over \
seeds; the change is after - start with a paired bootstrap interval over questions (points). Frozen-sub cannot \
train its sub-agents, so their rate should stay.

| mode | mistake | start | after | change [95% CI] |
|---|---|---:|---:|---|
| mgrpo | main answers early (per decision with hops left) | 40.0 | 10.0 | -30.0 [-40.0, -20.0] |
| mgrpo | reports without a visit (sub-agents / single-agent hops) | 30.0 | 20.0 | -10.0 [-20.0, +1.0] |
| mgrpo | delegations per episode | 1.25 | 1.50 | |
| frozen-sub | main answers early (per decision with hops left) | 40.0 | - | n/a |

## Reference start

`configs/oracle-warm-start` (oracle-warm-start), evaluated once like the starts: mean@4 45.0, pass@4 70.0; M-GRPO \
after RL minus it: -5.0 [-12.0, +2.0] points.

## The sub-agents

Frozen-sub trains only the main agent; its sub-agents keep the warm start's skill, so every hop they get wrong \
stays wrong. M-GRPO also trains the sub-agents on their own group-relative advantages (R_S: format, the main \
agent's correctness, the expert score of their report). Sub-agent reward R_S and expert score, mean over the \
first and the last quarter of the iterations:

| mode | R_S first -> last | expert first -> last |
|---|---|---|
| mgrpo | 0.200 -> 0.500 | 0.100 -> 0.400 |
| frozen-sub | 0.400 -> 0.200 | 0.400 -> 0.300 |

tool backend failures: none.

![held-out mean@k start and after, the held-out curve, the answers lost by each role](headline.png)

The details, by topic: [training reward and accuracy](training.png); [format and how episodes end](endings.png); \
[decision mistakes](mistakes.png).

Reproduce:

```bash
mgrpo compare --config out/config.yaml --seeds 2 --out out --modes mgrpo,frozen-sub
```

Ran as: `mgrpo compare --seeds 2`
"""


def test_report_md_from_the_paired_differences_on_word_for_word():
    """Every section after the checks table, word for word (the checks table has its own test above)."""
    text = markdown(_full_summary())
    assert text[text.index("## Paired differences"):] == TAIL
    head = text[:text.index("## Checks")].splitlines()
    assert head[4:6] == ["| mode | start mean@4 | after mean@4 | Δ [95% CI] | start greedy | after greedy | start pass@4 "
                         "| rollouts | rollouts/min | minutes |", "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    assert head[9:] == ["M-GRPO's held-out mean@4 changed by +15.0 [+5.0, +25.0] points (after - start, 95% interval) "
                        "over its start, so the +10 point rise held.", ""]
    assert text[text.index("## Checks"):].splitlines()[:4] == [
        "## Checks (each from its interval: pass only when the lower bound clears the target)", "",
        "| check | result | figures |", "|---|---|---|"]


def test_report_md_rows_a_partial_run_leaves():
    """The rows of a run that lacks parts: no M-GRPO (its sub-agents' row, the reference's difference and the
    frozen-sub mistake check say so), no rollout rate, and minutes from the seconds."""
    summary = _full_summary()
    del summary["results"]["mgrpo"], summary["intervals"]["after: mgrpo - reference"]
    summary["results"]["frozen-sub"]["mean"] = {**summary["results"]["frozen-sub"]["mean"], "rollouts_per_minute": None,
                                                "train_seconds": 600.0, "eval_seconds": 30.0}
    summary["verdict"] = verdict(summary)
    lines = markdown(summary).splitlines()
    assert lines[:4] == ["# mgrpo compare: wiki-hops, 2 seeds", "", lines[2], ""]
    assert "| frozen-sub | 20.0 ± 0.0 | 35.0 ± 5.0 | - | 25.0 ± 0.0 | 30.0 ± 10.0 | 50.0 ± 0.0 | 16 | - | 10.5 |" in lines
    assert "| frozen-sub | 0.400 -> 0.200 | 0.400 -> 0.300 |" in lines  # the sub-agents of the modes that ran
    assert ("`configs/oracle-warm-start` (oracle-warm-start), evaluated once like the starts: mean@4 45.0, pass@4 70.0."
            in lines)
    assert ("| under frozen-sub, the sub-agents' 'reports without a visit' does not fall (interval not below 0) | n/a "
            "| not run |") in lines
    head = markdown(summary).split("## Checks")[0].splitlines()
    assert head[3] == "" and head[6].startswith("| frozen-sub") and head[7] == ""
    summary["tool_backend_failures"] = {"search": 3}
    lines = markdown(summary).splitlines()
    assert lines[2].startswith("**WARNING") and lines[3] == "" and lines[4].startswith("Held-out split")


def test_the_checks_table_ends_with_a_blank_line():
    lines = markdown(_full_summary()).splitlines()
    at = lines.index("## Paired differences")
    assert lines[at - 1] == "" and lines[at - 2].startswith("| after RL, M-GRPO's mean@4 is above")


def test_report_md_ends_with_the_machine_and_kernels_of_each_process():
    def state(capability: str, pin: str) -> dict:
        env = dict.fromkeys(("ATEN_CPU_CAPABILITY", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS"), None)
        if pin:
            env.update(ATEN_CPU_CAPABILITY="avx2", MKL_CBWR="AVX2")
        return {"cpu": {"model": "Some EPYC", "machine": "x86_64", "avx2": True, "avx512": ["avx512f"]}, "pin": pin,
                "env": env, "torch_capability": capability, "torch_threads": 1,
                "versions": {"torch": "2.13.0+cpu", "transformers": "5.25.0", "numpy": "2.4.6"}}

    summary = {**_full_summary(), "provenance": {"controller": state("AVX2", "avx2"),
                                                 "groups": {"hierarchy": state("AVX2", "avx2"),
                                                            "single": state("AVX512", "")}}}
    lines = markdown(summary).splitlines()
    at = lines.index("## Machine and kernels")
    assert lines[at + 2:] == [
        "- controller: Some EPYC (AVX-512); kernels pinned to avx2, torch reports AVX2; torch 2.13.0+cpu, "
        "transformers 5.25.0, numpy 2.4.6; 1 torch thread(s)",
        "- hierarchy runs: Some EPYC (AVX-512); kernels pinned to avx2, torch reports AVX2; torch 2.13.0+cpu, "
        "transformers 5.25.0, numpy 2.4.6; 1 torch thread(s)",
        "- single runs: Some EPYC (AVX-512); kernels not pinned, torch reports AVX512; torch 2.13.0+cpu, "
        "transformers 5.25.0, numpy 2.4.6; 1 torch thread(s)",
        "",
        "Kernel settings in the environment: `ATEN_CPU_CAPABILITY=avx2`, `MKL_CBWR=AVX2`."]
    assert "## Machine and kernels" not in markdown(_full_summary())  # a summary from before the field
