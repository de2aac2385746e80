"""WebWalkerQA (``WebWalkerQA(data)``): questions that start from a root URL.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from mgrpo_scenarios.base import Task

from .common import OpenWebScenario, _read_rows, _single_file

# ----------------------------------------------------------------------------- WebWalkerQA


def _lower_keys(row: Mapping[str, Any]) -> dict[str, Any]:
    return {str(k).lower(): v for k, v in row.items()}


class WebWalkerQA(OpenWebScenario):
    """WebWalkerQA from its released JSON (see the module docstring).

    Args:
        data: the JSON / JSONL file, or a folder holding one.
        include_root_url: name the root URL in the question (WebWalker starts every agent there).
        judge, and the world options of :class:`OpenWebWorld` (``allow_origins`` for a local mirror).

    Split: ``main``. ``kind`` is ``<type>/<difficulty>`` (e.g. ``multi_source/hard``); ``metadata``
    holds ``root_url``, ``difficulty_level``, ``type``, ``lang``, ``domain``, ``source_website``,
    ``golden_path``, ``raw_question``. Long free-text answers make exact match strict: configure a judge.
    """

    name = "webwalkerqa"
    default_split = "main"

    def __init__(self, data: str | Path, *, include_root_url: bool = True, **kwargs: Any) -> None:
        super().__init__(data, **kwargs)
        self.include_root_url = include_root_url

    def _load(self, split: str) -> Iterator[Task]:
        path = _single_file(self.data, ("*.jsonl", "*.json"), self.name)
        for i, raw in enumerate(_read_rows(path)):
            row = _lower_keys(raw)
            info = _lower_keys(row.get("info") or {})
            question, root = str(row["question"]), str(row.get("root_url") or "")
            qtype = str(info.get("type") or info.get("hop") or "").replace("-", "_").lower()
            difficulty = str(info.get("difficulty_level") or "").lower()
            answer = row.get("answer", "")
            aliases: tuple[str, ...] = ()
            if isinstance(answer, list):  # some variants give several accepted answers
                answer, aliases = str(answer[0]) if answer else "", tuple(str(a) for a in answer[1:])
            shown = f"{question}\n\nStart from the website {root}" if (root and self.include_root_url) else question
            yield Task(
                id=f"webwalkerqa-{row.get('id') or i}",
                question=shown,
                answer=str(answer),
                split=split,
                kind=f"{qtype or 'unknown'}/{difficulty or 'unknown'}",
                aliases=aliases,
                metadata={
                    "benchmark": self.name,
                    "root_url": root,
                    "difficulty_level": difficulty,
                    "type": qtype,
                    "lang": info.get("lang") or info.get("language") or "",
                    "domain": info.get("domain") or "",
                    "source_website": info.get("source_website") or [],
                    "golden_path": info.get("golden_path") or [],
                    "raw_question": question,
                },
            )
