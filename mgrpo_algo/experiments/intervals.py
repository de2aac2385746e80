"""Accuracy over k samples per question, and paired bootstrap intervals of differences.

An evaluation with ``eval.samples = k`` at ``eval.temperature > 0`` gives each question k episodes.
Its headline is **mean@k** (the share correct, averaged over the k samples and then over questions:
DeepSeek-R1's "pass@1 averaged over k samples", DAPO's avg@k); **pass@k** (at least one of k correct)
tells how much a policy could reach by sampling. A difference of two evaluations on the same
questions (after - start, or M-GRPO - frozen-sub) is paired by question: each question's mean over
its samples (and over seeds, where several runs are pooled) is one observation, and the interval is a
percentile bootstrap over questions (``scipy.stats.bootstrap``), so the question-to-question spread,
by far the largest, cancels out of the difference.

Pure functions over ``{question id: [correct, ...]}``; the records of ``mgrpo_env.episode`` go in
through :func:`per_question`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from math import comb
from typing import Any

import numpy as np

__all__ = ["per_question", "mean_at_k", "pass_at_k", "question_means", "mean_interval", "paired_difference",
           "paired_ratio_difference", "paired_mean_ratio_difference", "pool_runs"]


def per_question(records: Iterable[Any]) -> dict[str, list[bool]]:
    """``{task id: [correct of each sample, in order]}`` of episode records (``record.task["id"]``)."""
    out: dict[str, list[bool]] = {}
    for r in records:
        out.setdefault(str(r.task["id"]), []).append(bool(r.correct))
    return out


def mean_at_k(scores: Mapping[str, Sequence[bool]]) -> float:
    """mean@k: per question the share of its samples that are correct, averaged over questions."""
    if not scores:
        raise ValueError("mean@k of no questions")
    return float(np.mean([np.mean(v) for v in scores.values()]))


def pass_at_k(scores: Mapping[str, Sequence[bool]], k: int | None = None) -> float:
    """pass@k, the unbiased estimator of Chen et al. (2021): per question with n samples, c correct,
    ``1 - C(n - c, k) / C(n, k)``; ``k`` defaults to n (then: any sample correct)."""
    if not scores:
        raise ValueError("pass@k of no questions")
    values = []
    for v in scores.values():
        n, c = len(v), int(sum(v))
        kk = n if k is None else k
        if not 1 <= kk <= n:
            raise ValueError(f"pass@{kk} needs at least {kk} samples per question, a question has {n}")
        values.append(1.0 - comb(n - c, kk) / comb(n, kk))
    return float(np.mean(values))


def question_means(scores: Mapping[str, Sequence[bool]]) -> dict[str, float]:
    """Each question's share of correct samples."""
    return {q: float(np.mean(v)) for q, v in scores.items()}


def mean_interval(scores: Mapping[str, Sequence[bool]], *, confidence: float = 0.95, resamples: int = 10_000,
                  seed: int = 0) -> dict[str, float]:
    """mean@k of ``scores`` with a percentile bootstrap interval over questions (each question's mean over
    its samples is one observation, as in the paired differences; unpaired, so the question-to-question
    spread stays in it). Returns ``{"mean", "low", "high", "questions", "confidence"}``, fractions.

    Two questions, one always right and one never: a resample holds 0, 1 or 2 copies of the right one
    (means 0, 0.5, 1 with chances 1/4, 1/2, 1/4), so the 95% interval is [0, 1].

    >>> r = mean_interval({"q1": [True, True], "q2": [False, False]})
    >>> r["mean"], r["low"], r["high"], r["questions"]
    (0.5, 0.0, 1.0, 2.0)
    """
    means = np.array([np.mean(v) for v in scores.values()], dtype=np.float64)
    if not len(means):
        raise ValueError("an interval of mean@k needs at least one question")
    rng = np.random.default_rng(seed)
    stats = means[rng.integers(0, len(means), size=(resamples, len(means)))].mean(axis=1)
    alpha = (1.0 - confidence) / 2
    return {"mean": float(means.mean()), "low": float(np.quantile(stats, alpha)),
            "high": float(np.quantile(stats, 1 - alpha)), "questions": float(len(means)), "confidence": confidence}


def pool_runs(runs: Sequence[Mapping[str, Sequence[bool]]]) -> dict[str, list[bool]]:
    """Several runs (seeds) on the same questions as one: each question's samples of every run."""
    keys = set(runs[0]) if runs else set()
    for r in runs[1:]:
        if set(r) != keys:
            raise ValueError("runs to pool must cover the same questions")
    return {q: [c for r in runs for c in r[q]] for q in (runs[0] if runs else {})}


