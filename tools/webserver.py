"""A real HTTP server on 127.0.0.1 for offline sites (the scenario's wiki, test pages).

:class:`LoopbackSite` serves the static files under a folder from a background thread, on a port the
OS picks. The agents reach it through the same ``visit``/``click`` tools and URL policy as the open
web, so offline runs exercise the real stack: allow it with ``policy.allow_origin(site.origin)``, or
give it a stable virtual origin with ``policy.map_origin("http://wiki-hops.test", site.origin)`` so
that the URLs agents see do not change with the port (see :mod:`.origin_map`).

Clean URLs: ``/wiki/Foo_Bar`` serves ``wiki/Foo_Bar.html`` when no file ``wiki/Foo_Bar`` exists.
Directory listings are refused (404) so that an agent cannot list the whole offline world.

MediaWiki-style titles (``title_prefixes=("/wiki/",)``): under those path prefixes, a title written
with spaces (``/wiki/Foo Bar``, ``/wiki/Foo%20Bar``) is answered with a 301 redirect to its underscore
form (``/wiki/Foo_Bar``), as MediaWiki does, so an agent that types a name into a URL reaches the
page and sees its one canonical URL. The ``Location`` is absolute, on the site's own origin.

Example::

    with LoopbackSite("data/wiki") as site:
        print(site.url)        # http://127.0.0.1:43125
"""

from __future__ import annotations

import functools
import os
import re
import threading
from collections.abc import Sequence
from http import HTTPStatus
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

__all__ = ["LoopbackSite", "StaticHandler"]


_TITLE_SAFE = "/-_.~!$&'()*+,;=:@"


class StaticHandler(SimpleHTTPRequestHandler):
    """``SimpleHTTPRequestHandler`` with clean URLs, no directory listings and no logging.

    Redirects titles with spaces under the server's ``title_prefixes`` attribute (a tuple of path
    prefixes, default none) to their underscore form.
    """

    # A slow or idle client must not hold a handler thread forever.
    timeout = 30
    server_version = "mgrpo-loopback/0.1"

    def send_head(self) -> Any:
        target = self._title_redirect()
        if target is None:
            return super().send_head()
        self.send_response(HTTPStatus.MOVED_PERMANENTLY)
        self.send_header("Location", target)
        self.send_header("Content-Length", "0")
        self.end_headers()
        return None

    def _title_redirect(self) -> str | None:
        """The canonical URL of a MediaWiki-style title written with spaces, else None."""
        parts = urlsplit(self.path)
        path = unquote(parts.path)
        for prefix in getattr(self.server, "title_prefixes", ()):
            title = path[len(prefix):] if path.startswith(prefix) else ""
            if " " in title:
                canonical = re.sub(r"[ _]+", "_", title).strip("_")
                if not canonical:
                    return None
                host, port = self.server.server_address[:2]
                query = f"?{parts.query}" if parts.query else ""
                return f"http://{host}:{port}{quote(prefix + canonical, safe=_TITLE_SAFE)}{query}"
        return None

    def translate_path(self, path: str) -> str:
        resolved = super().translate_path(path)
        if not os.path.exists(resolved) and os.path.isfile(resolved + ".html"):
            return resolved + ".html"
        return resolved

    def list_directory(self, path: str | os.PathLike[str]) -> None:
        self.send_error(HTTPStatus.NOT_FOUND, "Not Found")
        return None

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass


class LoopbackSite:
    """Serve ``root`` on ``http://127.0.0.1:PORT`` from a daemon thread.

    Args:
        root: folder whose files are served.
        host: address to bind; keep the loopback default unless you know why.
        port: 0 lets the OS pick a free port (read it back from :attr:`port` / :attr:`url`).
        title_prefixes: path prefixes (``"/wiki/"``) under which a title with spaces is redirected
            to its underscore form (MediaWiki-style titles); none by default.

    The server speaks HTTP/1.0 (one request per connection), so :meth:`stop` leaves no kept-alive
    connection that could still be answered after the site is stopped.
    """

    def __init__(self, root: str | Path, *, host: str = "127.0.0.1", port: int = 0,
                 title_prefixes: Sequence[str] = ()) -> None:
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise FileNotFoundError(f"site root is not a folder: {self.root}")
        bad = [p for p in title_prefixes if not (p.startswith("/") and p.endswith("/"))]
        if bad:
            raise ValueError(f"title prefixes must start and end with '/', got {bad}")
        self.title_prefixes = tuple(title_prefixes)
        self.host = host
        self._requested_port = port
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def port(self) -> int:
        """The bound port (the site must be started)."""
        if self._server is None:
            raise RuntimeError("LoopbackSite is not started")
        return int(self._server.server_address[1])

    @property
    def origin(self) -> str:
        """``http://HOST:PORT``: what to pass to ``UrlPolicy.allow_origin``."""
        return f"http://{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """Base URL of the site (same as :attr:`origin`)."""
        return self.origin

    @property
    def running(self) -> bool:
        return self._server is not None

    def start(self) -> LoopbackSite:
        """Bind and serve in a background thread; a no-op when already running."""
        with self._lock:
            if self._server is not None:
                return self
            handler = functools.partial(StaticHandler, directory=str(self.root))
            server = ThreadingHTTPServer((self.host, self._requested_port), handler)
            server.daemon_threads = True
            server.title_prefixes = self.title_prefixes  # type: ignore[attr-defined]
            thread = threading.Thread(
                target=server.serve_forever,
                kwargs={"poll_interval": 0.1},
                name=f"loopback-site-{server.server_address[1]}",
            )
            thread.daemon = True
            thread.start()
            self._server, self._thread = server, thread
        return self

    def stop(self) -> None:
        """Stop serving, close the socket and join the thread; a no-op when not running."""
        with self._lock:
            server, thread = self._server, self._thread
            self._server, self._thread = None, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join(timeout=5)

    def __enter__(self) -> LoopbackSite:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = self.origin if self._server is not None else "stopped"
        return f"LoopbackSite({str(self.root)!r}, {where})"
