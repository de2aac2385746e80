"""Answer verifiers: normalised exact match, SQuAD-style token F1, and an LLM judge.

``AnswerVerifier(judge=None).verify(task, prediction)`` gives the :class:`Verdict` a scenario returns:
``correct`` is the r_correct bit of the reward (exact match against the answer or an alias, or the
judge's CORRECT when a judge is configured and exact match fails), ``score`` is the token F1 (1.0 when
correct).

:class:`LLMJudge` talks to any OpenAI-compatible ``/chat/completions`` endpoint (vLLM, SGLang, a
hosted API). Besides correctness it grades a sub-agent's report on its subtask from 0 to 10
(:meth:`LLMJudge.score_subtask`), the r_expert term of the sub-agent's reward in M-GRPO.
"""

from __future__ import annotations

import logging
import os
import re
import string
import time
import unicodedata
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # httpx loads only when a judge is built (mgrpo_env imports these verifiers)
    import httpx

from .base import Task, Verdict

__all__ = [
    "normalize_answer",
    "exact_match",
    "token_f1",
    "JudgeError",
    "LLMJudge",
    "AnswerVerifier",
    "CORRECTNESS_PROMPT",
    "SUBTASK_PROMPT",
]

log = logging.getLogger(__name__)

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")
_DECIMAL = re.compile(r"(?<=\d)\.(?=\d)")
_APOSTROPHES = re.compile(r"['\u2018\u2019\u02bc`]")
_WS = re.compile(r"\s+")
_DECIMAL_MARK = "\uf8ff"  # a private-use placeholder that keeps "3.5" intact through punctuation removal


def _is_punct(ch: str) -> bool:
    return ch in string.punctuation or unicodedata.category(ch).startswith("P")


def normalize_answer(s: str) -> str:
    """Normalise an answer for comparison (SQuAD's rules, made unicode- and number-aware).

    NFKC, lower-case; apostrophes removed (``O'Brien`` -> ``obrien``); thousands separators removed
    (``1,000`` -> ``1000``) and decimal points between digits kept (``3.5``); every other punctuation
    character becomes a space (``New-York`` -> ``new york``); the articles a/an/the dropped; whitespace
    collapsed. Digits and non-Latin letters are kept.
    """
    text = unicodedata.normalize("NFKC", s or "").lower()
    text = _APOSTROPHES.sub("", text)
    text = _THOUSANDS.sub("", text)
    text = _DECIMAL.sub(_DECIMAL_MARK, text)
    text = "".join(" " if _is_punct(ch) else ch for ch in text)
    text = text.replace(_DECIMAL_MARK, ".")
    text = _ARTICLES.sub(" ", text)
    return _WS.sub(" ", text).strip()


def _golds(gold: str, aliases: Iterable[str]) -> list[str]:
    return [g for g in (gold, *aliases) if g is not None]


def exact_match(prediction: str, gold: str, aliases: Iterable[str] = ()) -> bool:
    """True when the normalised prediction equals the normalised gold answer or one of its aliases."""
    pred = normalize_answer(prediction)
    return any(pred == normalize_answer(g) for g in _golds(gold, aliases))


def _f1(prediction: str, gold: str) -> float:
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)
    common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if common == 0:
        return 0.0
    precision = common / len(pred_tokens)
    recall = common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def token_f1(prediction: str, gold: str, aliases: Iterable[str] = ()) -> float:
    """SQuAD token F1 between the normalised prediction and gold, the maximum over gold and aliases."""
    return max(_f1(prediction, g) for g in _golds(gold, aliases))


# ----------------------------------------------------------------------------- LLM judge

CORRECTNESS_PROMPT = """You are grading the final answer to a research question.

Question: {question}
Gold answer: {gold}
Predicted answer: {prediction}

The predicted answer is CORRECT if it means the same as the gold answer: the same entity, number,
date or fact, allowing for different spelling, formatting, abbreviation, units written differently
or extra words that do not change the meaning. It is INCORRECT if it is wrong, names something
else, is only partially right, hedges between several answers, or gives no answer.

Reply with exactly one word: CORRECT or INCORRECT."""

