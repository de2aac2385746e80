"""GAIA (``Gaia(data, split="validation")``) and its quasi-exact match (:func:`gaia_match`).
"""

from __future__ import annotations

import mimetypes
import re
import string
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mgrpo_scenarios.base import Task, Verdict

from ..verifiers import exact_match, token_f1
from .common import OpenWebScenario, _read_rows

# ----------------------------------------------------------------------------- GAIA scoring rules


def gaia_normalize_number(text: str) -> float:
    """GAIA's number reading: drop ``$``, ``%`` and ``,`` then ``float``; ``inf`` when not a number."""
    cleaned = str(text)
    for ch in ("$", "%", ","):
        cleaned = cleaned.replace(ch, "")
    try:
        return float(cleaned)
    except ValueError:
        return float("inf")


def gaia_normalize_str(text: str, remove_punct: bool = True) -> str:
    """GAIA's string normalisation: remove all whitespace, lower-case, optionally drop ASCII punctuation."""
    squeezed = re.sub(r"\s", "", str(text)).lower()
    if remove_punct:
        squeezed = squeezed.translate(str.maketrans("", "", string.punctuation))
    return squeezed


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def gaia_match(prediction: str | None, gold: str) -> bool:
    """GAIA's quasi-exact match (the leaderboard's rules).

    * gold is a number: the prediction, read as a number (``$``, ``%``, ``,`` ignored), must equal it.
    * gold holds ``,`` or ``;``: both are split on those characters into lists of the same length,
      compared element by element (numbers as numbers; strings without whitespace, case-insensitive,
      punctuation kept).
    * otherwise: strings compared without whitespace, case or punctuation.
    """
    pred = "None" if prediction is None else str(prediction)
    gold = str(gold)
    if _is_number(gold):
        return gaia_normalize_number(pred) == float(gold)
    if "," in gold or ";" in gold:
        gold_items = re.split(r"[,;]", gold)
        pred_items = re.split(r"[,;]", pred)
        if len(gold_items) != len(pred_items):
            return False
        for p, g in zip(pred_items, gold_items, strict=True):
            if _is_number(g):
                if gaia_normalize_number(p) != float(g):
                    return False
            elif gaia_normalize_str(p, remove_punct=False) != gaia_normalize_str(g, remove_punct=False):
                return False
        return True
    return gaia_normalize_str(pred) == gaia_normalize_str(gold)


# ----------------------------------------------------------------------------- GAIA

TEXT_SUFFIXES = frozenset(
    [".txt", ".csv", ".tsv", ".json", ".jsonl", ".jsonld", ".md", ".py", ".xml", ".html", ".htm", ".yaml", ".yml", ".log", ".tex", ".ini", ".cfg", ".toml", ".js", ".sql", ".pdb", ".srt", ".rst", ".r", ".c", ".cpp", ".java", ".sh"]
)


GAIA_METADATA = ("metadata.jsonl", "metadata.parquet")


class Gaia(OpenWebScenario):
    """GAIA (Mialon et al. 2023) from a local copy of the dataset (see the module docstring).

    Args:
        data: the dataset folder (holding ``2023/<split>/metadata.jsonl`` or ``metadata.parquet``), a
            split folder, or a metadata file.
        split: the default split (``validation``; ``test`` has no public answers).
        attachment_chars: most characters of an attached text file inlined in the question.
        judge, and the world options of :class:`OpenWebWorld`.

    Tasks: ``kind`` is ``level1`` / ``level2`` / ``level3`` (so per-kind accuracy is per level);
    ``metadata`` holds ``level``, ``file_name``, ``file_path`` (absolute, or ``None``),
    ``annotator_metadata`` and ``raw_question``.
    """

    name = "gaia"

    def __init__(self, data: str | Path, split: str = "validation", *, attachment_chars: int = 20_000,
                 **kwargs: Any) -> None:
        super().__init__(data, **kwargs)
        self.default_split = split
        self.attachment_chars = attachment_chars
        self.metadata["attachment_chars"] = attachment_chars

    def _metadata_file(self, split: str) -> Path | None:
        if self.data.is_file():
            return self.data if split == self.default_split else None
        for name in GAIA_METADATA:  # the Hub's copy now ships metadata.parquet; older copies metadata.jsonl
            for candidate in (self.data / "2023" / split / name, self.data / split / name):
                if candidate.is_file():
                    return candidate
        for name in GAIA_METADATA:
            direct = self.data / name
            if direct.is_file() and split == self.default_split:
                return direct
        return None

    def splits(self) -> list[str]:
        found = [s for s in dict.fromkeys((self.default_split, "validation", "test")) if self._metadata_file(s)]
        if not found:
            raise FileNotFoundError(
                f"gaia: no metadata.jsonl or metadata.parquet for split {self.default_split!r} under "
                f"{str(self.data)!r} (expected 2023/<split>/metadata.jsonl, <split>/metadata.jsonl or "
                "metadata.jsonl; .parquet alike)"
            )
        return found

    def attachment_context(self, path: Path) -> str:
        """How an attached file appears in the question: its text (truncated) or its name and type."""
        kind = mimetypes.guess_type(path.name)[0] or (path.suffix.lstrip(".") or "unknown")
        if not path.is_file():
            return f"Attached file: {path.name} ({kind}); the file is missing from the dataset copy."
        size = path.stat().st_size
        if path.suffix.lower() in TEXT_SUFFIXES:
            text = path.read_text(encoding="utf-8", errors="replace").rstrip("\n")
            note = ""
            if len(text) > self.attachment_chars:
                note = (f"\n[... truncated: showing the first {self.attachment_chars} of {len(text)} "
                        "characters ...]")
                text = text[: self.attachment_chars]
            return f"Attached file: {path.name} ({kind}, {size} bytes). Its content:\n<file>\n{text}{note}\n</file>"
        return (f"Attached file: {path.name} ({kind}, {size} bytes); it is a binary file whose content "
                "is not shown here.")

    def _load(self, split: str) -> Iterator[Task]:
        meta_file = self._metadata_file(split)
        assert meta_file is not None
        for row in _read_rows(meta_file):
            question = str(row["Question"])
            file_name = str(row.get("file_name") or "").strip()
            file_path = (meta_file.parent / file_name).resolve() if file_name else None
            shown = question if file_path is None else f"{question}\n\n{self.attachment_context(file_path)}"
            level = int(row.get("Level") or 0)
            yield Task(
                id=str(row["task_id"]),
                question=shown,
                answer=str(row.get("Final answer", "")),
                split=split,
                kind=f"level{level}",
                metadata={
                    "benchmark": "gaia",
                    "level": level,
                    "file_name": file_name,
                    "file_path": str(file_path) if file_path else None,
                    "annotator_metadata": row.get("Annotator Metadata") or {},
                    "raw_question": question,
                },
            )

    def verify(self, task: Task, prediction: str) -> Verdict:
        prediction = prediction or ""
        quasi = gaia_match(prediction, task.answer)
        em = exact_match(prediction, task.answer, task.aliases)
        f1 = token_f1(prediction, task.answer, task.aliases)
        details: dict[str, Any] = {"gaia_match": quasi, "exact_match": em, "f1": f1, "method": "gaia"}
        correct = quasi or em
        if not correct and self.judge is not None and prediction.strip():
            verdict = self.judge.judge(task.question, task.answer, prediction, task.aliases)
            details.update({"method": "llm_judge", "judge": dict(verdict.details)})
            correct = verdict.correct
        return Verdict(correct=correct, score=1.0 if correct else f1, details=details)
