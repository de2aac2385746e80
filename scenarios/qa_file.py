"""``qa-file``: any question/answer dataset file as an open-web scenario.

Description:
    Each row of a table is a task: its question column is what the main agent is asked, its answer
    column the gold answer. The agents work on the open web (``search``, ``visit``, ``click`` through
    :class:`~mgrpo_scenarios.web_qa.OpenWebWorld`), as for the paper's benchmarks.

Data:
    ``.jsonl``, ``.json``, ``.csv``, ``.parquet``, or a Hugging Face ``datasets`` dataset saved with
    ``save_to_disk`` (see :mod:`mgrpo_scenarios.tables`). An answer cell may be a list (the first is
    the gold answer, the rest accepted aliases); an ``aliases_column`` adds more.

Arguments:
    data: the file or saved-dataset folder.
    question_column, answer_column: the columns to read (default ``question`` / ``answer``).
    id_column: a column of stable ids (default: ``qa-<row number>``).
    aliases_column: a column of other accepted answers (a list, or one string).
    split: the split name the tasks are given; for a saved ``DatasetDict``, one of its splits
        (default: ``test`` when there is one, else the first), and every split is available.
    judge, limit, and the world options of :class:`~mgrpo_scenarios.web_qa.OpenWebWorld`
    (``searxng_url``, ``cache_path``, ``allow_origins``, ...).

    mgrpo eval --scenario qa-file --data my.parquet --set question_column=prompt \\
        --set answer_column=gold --set searxng_url=http://127.0.0.1:8888

Verification: normalised exact match (aliases included), an LLM judge for the rest when configured.
The columns are checked when the scenario is built: a missing column fails at once, naming the
columns the file has.

Version history:
    1: first version.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .base import Task
from .tables import dataset_splits, is_saved_dataset, read_rows
from .web_qa.common import OpenWebScenario

__all__ = ["QAFile"]


class QAFile(OpenWebScenario):
    """A question/answer table as a scenario (see the module docstring)."""

    name = "qa-file"

    def __init__(self, data: str | Path, *, question_column: str = "question", answer_column: str = "answer",
                 id_column: str | None = None, aliases_column: str | None = None, split: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(data, **kwargs)
        self.columns = {"question_column": question_column, "answer_column": answer_column,
                        "id_column": id_column, "aliases_column": aliases_column}
        self._raw: dict[str, list[dict[str, Any]]] = {}
        saved = dataset_splits(self.data) if is_saved_dataset(self.data) else []
        self._splits = saved or [split or "test"]
        if split is not None and saved and split not in saved:
            raise ValueError(f"qa-file: {self.data} has no split {split!r}; it has {saved}")
        self.default_split = split or ("test" if "test" in self._splits else self._splits[0])
        self.metadata.update({k: v for k, v in self.columns.items() if v})
        self._check_columns(self.default_split)

    def splits(self) -> list[str]:
        return list(self._splits)

    def _rows(self, split: str) -> list[dict[str, Any]]:
        if split not in self._raw:
            self._raw[split] = read_rows(self.data, split)  # a plain file ignores the split
        return self._raw[split]

    def _check_columns(self, split: str) -> None:
        rows = self._rows(split)
        if not rows:
            raise ValueError(f"qa-file: {self.data} has no rows")
        have = list(rows[0])
        for option, column in self.columns.items():
            if column is not None and column not in have:
                raise ValueError(f"qa-file: {option}={column!r} is not a column of {self.data} "
                                 f"(columns: {', '.join(map(str, have))})")

    def _load(self, split: str) -> Iterator[Task]:
        cols = self.columns
        for i, row in enumerate(self._rows(split)):
            answer = row[cols["answer_column"]]
            aliases: list[str] = []
            if isinstance(answer, (list, tuple)):
                answer, aliases = (answer[0] if answer else ""), [str(a) for a in answer[1:]]
            if cols["aliases_column"]:
                extra = row.get(cols["aliases_column"]) or []
                aliases += [str(extra)] if isinstance(extra, str) else [str(a) for a in extra]
            task_id = str(row[cols["id_column"]]) if cols["id_column"] else f"qa-{i}"
            used = {c for c in cols.values() if c}
            yield Task(
                id=task_id,
                question=str(row[cols["question_column"]]),
                answer=str(answer),
                split=split,
                kind="qa",
                aliases=tuple(aliases),
                metadata={"benchmark": self.name, "row": i,
                          **{k: v for k, v in row.items() if k not in used and _plain(v)}},
            )


def _plain(value: Any) -> bool:
    """A metadata value that survives JSON (episode records are written as JSONL)."""
    return value is None or isinstance(value, (str, int, float, bool))
