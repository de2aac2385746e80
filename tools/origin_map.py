"""Virtual origins: stable URLs for sites that are really served somewhere else (a loopback port).

An offline world is served on ``http://127.0.0.1:PORT`` with a port the OS picks, so every URL built
from it would change from run to run. :class:`OriginMap` lets the tools show a fixed origin instead
(``http://wiki-hops.test``; ``.test`` is reserved by RFC 2606 and never resolves on the internet):
agents, caches and search results only ever see the virtual origin, and the fetchers translate it
to the real origin at the moment they connect.

Mapping is by exact origin (scheme, host and port, the default port made explicit): a URL of the
virtual host on another port or scheme is left alone, and so is any other URL. The URL policy
(:meth:`UrlPolicy.map_origin <mgrpo_tools.url_policy.UrlPolicy.map_origin>`) holds the map that
the HTTP and browser fetchers use, so that the policy always decides on the virtual URL.

Example::

    origins = OriginMap()
    origins.add("http://wiki-hops.test", "http://127.0.0.1:43125")
    origins.to_real("http://wiki-hops.test/wiki/X")         # "http://127.0.0.1:43125/wiki/X"
    origins.to_virtual("http://127.0.0.1:43125/wiki/X")     # "http://wiki-hops.test/wiki/X"
    origins.to_real("http://wiki-hops.test:8080/wiki/X")    # unchanged: another port
"""

from __future__ import annotations

import re
import threading
from urllib.parse import urlsplit, urlunsplit

__all__ = ["OriginMap"]

_DEFAULT_PORTS = {"http": 80, "https": 443}

Origin = tuple[str, str, int | None]


def _origin(url: str) -> Origin | None:
    """``(scheme, host, port)`` with the default port made explicit, or None for a malformed URL."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower().rstrip(".")
    if not scheme or not host or parts.username is not None or parts.password is not None:
        return None  # credentials in a URL are the policy's to refuse; never rewrite such a URL
    return scheme, host, port if port is not None else _DEFAULT_PORTS.get(scheme)


def _base(origin: Origin) -> str:
    scheme, host, port = origin
    shown = f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown}" if port is None or _DEFAULT_PORTS.get(scheme) == port else f"{scheme}://{shown}:{port}"


def _replace_origin(url: str, base: str) -> str:
    parts = urlsplit(url.strip())
    new = urlsplit(base)
    return urlunsplit((new.scheme, new.netloc, parts.path, parts.query, parts.fragment))


class OriginMap:
    """A thread-safe, two-way map of virtual origins to the real origins that serve them.

    Origins are given as URLs (``"http://wiki-hops.test"``); only scheme, host and port count.
    """

    def __init__(self) -> None:
        self._to_real: dict[Origin, Origin] = {}
        self._to_virtual: dict[Origin, Origin] = {}
        self._lock = threading.Lock()

    def add(self, virtual: str, real: str) -> None:
        """Serve ``virtual`` from ``real``. Each origin may appear in one mapping only."""
        v, r = _origin(virtual), _origin(real)
        if v is None or r is None:
            raise ValueError(f"origins need a scheme and a host, got {virtual!r} -> {real!r}")
        if v == r:
            raise ValueError(f"an origin cannot map to itself: {virtual!r}")
        with self._lock:
            if self._to_real.get(v, r) != r or self._to_virtual.get(r, v) != v:
                raise ValueError(f"{virtual!r} or {real!r} is already mapped elsewhere")
            self._to_real[v] = r
            self._to_virtual[r] = v

    def remove(self, virtual: str) -> None:
        """Forget the mapping of ``virtual`` (a no-op when it has none)."""
        v = _origin(virtual)
        with self._lock:
            r = self._to_real.pop(v, None) if v is not None else None
            if r is not None:
                self._to_virtual.pop(r, None)

    def items(self) -> list[tuple[str, str]]:
        """``[(virtual, real), ...]`` as origin URLs, sorted."""
        with self._lock:
            return sorted((_base(v), _base(r)) for v, r in self._to_real.items())

    def __bool__(self) -> bool:
        with self._lock:
            return bool(self._to_real)

    def to_real(self, url: str) -> str:
        """The URL to connect to: ``url`` on its real origin when its origin is virtual, else ``url``."""
        with self._lock:
            real = self._to_real.get(_origin(url)) if self._to_real else None  # type: ignore[arg-type]
        return url if real is None else _replace_origin(url, _base(real))

    def to_virtual(self, url: str) -> str:
        """The URL to show: ``url`` on its virtual origin when it is on a mapped real origin, else ``url``."""
        with self._lock:
            virtual = self._to_virtual.get(_origin(url)) if self._to_virtual else None  # type: ignore[arg-type]
        return url if virtual is None else _replace_origin(url, _base(virtual))

    def virtualize_text(self, text: str) -> str:
        """``text`` with absolute URLs of a real origin rewritten to its virtual one.

        For response bodies that name their server's own address (an absolute link or a form
        action built from it); an origin only matches when no further port digit or host
        character follows, so ``http://127.0.0.1:4312`` never matches inside ``...:43125``.
        """
        with self._lock:
            pairs = [(_base(r), _base(v)) for r, v in self._to_virtual.items()]
        for real, virtual in pairs:
            if real in text:
                text = re.sub(re.escape(real) + r"(?![\w.:-])", virtual, text)
        return text

    def __repr__(self) -> str:
        return f"OriginMap({dict(self.items())!r})"
