"""A loopback web server that misbehaves on purpose, to show that the web tools never crash or hang.

:class:`FaultServer` binds 127.0.0.1 only (a port the OS picks) and serves one fault per path
(:data:`FAULTS`): server errors, connection resets, a body that drips a byte at a time, redirect
loops, a gzip bomb, a 50 MB page, binary and invalid UTF-8 bodies, and JavaScript pages that never
settle (or never yield the CPU). ``/ok`` is a well-behaved page for comparison.

It is not allowed by any default policy: a test or benchmark lets it through explicitly, e.g.
``policy.map_origin("http://faults.test", server.origin)``, and agents then visit
``http://faults.test/<fault>``.

Example::

    with FaultServer() as server:
        policy.map_origin("http://faults.test", server.origin)
        visit({"url": "http://faults.test/gzip-bomb", "goal": "x"})   # -> "content: page larger ..."
"""

from __future__ import annotations

import gzip
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .url_policy import UrlPolicy

__all__ = ["FaultServer", "FAULTS", "VIRTUAL_ORIGIN", "admit"]

#: path -> what it does. Every path also answers with a query string (``/500?n=3``), so that
#: caches and per-agent sessions do not turn repeated calls into one.
FAULTS: dict[str, str] = {
    "/500": "HTTP 500 with an HTML body",
    "/503": "HTTP 503 with Retry-After",
    "/reset": "status line sent, then the connection is reset (RST)",
    "/reset-early": "connection reset before any byte",
    "/drip": "declares 1 MB, sends one byte every 50 ms (for at most drip_s)",
    "/redirect-loop": "302 to itself",
    "/redirect-chain": "302 to /redirect-chain?n=N+1, forever",
    "/gzip-bomb": "Content-Encoding: gzip, ~250 KB that inflate to 256 MB",
    "/big": "a 50 MB HTML page, no Content-Length (streamed)",
    "/big-declared": "a 50 MB HTML page with its Content-Length",
    "/binary": "random bytes as application/octet-stream",
    "/binary-as-html": "bytes with NULs labelled text/html",
    "/invalid-utf8": "text/html; charset=utf-8 with invalid UTF-8 sequences (readable after replacement)",
    "/js-never-settles": "content built by JavaScript that polls the server forever",
    "/js-busy-loop": "JavaScript that never yields the CPU",
    "/ok": "a normal page",
}

_BIG_BYTES = 50 * 1024 * 1024
_BOMB_BYTES = 256 * 1024 * 1024


