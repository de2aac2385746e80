"""Loaders for the paper's evaluation benchmarks: GAIA, XBench-DeepSearch and WebWalkerQA.

Each is a :class:`~mgrpo_scenarios.Scenario` over files the user has downloaded (nothing is fetched
here); the world the agents act in is the open web, through a real search backend and the URL policy.

* :class:`Gaia` - ``Gaia(data, split="validation")``. ``data`` is the dataset folder (``2023/`` inside
  it, or a split folder, or a ``metadata.jsonl`` / ``metadata.parquet`` file). Rows: ``task_id``,
  ``Question``, ``Level``, ``Final answer``, ``file_name``, ``Annotator Metadata``. An attached file
  is inlined in the question (text-like files, truncated with a note) or named with its type (binary
  files). Scored with GAIA's quasi-exact match (:func:`gaia_match`).
* :class:`XBenchDeepSearch` - ``XBenchDeepSearch(data)``: the released CSV (``id``, ``prompt``,
  ``answer``, ``canary``, other columns kept as metadata), or JSON / JSONL rows with the same fields.
  ``prompt`` and ``answer`` are obfuscated: ``base64(xor(utf8(text), utf8(canary) repeated))``, the
  key being the row's own ``canary`` string (:func:`xbench_decrypt`). Already-decrypted files load too.
* :class:`WebWalkerQA` - ``WebWalkerQA(data)``: a JSON list (or JSONL) of rows ``question``,
  ``answer``, ``root_url``, ``info`` {``difficulty_level``, ``type``, ``lang``, ``domain``,
  ``source_website``, ``golden_path``}; the README's capitalised spelling (``Question``, ``Root_Url``,
  ``Info`` {``Difficulty_Level``, ``Hop``, ...}) is accepted as well. The question given to the agent
  names the root URL to start from.

Verification: normalised exact match always (GAIA: its own quasi-exact match); when ``judge`` is
configured (``judge={"base_url": ..., "model": ...}`` or an :class:`LLMJudge`) the judge decides the
cases exact match rejects (XBench and WebWalkerQA grade with an LLM judge in their own evaluations).

World (``open()``): ``search`` over SearxNG (``searxng_url=`` or ``$MGRPO_SEARXNG_URL``) or Brave
(``$BRAVE_SEARCH_API_KEY``), ``visit`` and ``click`` through a :class:`UrlPolicy` for the open web (no
private or loopback addresses; ``allow_origins=[...]`` admits exact origins such as a local mirror),
and a SQLite :class:`ResponseCache` on by default (``cache_path``, default
``$MGRPO_DATA_DIR/responses.sqlite`` or ``~/.cache/mgrpo/responses.sqlite``; ``cache_path=False``
turns it off) so that repeated evaluations replay fetches and searches.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import mimetypes
import os
import re
import string
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from mgrpo_scenarios.base import Task, Verdict, require_browser
from mgrpo_tools.base import Tool

from .tables import read_rows
from .verifiers import AnswerVerifier, LLMJudge, exact_match, token_f1

__all__ = [
    "VERSION",
    "Gaia",
    "XBenchDeepSearch",
    "WebWalkerQA",
    "OpenWebWorld",
    "make_search_backend",
    "make_judge",
    "gaia_match",
    "gaia_normalize_number",
    "gaia_normalize_str",
    "xbench_encrypt",
    "xbench_decrypt",
    "default_cache_path",
]

VERSION = "1"
SEARXNG_ENV = "MGRPO_SEARXNG_URL"
BRAVE_ENV = "BRAVE_SEARCH_API_KEY"

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


# ----------------------------------------------------------------------------- world


def default_cache_path() -> Path:
    base = Path(os.environ.get("MGRPO_DATA_DIR") or Path.home() / ".cache" / "mgrpo")
    return base / "responses.sqlite"


def make_search_backend(searxng_url: str | None = None, search: str | None = None,
                        brave_api_key: str | None = None) -> Any:
    """The search backend: ``search="searxng"|"brave"`` or automatic (SearxNG when ``searxng_url`` or
    ``$MGRPO_SEARXNG_URL`` is set, else Brave when ``$BRAVE_SEARCH_API_KEY`` is set).

    Raises:
        ValueError: none configured (the message says what to set).
    """
    from mgrpo_tools.search import BraveSearchBackend, SearxngBackend

    if search not in (None, "searxng", "brave"):
        raise ValueError(f"search must be 'searxng' or 'brave', got {search!r}")
    url = searxng_url or os.environ.get(SEARXNG_ENV, "").strip()
    key = brave_api_key or os.environ.get(BRAVE_ENV, "").strip()
    if search == "searxng" or (search is None and url):
        if not url:
            raise ValueError(f"search='searxng' needs searxng_url= or ${SEARXNG_ENV}")
        return SearxngBackend(url)
    if search == "brave" or (search is None and key):
        return BraveSearchBackend(key or None)
    raise ValueError(
        "open-web benchmarks need a search backend: pass searxng_url='http://host:port' (or set "
        f"${SEARXNG_ENV}) for a SearxNG instance with JSON output enabled, or set ${BRAVE_ENV} "
        "for the Brave Search API"
    )


class OpenWebWorld:
    """The open web as a world: ``search`` (SearxNG or Brave), ``visit`` and ``click``.

    Args:
        searxng_url, search, brave_api_key: see :func:`make_search_backend`; ``backend`` overrides them.
        allow_origins: exact origins (``http://127.0.0.1:8080``) admitted although private (a local
            mirror, a test site); everything else must be a public address.
        cache_path: SQLite response cache; ``None`` -> :func:`default_cache_path`, ``False`` -> no cache.
        cache_mode: ``readwrite`` (default), ``replay``, ``record`` or ``off``.
        browser_mode: ``auto`` (Chromium for pages that need JavaScript), ``never`` or ``always``.
        page_chars: characters per page of text shown by ``visit``.
        k: search results per query.
    """

    def __init__(
        self,
        *,
        searxng_url: str | None = None,
        search: str | None = None,
        brave_api_key: str | None = None,
        backend: Any = None,
        allow_origins: Iterable[str] = (),
        cache_path: str | Path | None | bool = None,
        cache_mode: str = "readwrite",
        browser_mode: str = "auto",
        page_chars: int = 4000,
        k: int = 5,
    ) -> None:
        from mgrpo_tools.browser import BrowserFetcher
        from mgrpo_tools.cache import ResponseCache
        from mgrpo_tools.fetch import HttpFetcher
        from mgrpo_tools.search import SearchTool
        from mgrpo_tools.url_policy import UrlPolicy

        if browser_mode not in ("auto", "never", "always"):
            raise ValueError(f"browser_mode must be 'auto', 'never' or 'always', got {browser_mode!r}")
        self.browser_mode = browser_mode
        self.page_chars = page_chars
        self.cache = self.http = self.browser = self.backend = None
        self.search = None
        try:
            self.backend = backend if backend is not None else make_search_backend(searxng_url, search, brave_api_key)
            if cache_path is not False:
                path = default_cache_path() if cache_path in (None, True) else Path(cache_path)  # type: ignore[arg-type]
                self.cache = ResponseCache(path, mode=cache_mode)
            self.policy = UrlPolicy()
            for origin in allow_origins:
                self.policy.allow_origin(origin)
            self.http = HttpFetcher(self.policy, cache=self.cache)
            self.browser = BrowserFetcher(self.policy, cache=self.cache) if browser_mode != "never" else None
            self.search = SearchTool(self.backend, k=k, max_results=10, cache=self.cache)
            self.tools = self.make_tools()
        except BaseException:
            self.close()
            raise

    def make_tools(self) -> dict[str, Tool]:
        """A fresh ``{"search", "visit", "click"}`` set with its own browsing session."""
        from mgrpo_tools.visit import make_browsing_tools

        assert self.http is not None and self.search is not None
        return {"search": self.search, **make_browsing_tools(self.http, self.browser, self.browser_mode,
                                                             self.page_chars)}

    def close(self) -> None:
        """Stop the browser, fetcher, search backend and cache; safe to call twice."""
        for obj, method in ((self.browser, "close"), (self.http, "close"), (self.search, "close"),
                            (self.backend, "close"), (self.cache, "close")):
            if obj is not None and hasattr(obj, method):
                with contextlib.suppress(Exception):
                    getattr(obj, method)()
        self.browser = self.http = self.cache = self.backend = None

    def __enter__(self) -> OpenWebWorld:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_WORLD_KEYS = ("searxng_url", "search", "brave_api_key", "backend", "allow_origins", "cache_path",
               "cache_mode", "browser_mode", "page_chars", "k")


def make_judge(judge: LLMJudge | Mapping[str, Any] | None) -> LLMJudge | None:
    """``None``, an :class:`LLMJudge`, or its keyword arguments (``{"base_url": ..., "model": ...}``)."""
    if judge is None or isinstance(judge, LLMJudge):
        return judge
    if isinstance(judge, Mapping):
        missing = {"base_url", "model"} - set(judge)
        if missing:
            raise ValueError(f"judge needs {sorted(missing)}; got keys {sorted(judge)}")
        return LLMJudge(**dict(judge))
    raise TypeError(f"judge must be None, an LLMJudge or a dict of its arguments, got {type(judge).__name__}")


# ----------------------------------------------------------------------------- common base


class _Benchmark(ABC):
    name = ""
    default_split = ""

    def __init__(self, data: str | Path, *, judge: LLMJudge | Mapping[str, Any] | None = None,
                 limit: int | None = None, **world: Any) -> None:
        unknown = sorted(set(world) - set(_WORLD_KEYS))
        if unknown:
            raise TypeError(f"{type(self).__name__}: unknown argument(s) {unknown}")
        self.data = Path(data).expanduser()
        if not self.data.exists():
            raise FileNotFoundError(f"{self.name}: data path {str(self.data)!r} does not exist")
        self.judge = make_judge(judge)
        self.limit = limit
        self.world_options = world
        self.metadata: dict[str, Any] = {"version": VERSION, "benchmark": self.name, "data": str(self.data)}
        self._cache: dict[str, list[Task]] = {}

    def splits(self) -> list[str]:
        return [self.default_split]

    def tasks(self, split: str | None = None) -> Iterator[Task]:
        split = split or self.default_split
        if split not in self.splits():
            raise KeyError(f"{self.name}: unknown split {split!r}; valid: {self.splits()}")
        if split not in self._cache:
            self._cache[split] = list(self._load(split))
        rows = self._cache[split]
        return iter(rows if self.limit is None else rows[: self.limit])

    @abstractmethod
    def _load(self, split: str) -> Iterator[Task]:
        """The split's tasks, read from the benchmark's own files."""

    @property
    def browser_needed(self) -> str | None:
        """Open-web pages may need JavaScript: Chromium is required unless ``browser_mode`` is ``never``."""
        mode = self.world_options.get("browser_mode", "auto")
        return None if mode == "never" else f"browser_mode is {mode!r} on the open web"

    def open(self) -> OpenWebWorld:
        """The open-web world; use as ``with scenario.open() as world: ...``."""
        require_browser(self.name, self.browser_needed)
        return OpenWebWorld(**self.world_options)

    def verify(self, task: Task, prediction: str) -> Verdict:
        return AnswerVerifier(self.judge).verify(task, prediction)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(data={str(self.data)!r})"


def _read_rows(path: Path) -> list[dict[str, Any]]:
    """Rows of a ``.jsonl``, ``.json`` (a list, or {"data": [...]}), ``.csv`` or ``.parquet`` file."""
    return read_rows(path)


def _single_file(path: Path, patterns: tuple[str, ...], what: str) -> Path:
    if path.is_file():
        return path
    for pattern in patterns:
        found = sorted(p for p in path.glob(pattern) if p.is_file())
        if found:
            return found[0]
    raise FileNotFoundError(f"{what}: no {' / '.join(patterns)} file under {str(path)!r}")


# ----------------------------------------------------------------------------- GAIA

TEXT_SUFFIXES = frozenset(
    [".txt", ".csv", ".tsv", ".json", ".jsonl", ".jsonld", ".md", ".py", ".xml", ".html", ".htm", ".yaml", ".yml", ".log", ".tex", ".ini", ".cfg", ".toml", ".js", ".sql", ".pdb", ".srt", ".rst", ".r", ".c", ".cpp", ".java", ".sh"]
)


GAIA_METADATA = ("metadata.jsonl", "metadata.parquet")


class Gaia(_Benchmark):
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


# ----------------------------------------------------------------------------- XBench-DeepSearch


class XBenchDeepSearch(_Benchmark):
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


# ----------------------------------------------------------------------------- WebWalkerQA


def _lower_keys(row: Mapping[str, Any]) -> dict[str, Any]:
    return {str(k).lower(): v for k, v in row.items()}


class WebWalkerQA(_Benchmark):
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