def paired_difference(
    a: Mapping[str, Sequence[bool]], b: Mapping[str, Sequence[bool]], *, confidence: float = 0.95,
    resamples: int = 10_000, seed: int = 0,
) -> dict[str, float]:
    """``mean@k(a) - mean@k(b)`` on their common questions, with a paired percentile bootstrap interval.

    Returns ``{"diff", "low", "high", "questions", "confidence"}`` (fractions, not percent). Questions
    in only one of the two are refused: a paired difference needs the same questions.
    """
    if set(a) != set(b):
        only = sorted(set(a) ^ set(b))[:3]
        raise ValueError(f"paired difference needs the same questions in both; differ e.g. {only}")
    if not a:
        raise ValueError("paired difference of no questions")
    keys = sorted(a)
    diffs = np.array([np.mean(a[q]) - np.mean(b[q]) for q in keys], dtype=np.float64)
    mean = float(diffs.mean())
    if len(diffs) < 2 or np.all(diffs == diffs[0]):
        low = high = mean  # no spread to resample (scipy would warn and return NaN)
    else:
        from scipy.stats import bootstrap

        res = bootstrap((diffs,), np.mean, confidence_level=confidence, n_resamples=resamples, method="percentile",
                        random_state=np.random.default_rng(seed), vectorized=True)
        low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return {"diff": mean, "low": low, "high": high, "questions": float(len(keys)), "confidence": confidence}


def paired_mean_ratio_difference(
    a: Mapping[str, Sequence[float]], b: Mapping[str, Sequence[float]], *, confidence: float = 0.95,
    resamples: int = 10_000, seed: int = 0,
) -> dict[str, float] | None:
    """The change of a rate taken per question, then averaged: ``mean_q(num_a / den_a) - mean_q(num_b / den_b)``
    over the questions with ``den > 0`` on both sides, with a paired percentile bootstrap over them
    (e.g. the share of a question's delegations that ask a needed hop: a question with many
    delegations counts once, as one with few). None when no question has a count on both sides.

    >>> r = paired_mean_ratio_difference({"q1": (1, 2), "q2": (3, 3), "q3": (1, 1)}, {"q1": (0, 1), "q2": (1, 2)})
    >>> round(r["diff"], 3), r["questions"]
    (0.5, 2.0)
    """
    keys = sorted(q for q in set(a) & set(b) if a[q][1] and b[q][1])
    if not keys:
        return None
    diffs = np.array([a[q][0] / a[q][1] - b[q][0] / b[q][1] for q in keys], dtype=np.float64)
    mean = float(diffs.mean())
    rng = np.random.default_rng(seed)
    stats = diffs[rng.integers(0, len(keys), size=(resamples, len(keys)))].mean(axis=1)
    alpha = (1.0 - confidence) / 2
    return {"diff": mean, "low": float(np.quantile(stats, alpha)), "high": float(np.quantile(stats, 1 - alpha)),
            "questions": float(len(keys)), "confidence": confidence}


def paired_ratio_difference(
    a: Mapping[str, Sequence[float]], b: Mapping[str, Sequence[float]], *, confidence: float = 0.95,
    resamples: int = 10_000, seed: int = 0,
) -> dict[str, float] | None:
    """The change of a pooled rate, ``sum(num_a) / sum(den_a) - sum(num_b) / sum(den_b)``, with a
    paired percentile bootstrap over questions (a question is resampled with both its counts).

    ``a`` and ``b`` map a question to ``(mistakes, decisions)`` summed over its samples (e.g. the
    early answers among the main agent's decisions with hops left); a question missing from one side
    counts (0, 0) there. None when either side has no decision at all. Returns the keys of
    :func:`paired_difference`, fractions.

    >>> r = paired_ratio_difference({"q1": (1, 2), "q2": (0, 2)}, {"q1": (2, 2), "q2": (1, 2)})
    >>> round(r["diff"], 3), r["questions"]
    (-0.5, 2.0)
    """
    keys = sorted(set(a) | set(b))
    counts = np.array([[*(a.get(q) or (0, 0)), *(b.get(q) or (0, 0))] for q in keys], dtype=np.float64).reshape(-1, 4)
    totals = counts.sum(axis=0)
    if not keys or totals[1] == 0 or totals[3] == 0:
        return None
    diff = float(totals[0] / totals[1] - totals[2] / totals[3])
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(keys), size=(resamples, len(keys)))
    sums = counts[picks].sum(axis=1)  # [resamples, 4]
    with np.errstate(divide="ignore", invalid="ignore"):
        stats = sums[:, 0] / sums[:, 1] - sums[:, 2] / sums[:, 3]
    stats = stats[np.isfinite(stats)]  # a resample with no decision on one side has no rate
    alpha = (1.0 - confidence) / 2
    low, high = (float(np.quantile(stats, alpha)), float(np.quantile(stats, 1 - alpha))) if len(stats) else (diff, diff)
    return {"diff": diff, "low": low, "high": high, "questions": float(len(keys)), "confidence": confidence}
