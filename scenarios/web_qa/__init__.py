"""Open-web QA scenarios over downloaded files: the paper's GAIA, XBench-DeepSearch and WebWalkerQA, one
loader per module (``gaia``, ``xbench``, ``webwalkerqa``; the shared world and base in ``common``).

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

from .common import (
    VERSION,
    OpenWebScenario,
    OpenWebWorld,
    default_cache_path,
    make_judge,
    make_search_backend,
)
from .gaia import Gaia, gaia_match, gaia_normalize_number, gaia_normalize_str
from .webwalkerqa import WebWalkerQA
from .xbench import XBenchDeepSearch, xbench_decrypt, xbench_encrypt

__all__ = [
    "VERSION",
    "Gaia",
    "XBenchDeepSearch",
    "WebWalkerQA",
    "OpenWebScenario",
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