def _bomb() -> bytes:
    """Gzip of 256 MB of zeros, built once (compressed in 1 MB blocks: no 256 MB buffer)."""
    out = bytearray()
    compressor = gzip.GzipFile(fileobj=_Sink(out), mode="wb", compresslevel=9)
    block = bytes(1024 * 1024)
    for _ in range(_BOMB_BYTES // len(block)):
        compressor.write(block)
    compressor.close()
    return bytes(out)


class _Sink:
    def __init__(self, out: bytearray) -> None:
        self.out = out

    def write(self, data: bytes) -> int:
        self.out += data
        return len(data)

    def flush(self) -> None:
        pass


_HTML = "<html><head><title>{title}</title></head><body>{body}</body></html>"
_NEVER_SETTLES = _HTML.format(
    title="Polling",
    body='<div id="out"></div><script>'
    "let n = 0; setInterval(() => { fetch('/tick?' + (n++)).catch(() => null); "
    "document.getElementById('out').textContent = 'The counter page has ticked ' + n + ' times so far.'; }, 30);"
    "</script>",
)
_BUSY = _HTML.format(title="Busy", body="<script>while (true) {}</script>")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "mgrpo-faults/0.1"
    timeout = 30  # a client that stops reading must not hold a thread forever

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def _send(self, status: int, body: bytes, ctype: str = "text/html; charset=utf-8", **headers: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for key, value in headers.items():
            self.send_header(key.replace("_", "-"), value)
        self.end_headers()
        self.wfile.write(body)

    def _reset(self) -> None:
        # SO_LINGER with a zero timeout makes close() send RST instead of FIN.
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()
        self.close_connection = True

    def do_GET(self) -> None:  # noqa: N802, C901 - stdlib name; one branch per fault is the point
        server: Any = self.server
        path, _, query = self.path.partition("?")
        server.count(path)
        try:
            if path in ("/500", "/503"):
                extra = {"Retry_After": "1"} if path == "/503" else {}
                self._send(int(path[1:]), _HTML.format(title="Error", body="<p>Server error.</p>").encode(), **extra)
            elif path == "/reset":
                self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 5000\r\n\r\n<html>")
                self.wfile.flush()
                self._reset()
            elif path == "/reset-early":
                self._reset()
            elif path == "/drip":
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(1024 * 1024))
                self.end_headers()
                stop = time.monotonic() + server.drip_s
                while time.monotonic() < stop and not server.stopping.is_set():
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    time.sleep(0.05)
                self.close_connection = True
            elif path == "/redirect-loop":
                self._send(302, b"", Location=self.path)
            elif path == "/redirect-chain":
                n = int(query[2:]) if query.startswith("n=") and query[2:].isdigit() else 0
                self._send(302, b"", Location=f"/redirect-chain?n={n + 1}")
            elif path == "/gzip-bomb":
                self._send(200, server.bomb, Content_Encoding="gzip")
            elif path in ("/big", "/big-declared"):
                self._big(declared=path == "/big-declared")
            elif path == "/binary":
                self._send(200, server.noise, "application/octet-stream")
            elif path == "/binary-as-html":
                self._send(200, b"<html>\x00\x01\x02" + server.noise, "text/html")
            elif path == "/invalid-utf8":
                body = b"<html><head><title>Broken bytes</title></head><body><p>Caf\xc3 na\xffve \xed\xa0\x80 text"
                self._send(200, body + b" that is still a page worth reading.</p></body></html>")
            elif path == "/js-never-settles":
                self._send(200, _NEVER_SETTLES.encode())
            elif path == "/tick":
                self._send(200, b"tick", "text/plain")
            elif path == "/js-busy-loop":
                self._send(200, _BUSY.encode())
            elif path == "/ok":
                self._send(200, _HTML.format(title="Fine", body="<p>A well-behaved page about rivers.</p>").encode())
            else:
                self._send(404, b"not found", "text/plain")
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True  # the client gave up first: expected for most faults

    def _big(self, *, declared: bool) -> None:
        chunk = (b"<p>" + b"filler text for a very large page. " * 100 + b"</p>\n")
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        if declared:
            self.send_header("Content-Length", str(_BIG_BYTES))
        self.end_headers()
        sent = 0
        while sent < _BIG_BYTES:
            part = chunk[: _BIG_BYTES - sent]
            self.wfile.write(part)
            sent += len(part)
        self.close_connection = True


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # clients that reset or vanish are the point of this server, not news


#: The name the fault site is reached by: a virtual origin that a policy maps to the real loopback one, so the
#: defaults (private ranges refused) stay as they are and only this one host is allowed, explicitly.
VIRTUAL_ORIGIN = "http://faults.test"


def admit(policy: UrlPolicy, origin: str) -> UrlPolicy:
    """``policy`` with the fault site at ``origin`` reachable as :data:`VIRTUAL_ORIGIN` (its one allowance)."""
    policy.map_origin(VIRTUAL_ORIGIN, origin)
    return policy


class FaultServer:
    """The fault site on ``http://127.0.0.1:PORT`` (loopback only), served from daemon threads.

    Args:
        drip_s: how long ``/drip`` keeps dripping before it gives up (longer than any tool timeout).
    """

    def __init__(self, *, drip_s: float = 30.0) -> None:
        self.drip_s = drip_s
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.hits: dict[str, int] = {}
        self._lock = threading.Lock()

    @property
    def origin(self) -> str:
        if self._server is None:
            raise RuntimeError("FaultServer is not started")
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def count(self, path: str) -> None:
        with self._lock:
            self.hits[path] = self.hits.get(path, 0) + 1

    def start(self) -> FaultServer:
        server = _Server(("127.0.0.1", 0), _Handler)
        server.drip_s = self.drip_s  # type: ignore[attr-defined]
        server.stopping = threading.Event()  # type: ignore[attr-defined]
        server.bomb = _bomb()  # type: ignore[attr-defined]
        server.noise = bytes(range(256)) * 64  # type: ignore[attr-defined]
        server.count = self.count  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        self._thread.start()
        self._server = server
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.stopping.set()  # type: ignore[attr-defined]
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FaultServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
