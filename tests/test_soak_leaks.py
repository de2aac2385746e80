"""What kept the fault soak's memory growing, each held to its bound (benchmarks/fault_soak.py, issue 44).

- A gzip bomb read by the HTTP fetcher or by the browser's route handler: httpx inflated each 64 KB
  network read whole (a 64 MB chunk) before the fetchers cut the body at ``max_bytes``; now
  :class:`~mgrpo_tools.bounded_body.BoundedBody` never inflates past ``max_bytes`` (tracemalloc's
  peak over the fetch is the check).
- The visit tool's memo of parsed pages was bounded by entries only; now also by characters.
- ``RandomPolicy`` built its 55,000-character action space per policy (per episode in the soak).

Real parts: the fault server on 127.0.0.1, httpx over loopback, Chromium through Playwright.
"""

from __future__ import annotations

import gc
import gzip
import tracemalloc
import zlib
from collections.abc import Callable, Iterator

import httpx
import pytest

from mgrpo_env.scripted import RandomPolicy
from mgrpo_env.spaces import ProtocolText, action_space
from mgrpo_tools import UrlPolicy
from mgrpo_tools.base import ToolError
from mgrpo_tools.bounded_body import BoundedBody
from mgrpo_tools.faultserver import VIRTUAL_ORIGIN, FaultServer, admit
from mgrpo_tools.fetch import FetchResult, HttpFetcher
from mgrpo_tools.visit import DOCUMENTS, _to_document

ORIGIN = VIRTUAL_ORIGIN
CHROMIUM = "/usr/bin/chromium"
MAX_BYTES = 2_000_000
# The bomb inflates 1,000:1; before the fix one read held ~64 MB. After it, the body itself
# (<= MAX_BYTES) and zlib's window are all there is: 3x MAX_BYTES leaves room for Python's copies.
PEAK_LIMIT = 3 * MAX_BYTES


@pytest.fixture(scope="module", name="faults")
def faults_fixture() -> Iterator[FaultServer]:
    with FaultServer(drip_s=5) as server:
        yield server


@pytest.fixture(name="policy")
def policy_fixture(faults: FaultServer) -> UrlPolicy:
    return admit(UrlPolicy(), faults.origin)  # the one explicit allowance