SUBTASK_PROMPT = """You are grading how well a research assistant completed a subtask.

Subtask: {task}
Reference answer: {gold}
Assistant's report: {report}

Grade the report from 0 to 10:
10 = fully answers the subtask, consistent with the reference answer, precise and well supported;
5 = partially answers it, or the right answer is buried in vague or unsupported text;
0 = wrong, irrelevant, empty, or a refusal.

Reply with the integer grade only, e.g. "7"."""

_THINK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL | re.IGNORECASE)
_VERDICT_WORD = re.compile(r"\b(INCORRECT|CORRECT|NOT\s+CORRECT)\b", re.IGNORECASE)
_GRADE_PATTERNS = (
    re.compile(r"\b(?:grade|score)\s*[:=]?\s*(\d{1,2})(?:\s*/\s*10)?\b", re.IGNORECASE),
    re.compile(r"\b(\d{1,2})\s*/\s*10\b"),
    re.compile(r"^\D*?(\d{1,2})\b"),
)


class JudgeError(RuntimeError):
    """The judge could not be reached or answered with an error, after retries."""


def parse_correctness(reply: str) -> bool | None:
    """``True`` for CORRECT, ``False`` for INCORRECT / NOT CORRECT, ``None`` when neither is said.

    Reasoning in ``<think>`` is ignored; when several verdict words appear the last one counts
    (models tend to conclude at the end).
    """
    text = _THINK.sub(" ", reply or "")
    words = _VERDICT_WORD.findall(text)
    if not words:
        return None
    return _WS.sub(" ", words[-1].upper()) == "CORRECT"


def parse_grade(reply: str) -> int | None:
    """The 0..10 grade in ``reply`` ("7", "Score: 7", "7/10"), or ``None``."""
    text = _THINK.sub(" ", reply or "").strip()
    for pattern in _GRADE_PATTERNS:
        m = pattern.search(text)
        if m and 0 <= int(m.group(1)) <= 10:
            return int(m.group(1))
    return None


