"""A real HTTP server on 127.0.0.1 for offline sites (the scenario's wiki, test pages).

:class:`LoopbackSite` serves the static files under a folder from a background thread, on a port the
OS picks. The agents reach it through the same ``visit``/``click`` tools and URL policy as the open
web (allow it with ``policy.allow_origin(site.origin)``), so offline runs exercise the real stack.

Clean URLs: ``/wiki/Foo_Bar`` serves ``wiki/Foo_Bar.html`` when no file ``wiki/Foo_Bar`` exists.
Directory listings are refused (404) so that an agent cannot list the whole offline world.

Example::

    with LoopbackSite("data/wiki") as site:
        print(site.url)        # http://127.0.0.1:43125
"""

from __future__ import annotations

import functools
import os
import threading
from http import HTTPStatus
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

__all__ = ["LoopbackSite", "StaticHandler"]


class StaticHandler(SimpleHTTPRequestHandler):
    """``SimpleHTTPRequestHandler`` with clean URLs, no directory listings and no logging."""

    # A slow or idle client must not hold a handler thread forever.
    timeout = 30
    server_version = "mgrpo-loopback/0.1"

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

    The server speaks HTTP/1.0 (one request per connection), so :meth:`stop` leaves no kept-alive
    connection that could still be answered after the site is stopped.
    """

    def __init__(self, root: str | Path, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise FileNotFoundError(f"site root is not a folder: {self.root}")
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
