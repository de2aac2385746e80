"""Rows of a question/answer table, from whatever file a dataset came as.

:func:`read_rows` reads ``.jsonl``, ``.json`` (a list, or ``{"data": [...]}``), ``.csv``, ``.parquet``
(pyarrow) and a Hugging Face ``datasets`` dataset saved with ``save_to_disk`` (a folder; read with
``datasets.load_from_disk`` when installed, else straight from its Arrow files with pyarrow).
:func:`dataset_splits` lists the splits of a saved ``DatasetDict`` folder.
Every row is a plain ``dict`` of Python values (nested structs become dicts, lists stay lists).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

__all__ = ["read_rows", "dataset_splits", "is_saved_dataset", "TABLE_SUFFIXES"]

#: File types :func:`read_rows` reads (a saved ``datasets`` folder besides).
TABLE_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")


def is_saved_dataset(path: Path) -> bool:
    """``path`` is a folder written by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk``."""
    return path.is_dir() and ((path / "state.json").is_file() or (path / "dataset_dict.json").is_file())


def dataset_splits(path: Path) -> list[str]:
    """The splits of a saved ``DatasetDict`` folder (``[]`` for a single saved ``Dataset``)."""
    index = path / "dataset_dict.json"
    if not index.is_file():
        return []
    return [str(s) for s in json.loads(index.read_text()).get("splits", [])]


def _read_saved_dataset(path: Path, split: str | None) -> list[dict[str, Any]]:
    splits = dataset_splits(path)
    if splits:
        if split is None:
            raise ValueError(f"{path}: a saved DatasetDict with splits {splits}; name one (split=...)")
        if split not in splits:
            raise ValueError(f"{path}: no split {split!r}; it has {splits}")
        path = path / split
    try:
        import datasets
    except ImportError:
        datasets = None
    if datasets is not None:
        return [dict(row) for row in datasets.load_from_disk(str(path))]
    import pyarrow as pa

    state = json.loads((path / "state.json").read_text())
    tables = []
    for entry in state.get("_data_files", []):
        with pa.memory_map(str(path / entry["filename"])) as source:
            tables.append(pa.ipc.open_stream(source).read_all())
    return pa.concat_tables(tables).to_pylist() if tables else []


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:  # pragma: no cover - pyarrow is a dependency
        raise ValueError(f"{path}: reading parquet needs pyarrow (pip install pyarrow)") from exc
    return pq.read_table(path).to_pylist()


def read_rows(path: str | Path, split: str | None = None) -> list[dict[str, Any]]:
    """The rows of the table at ``path`` (see the module docstring).

    ``split`` picks a split of a saved ``DatasetDict``; files ignore it.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: an unsupported file type, or a malformed file (the message names the file).
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"data path {str(path)!r} does not exist")
    if is_saved_dataset(path):
        return _read_saved_dataset(path, split)
    if path.is_dir():
        raise ValueError(f"{path}: a folder, but not one written by datasets' save_to_disk; name a file "
                         f"({', '.join(TABLE_SUFFIXES)})")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return _read_parquet(path)
    if suffix == ".csv":
        with path.open(encoding="utf-8-sig", newline="") as f:
            return [dict(r) for r in csv.DictReader(f)]
    if suffix not in (".jsonl", ".json"):
        raise ValueError(f"{path}: unsupported file type {suffix!r} (expected {', '.join(TABLE_SUFFIXES)} "
                         "or a datasets save_to_disk folder)")
    text = path.read_text(encoding="utf-8-sig")
    try:
        if suffix == ".jsonl":
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        try:
            data = json.loads(text)
        except json.JSONDecodeError:  # some releases name a JSONL file .json
            return [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON lines: {exc}") from None
    if isinstance(data, dict):
        data = data.get("data") or data.get("rows") or [data]
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of rows")
    return data