class LLMJudge:
    """A grader behind an OpenAI-compatible chat completions endpoint.

    Args:
        base_url: e.g. ``http://127.0.0.1:8000/v1``; requests go to ``{base_url}/chat/completions``.
        model: the served model name.
        api_key: bearer token; defaults to ``MGRPO_JUDGE_API_KEY`` then ``OPENAI_API_KEY`` (none: no header).
        timeout_s: per request.
        max_retries: extra attempts after a connection error, a timeout, HTTP 429 or 5xx
            (other 4xx fail at once); waits ``backoff_s * 2**attempt`` between attempts.
        temperature, max_tokens: sampling settings sent with every request (greedy by default; leave
            room for reasoning models that think before the verdict).
        client: an ``httpx.Client`` to reuse (tests, connection pooling).

    Network and HTTP failures raise :class:`JudgeError`; an unparseable reply is not an error: it is
    graded INCORRECT (score 0) with ``details["parse_error"] = True``.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 30.0,
        max_retries: int = 2,
        backoff_s: float = 0.5,
        temperature: float = 0.0,
        max_tokens: int | None = 1024,
        client: httpx.Client | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key or os.environ.get("MGRPO_JUDGE_API_KEY") or os.environ.get("OPENAI_API_KEY")
        self.timeout_s = timeout_s
        self.max_retries = max(0, int(max_retries))
        self.backoff_s = backoff_s
        self.temperature = temperature
        self.max_tokens = max_tokens
        import httpx

        self._client = client or httpx.Client(timeout=timeout_s)

    def complete(self, prompt: str) -> str:
        """Send one user message and return the assistant's text; :class:`JudgeError` after retries."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
            "temperature": self.temperature,
        }
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        url = f"{self.base_url}/chat/completions"
        import httpx

        last = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                response = self._client.post(url, json=body, headers=headers, timeout=self.timeout_s)
            except httpx.TimeoutException as exc:
                last = f"timeout after {self.timeout_s}s ({type(exc).__name__})"
                continue
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
                continue
            if response.status_code == 429 or response.status_code >= 500:
                last = f"HTTP {response.status_code}: {response.text[:200]!r}"
                continue
            if response.status_code >= 400:
                raise JudgeError(
                    f"judge at {url} refused the request: HTTP {response.status_code}: {response.text[:300]!r}"
                )
            try:
                message = response.json()["choices"][0]["message"]
                content = message.get("content") or message.get("reasoning_content") or ""
            except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
                raise JudgeError(
                    f"judge at {url} sent an unexpected response: {response.text[:300]!r}"
                ) from exc
            return str(content)
        raise JudgeError(f"judge at {url} failed after {self.max_retries + 1} attempts: {last}")

    def judge(self, question: str, gold: str, prediction: str, aliases: Iterable[str] = ()) -> Verdict:
        """Is ``prediction`` a correct answer to ``question``? ``score`` is 1.0 or 0.0."""
        aliases = [a for a in aliases if a]
        gold_text = gold + (f" (also accepted: {'; '.join(aliases)})" if aliases else "")
        reply = self.complete(
            CORRECTNESS_PROMPT.format(question=question, gold=gold_text, prediction=prediction)
        )
        correct = parse_correctness(reply)
        details: dict[str, Any] = {"method": "llm_judge", "model": self.model, "raw": reply}
        if correct is None:
            log.warning("judge reply has no CORRECT/INCORRECT verdict: %r", reply[:200])
            details["parse_error"] = True
        return Verdict(correct=bool(correct), score=1.0 if correct else 0.0, details=details)

    def grade_subtask(self, task: str, gold: str, report: str) -> Verdict:
        """Grade a sub-agent's ``report`` on ``task`` 0..10 -> ``score`` in [0, 1] (``correct``: score >= 0.5)."""
        reply = self.complete(SUBTASK_PROMPT.format(task=task, gold=gold, report=report))
        grade = parse_grade(reply)
        details: dict[str, Any] = {
            "method": "llm_judge_subtask",
            "model": self.model,
            "raw": reply,
            "grade": grade,
        }
        if grade is None:
            log.warning("judge reply has no 0-10 grade: %r", reply[:200])
            details["parse_error"] = True
        score = (grade or 0) / 10.0
        return Verdict(correct=score >= 0.5, score=score, details=details)

    def score_subtask(self, task: str, gold: str, report: str) -> float:
        """The expert reward r_expert in [0, 1] of a sub-agent's report (0 when the reply has no grade)."""
        return self.grade_subtask(task, gold, report).score

    def close(self) -> None:
        self._client.close()


class AnswerVerifier:
    """Exact match, then (optionally) an LLM judge.

    ``verify`` returns ``correct`` = exact match against the answer or an alias; ``score`` = token F1.
    When a judge is configured and exact match fails, the judge decides ``correct``, and a CORRECT
    verdict lifts ``score`` to 1.0. :class:`JudgeError` propagates: the caller decides (retry later,
    fall back to exact match, drop the rollout).
    """

    def __init__(self, judge: LLMJudge | None = None) -> None:
        self.judge = judge

    def verify(self, task: Task, prediction: str) -> Verdict:
        prediction = prediction or ""
        em = exact_match(prediction, task.answer, task.aliases)
        f1 = token_f1(prediction, task.answer, task.aliases)
        details: dict[str, Any] = {"exact_match": em, "f1": f1, "method": "exact_match"}
        if em or self.judge is None or not prediction.strip():
            return Verdict(correct=em, score=1.0 if em else f1, details=details)
        verdict = self.judge.judge(task.question, task.answer, prediction, task.aliases)
        details.update({"method": "llm_judge", "judge": dict(verdict.details)})
        return Verdict(correct=verdict.correct, score=1.0 if verdict.correct else f1, details=details)