def _peak_of(fetch: Callable[[], object]) -> tuple[int, ToolError | None]:
    """tracemalloc's peak (bytes above the start) over ``fetch()``, and the ToolError it raised."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        error = None
        try:
            fetch()
        except ToolError as exc:
            error = exc
        return tracemalloc.get_traced_memory()[1] - base, error
    finally:
        tracemalloc.stop()


def test_http_fetcher_inflates_a_gzip_bomb_only_up_to_max_bytes(policy: UrlPolicy) -> None:
    with HttpFetcher(policy, timeout_s=10.0, max_bytes=MAX_BYTES) as http:
        http.fetch(f"{ORIGIN}/ok?n=0")  # the connection pool and imports, outside the measure
        for n in range(3):
            peak, error = _peak_of(lambda n=n: http.fetch(f"{ORIGIN}/gzip-bomb?n={n}"))
            assert error is not None and error.kind == "content" and "larger than" in error.message, error
            assert peak < PEAK_LIMIT, f"{peak / 2**20:.1f} MB held while refusing a gzip bomb"


@pytest.mark.browser
def test_browser_route_inflates_a_gzip_bomb_only_up_to_max_bytes(policy: UrlPolicy) -> None:
    from mgrpo_tools.browser import BrowserFetcher

    with BrowserFetcher(policy, executable_path=CHROMIUM, timeout_s=20.0, max_bytes=MAX_BYTES) as browser:
        browser.fetch(f"{ORIGIN}/ok?n=0")  # Chromium launched, the worker loop running
        peak, error = _peak_of(lambda: browser.fetch(f"{ORIGIN}/gzip-bomb?n=1"))
        assert error is not None and error.kind == "content" and "larger than" in error.message, error
        assert peak < PEAK_LIMIT, f"{peak / 2**20:.1f} MB held while refusing a gzip bomb"
        assert "Fine" in browser.fetch(f"{ORIGIN}/ok?n=2").text


def _encoded(body: bytes, encoding: str) -> bytes:
    if encoding == "gzip":
        return gzip.compress(body)
    if encoding == "deflate":  # the zlib wrapper, as RFC 9110 says
        return zlib.compress(body)
    if encoding == "raw-deflate":  # what some servers send under "deflate"
        raw = zlib.compressobj(wbits=-zlib.MAX_WBITS)
        return raw.compress(body) + raw.flush()
    raise AssertionError(encoding)


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "raw-deflate"])
def test_bounded_body_decodes_what_fits_and_refuses_one_byte_more(encoding: str) -> None:
    body = b"<p>rivers and their mouths</p>" * 5000
    wire = _encoded(body, encoding)
    header = "deflate" if encoding == "raw-deflate" else encoding
    fits = BoundedBody(len(body), header, "http://x.test/")
    for i in range(0, len(wire), 700):  # network-sized pieces
        fits.feed(wire[i:i + 700])
    assert fits.value() == body
    over = BoundedBody(len(body) - 1, header, "http://x.test/")
    with pytest.raises(ToolError, match="larger than") as info:
        for i in range(0, len(wire), 700):
            over.feed(wire[i:i + 700])
    assert info.value.kind == "content"


def test_bounded_body_undoes_stacked_encodings_and_refuses_others() -> None:
    body = b"twice compressed " * 1000
    twice = BoundedBody(len(body), "deflate, gzip", "http://x.test/")  # deflate applied first
    twice.feed(gzip.compress(zlib.compress(body)))
    assert twice.value() == body
    with pytest.raises(ToolError, match="Content-Encoding 'br'") as info:
        BoundedBody(100, "br", "http://x.test/")
    assert info.value.kind == "content"
    with pytest.raises(httpx.DecodingError):  # a corrupt body is an http error, as httpx reported it
        BoundedBody(100, "gzip", "http://x.test/").feed(b"\x1f\x8b not gzip at all")


def _page(i: int, html: str) -> FetchResult:
    return FetchResult(url=f"{ORIGIN}/page{i}", status=200, content_type="text/html", text=html, elapsed_s=0.0,
                       from_cache=False, via="http")


def test_the_page_memo_stays_within_its_characters(monkeypatch: pytest.MonkeyPatch) -> None:
    # The shared memo with a small bound, so that a few pages pass it; the eviction is the same.
    monkeypatch.setattr(DOCUMENTS, "max_chars", 400_000)
    DOCUMENTS.clear()
    paragraph = "<p>Filler text about rivers, their sources and their mouths, for a large page.</p>\n" * 250
    size = 0
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for i in range(60):  # 60 distinct pages of ~20,000 characters: 3x the bound
            html = f"<html><body><h1>Page {i}</h1><a href='/p{i + 1}'>next</a>{paragraph}</body></html>"
            size += len(html)
            doc = _to_document(_page(i, html))
            assert doc.links and doc is _to_document(_page(i, html))  # a second visit is served by the memo
            del html, doc
            assert DOCUMENTS.chars <= DOCUMENTS.max_chars
        gc.collect()  # BeautifulSoup's trees are cycles: garbage, not kept, until the collector runs
        held = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
        DOCUMENTS.clear()
    assert size > 2.5 * DOCUMENTS.max_chars  # more was read than the memo may keep
    # ~2.7-4.4 bytes per character kept (the HTML and its Document), measured: 6 leaves a margin
    assert held < 6 * DOCUMENTS.max_chars, f"{held / 2**20:.1f} MB kept after {size:,} characters"


def test_random_policy_shares_the_cached_space_and_samples_as_before() -> None:
    policy = RandomPolicy("sub", seed=7)
    assert policy.space.character_set is action_space(4000, "sub").character_set  # not rebuilt
    fresh = ProtocolText(4000, "sub", seed=7)
    assert [policy.space.sample() for _ in range(20)] == [fresh.sample() for _ in range(20)]
    other = RandomPolicy("sub", seed=7)
    assert other.space.np_random is not policy.space.np_random  # each policy's own generator
