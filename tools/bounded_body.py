"""Read a response body without ever holding more than ``max_bytes`` of it, compressed or not.

httpx decodes ``Content-Encoding`` one network read at a time with no output limit: a 64 KB read of
a gzip bomb (``/gzip-bomb`` of :mod:`.faultserver`, 250 KB that inflate to 256 MB) comes back as one
64 MB chunk, built by zlib in growing blocks of up to tens of megabytes. The fetchers cut the body at
``max_bytes`` (2 MB), but only after that chunk exists: every bomb visit allocated ~64 MB per
thread, and glibc, whose mmap threshold rises to the largest block freed, then kept those sizes in
its per-thread arenas. That was the largest share of the fault soak's RSS growth
(``benchmarks/results/fault_soak.md``).

:class:`BoundedBody` takes the raw (still encoded) bytes (``iter_raw``/``aiter_raw``) and inflates
each one with zlib's ``max_length``, so no decoded piece is ever larger than what is still allowed
(``max_bytes`` + 1): a bomb costs at most ``max_bytes`` before it is refused. The fetchers ask only
for the encodings decoded here (:data:`ACCEPT_ENCODING`); a body in any other encoding is refused as
``content``, and a corrupt one is an ``httpx.DecodingError`` (an ``http`` error, as before).
"""

from __future__ import annotations

import zlib

import httpx

from .base import ToolError

__all__ = ["ACCEPT_ENCODING", "BoundedBody"]

#: What the fetchers send as ``Accept-Encoding``: the encodings :class:`BoundedBody` can bound.
ACCEPT_ENCODING = "gzip, deflate"


class _Inflate:
    """One zlib stage (gzip, or deflate with or without its zlib header) with a bounded output."""

    def __init__(self, encoding: str) -> None:
        self.encoding = encoding
        # gzip: the gzip header; deflate: a zlib header first, raw deflate if that fails (as httpx).
        self._zlib = zlib.decompressobj(zlib.MAX_WBITS | 16 if encoding == "gzip" else zlib.MAX_WBITS)
        self._first = True

    def decode(self, data: bytes, limit: int) -> bytes:
        """Up to ``limit`` bytes of output for ``data`` plus what an earlier call left unread."""
        try:
            out = self._zlib.decompress(self._zlib.unconsumed_tail + data, limit)
        except zlib.error as exc:
            if self.encoding == "deflate" and self._first:
                self._first = False
                self._zlib = zlib.decompressobj(-zlib.MAX_WBITS)
                return self.decode(data, limit)
            raise httpx.DecodingError(str(exc)) from exc
        self._first = False
        return out

    @property
    def pending(self) -> bool:
        """Input left that the last call's limit did not let out."""
        return bool(self._zlib.unconsumed_tail)


class BoundedBody:
    """The decoded body of one response, refused once it passes ``max_bytes``.

    Args:
        max_bytes: the largest decoded body accepted.
        content_encoding: the response's ``Content-Encoding`` header ("" for none).
        shown: the URL named in errors.

    Raises:
        ToolError: ``content`` for an encoding other than gzip/deflate/identity (at construction)
            and for a body larger than ``max_bytes`` (from :meth:`feed`).
    """

    def __init__(self, max_bytes: int, content_encoding: str, shown: str) -> None:
        self.max_bytes = max_bytes
        self.shown = shown
        self.size = 0
        self._chunks: list[bytes] = []  # joined once at the end: no reallocation of a growing buffer
        names = [e.strip().lower() for e in content_encoding.split(",") if e.strip()]
        stages = []
        for name in reversed(names):  # the last encoding applied is the first undone
            if name in ("gzip", "x-gzip", "deflate"):
                stages.append(_Inflate("deflate" if name == "deflate" else "gzip"))
            elif name != "identity":
                raise ToolError("content", f"{shown} is sent with Content-Encoding {name!r}, which is not "
                                           f"decoded (asked for: {ACCEPT_ENCODING})")
        self._stages = stages

    def feed(self, raw: bytes) -> None:
        """Add one raw piece of the body; ToolError("content") once the decoded body passes ``max_bytes``."""
        self._through(0, raw)

    def _through(self, index: int, data: bytes) -> None:
        if index == len(self._stages):
            self._keep(data)
            return
        stage = self._stages[index]
        piece = stage.decode(data, self._room())
        self._through(index + 1, piece)
        while stage.pending:  # what the limit held back, still bounded by what is left
            self._through(index + 1, stage.decode(b"", self._room()))

    def _room(self) -> int:
        # One byte more than what is still allowed: enough to tell "too large" from "just fits".
        return self.max_bytes - self.size + 1

    def _keep(self, data: bytes) -> None:
        if not data:
            return
        self.size += len(data)
        if self.size > self.max_bytes:
            self._chunks.clear()
            raise ToolError("content", f"page larger than {self.max_bytes} bytes at {self.shown}")
        self._chunks.append(data)

    def value(self) -> bytes:
        """The whole decoded body (after the last :meth:`feed`)."""
        return b"".join(self._chunks)
