"""XBench-DeepSearch (``XBenchDeepSearch(data)``) and its row obfuscation (:func:`xbench_decrypt`).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mgrpo_scenarios.base import Task

from .common import OpenWebScenario, _read_rows, _single_file

# ----------------------------------------------------------------------------- XBench obfuscation


def _xor(data: bytes, key: str) -> bytes:
    key_bytes = key.encode("utf-8")
    if not key_bytes:
        raise ValueError("the XBench key (canary) is empty")
    return bytes(b ^ key_bytes[i % len(key_bytes)] for i, b in enumerate(data))


def xbench_encrypt(text: str, key: str) -> str:
    """``base64(utf8(text) XOR utf8(key) repeated)``: how XBench obfuscates ``prompt`` and ``answer``."""
    return base64.b64encode(_xor(text.encode("utf-8"), key)).decode("ascii")


def xbench_decrypt(field: str, key: str) -> str:
    """Inverse of :func:`xbench_encrypt` (the row's ``canary`` is the key). Raises ``ValueError``."""
    try:
        raw = base64.b64decode(field.strip(), validate=True)
        return _xor(raw, key).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError) as exc:
        raise ValueError(f"not an XBench-obfuscated field: {exc}") from exc


# ----------------------------------------------------------------------------- XBench-DeepSearch


class XBenchDeepSearch(OpenWebScenario):
    """XBench-DeepSearch from its released CSV (see the module docstring).

    Args:
        data: the CSV (``DeepSearch.csv``), a JSON/JSONL file, or a folder holding one.
        judge, and the world options of :class:`OpenWebWorld`.

    Split: ``test`` (the whole file). ``kind`` is the row's ``type`` column when present, else
    ``deepsearch``; every other column (canary excluded) is kept in ``metadata``.
    """

    name = "xbench-deepsearch"
    default_split = "test"

    def __init__(self, data: str | Path, *, encrypted: bool | None = None, **kwargs: Any) -> None:
        super().__init__(data, **kwargs)
        self.encrypted = encrypted

    def _is_encrypted(self, rows: list[dict[str, Any]]) -> bool:
        """Auto-detect: every prompt decodes with its row's canary (plain prompts have spaces, which
        base64 refuses)."""
        if self.encrypted is not None:
            return self.encrypted
        for row in rows:
            key, prompt = str(row.get("canary") or ""), str(row.get("prompt") or "")
            if not key or not prompt:
                return False
            try:
                xbench_decrypt(prompt, key)
            except ValueError:
                return False
        return bool(rows)

    def _load(self, split: str) -> Iterator[Task]:
        path = _single_file(self.data, ("*.csv", "*.jsonl", "*.json"), self.name)
        rows = _read_rows(path)
        encrypted = self._is_encrypted(rows)
        for i, row in enumerate(rows):
            key = str(row.get("canary") or "")
            prompt, answer = str(row.get("prompt") or row.get("question") or ""), str(row.get("answer") or "")
            if encrypted:
                try:
                    prompt, answer = xbench_decrypt(prompt, key), xbench_decrypt(answer, key) if answer else ""
                except ValueError as exc:
                    raise ValueError(f"{path}: row {i + 1} does not decode with its canary: {exc}") from exc
            extra = {k: v for k, v in row.items() if k not in ("prompt", "question", "answer", "canary")}
            yield Task(
                id=f"xbench-{row.get('id') or i}",
                question=prompt,
                answer=answer,
                split=split,
                kind=str(row.get("type") or "deepsearch"),
                metadata={"benchmark": self.name, **extra},
            )
