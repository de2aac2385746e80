"""RenderCache's bookkeeping by hand: its byte count, bounds, counters and file format (issue 34: the
survivors of its mutation run). Pure Python, no browser."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mgrpo_tools import FetchResult, RenderCache


def _page(text: str, url: str = "http://a.test/") -> FetchResult:
    return FetchResult(url=url, status=200, content_type="text/html", text=text, elapsed_s=0.3, from_cache=False,
                       via="browser")


def _zero() -> float:
    return 0.0


def keep(cache: RenderCache, key: str, text: str) -> FetchResult:
    return cache.get_or_render(key, lambda: (_page(text, key), True), _zero)


def test_bounds_must_be_at_least_one() -> None:
    tiny = RenderCache(max_entries=1, max_bytes=1)  # the smallest bounds are allowed
    keep(tiny, "a", "x")
    assert (len(tiny), tiny.nbytes) == (1, 1)
    for kwargs in ({"max_entries": 0}, {"max_bytes": 0}, {"max_entries": -3, "max_bytes": 5}):
        with pytest.raises(ValueError, match=r"^max_entries and max_bytes must be >= 1$"):
            RenderCache(**kwargs)


def test_the_byte_count_is_the_utf8_size_of_the_kept_texts() -> None:
    cache = RenderCache(max_entries=10, max_bytes=100)
    assert cache.nbytes == 0
    keep(cache, "a", "abc")  # 3 bytes
    keep(cache, "b", "\u00e9\u00e9")  # 2 characters, 4 bytes in UTF-8
    assert cache.nbytes == 7
    keep(cache, "a", "zzzz")  # a hit: nothing is added
    assert cache.nbytes == 7 and cache.stats.hits == 1
    cache.clear()
    assert (len(cache), cache.nbytes) == (0, 0) and "a" not in cache
    assert keep(cache, "a", "fresh").text == "fresh"  # rendered again after clear
    assert cache.nbytes == 5 and cache.stats.misses == 3


def test_a_page_of_exactly_the_byte_budget_is_kept_and_fills_it() -> None:
    cache = RenderCache(max_entries=5, max_bytes=6)
    keep(cache, "a", "abc")
    keep(cache, "b", "def")  # 3 + 3 == 6: at the budget, nothing evicted
    assert (len(cache), cache.nbytes, cache.stats.evictions) == (2, 6, 0)
    keep(cache, "c", "g")  # 7 > 6: the least recently used ("a") goes
    assert ("a" in cache, "b" in cache, "c" in cache, cache.nbytes, cache.stats.evictions) == (False, True, True, 4, 1)
    keep(cache, "d", "hijklm")  # exactly 6 alone: kept, everything else evicted (two more evictions)
    assert (len(cache), cache.nbytes, cache.stats.evictions) == (1, 6, 3) and "d" in cache
    keep(cache, "e", "1234567")  # 7 bytes: larger than the budget, never kept
    assert (len(cache), cache.nbytes, "e" in cache) == (1, 6, False)


def test_counters_count_every_event() -> None:
    cache = RenderCache(max_entries=1)
    for key in ("a", "b", "c"):
        keep(cache, key, key)
    keep(cache, "c", "?")
    keep(cache, "c", "?")
    assert cache.stats.as_dict() == {"hits": 2, "misses": 3, "joined": 0, "uncacheable": 0, "evictions": 2,
                                     "loaded": 0, "unreadable": 0, "write_errors": 0}


def test_a_file_with_a_page_twice_keeps_it_once(tmp_path: Path) -> None:
    """Two processes may append the same page: the later line replaces the earlier one, in bytes too,
    and counts as the most recently used."""
    path = tmp_path / "r.jsonl"
    lines = [{"key": k, "result": _page(t, k).to_cache()} for k, t in (("a", "aaaa"), ("b", "bb"), ("a", "AAAAAA"))]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    cache = RenderCache(max_entries=2, path=path)
    assert (cache.stats.loaded, len(cache), cache.nbytes) == (3, 2, 8)
    assert keep(cache, "a", "?").text == "AAAAAA"
    keep(cache, "c", "c")  # evicts the least recently used: "b" (the second "a" moved to the end, then was hit)
    assert "b" not in cache and "a" in cache and cache.nbytes == 7


def test_the_file_is_utf8_one_json_line_per_render_after_a_cut_line(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"x")  # one byte of a line cut short by a crash
    cache = RenderCache(path=path)
    assert cache.stats.unreadable == 1
    keep(cache, "http://a.test/\u00e9", "caf\u00e9 \u2014 ok")
    raw = path.read_bytes()
    assert raw.startswith(b"x\n{")  # the new render starts on a line of its own
    assert "caf\u00e9 \u2014 ok".encode() in raw  # written as UTF-8, not as \\u escapes
    again = RenderCache(path=path)
    assert (again.stats.loaded, again.stats.unreadable) == (1, 1)
    assert keep(again, "http://a.test/\u00e9", "?").text == "caf\u00e9 \u2014 ok"


def test_bytes_that_are_not_utf8_are_one_unreadable_line_not_a_failure(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    good = json.dumps({"key": "k", "result": _page("fine", "k").to_cache()}).encode()
    path.write_bytes(b'{"key": "\xff\xfe bad\n' + b"not json either\n" + good + b"\n")
    cache = RenderCache(path=path)
    assert (cache.stats.loaded, cache.stats.unreadable, len(cache)) == (1, 2, 1)
    assert keep(cache, "k", "?").text == "fine"


def test_every_failed_write_is_counted(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    cache = RenderCache(path=blocker / "r.jsonl")
    keep(cache, "a", "a")
    keep(cache, "b", "b")
    assert cache.stats.write_errors == 2 and len(cache) == 2
