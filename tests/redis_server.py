"""A real ``redis-server`` on 127.0.0.1 for tests: a context manager and pytest fixtures.

Not a conftest (other suites own that): a test module imports what it uses, e.g.
``from redis_server import RedisServer, redis_server_fixture  # noqa: F401``, then asks for the fixture
by its pytest name ``redis_server`` (a throw-away server, no persistence) or ``persistent_redis_server``
(append-only file with ``appendfsync always`` in a temporary folder, so data survives a restart).

:class:`RedisServer` picks a free port the OS hands out, waits until the server answers ``PING`` (not
``LOADING``), and can be stopped and started again on the same port to simulate an outage::

    with RedisServer(persist_dir=tmp_path) as server:
        store = RedisStore(server.url)
        server.stop()      # SIGTERM (``kill=True``: SIGKILL, a crash)
        server.start()     # same port, same data folder

Fixtures skip the test when ``redis-server`` is not installed. Nothing outlives the ``with`` block.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


def redis_available() -> bool:
    """Whether a ``redis-server`` binary is installed."""
    return os.access(REDIS_SERVER, os.X_OK)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that the OS reports free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ping(port: int, timeout_s: float = 0.5, *, tls: bool = False) -> bytes:
    """The raw reply of ``PING`` (``b"+PONG"`` when ready, ``b"-LOADING ..."`` while loading,
    ``b"-NOAUTH ..."`` from a server that wants a password), or b""."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as raw:
            sock = raw
            if tls:  # readiness only: the certificate is the test's own, not checked here
                context = ssl.create_default_context()
                context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
                sock = context.wrap_socket(raw)
            sock.sendall(b"PING\r\n")
            return sock.recv(256).strip()
    except OSError:
        return b""


def self_signed_cert(folder: Path) -> tuple[Path, Path]:
    """``(cert.pem, key.pem)`` for 127.0.0.1, made with the ``openssl`` command (valid one day)."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )
    return cert, key


class RedisServer:
    """One ``redis-server`` process bound to 127.0.0.1.

    Args:
        port: the port; None picks a free one on the first start and keeps it for restarts.
        persist_dir: folder for the append-only file; None runs without persistence
            (``--save '' --appendonly no``) in a temporary folder removed on exit.
        startup_timeout_s: how long :meth:`start` waits for the server to answer ``PING``.
        password: ``--requirepass`` (clients must AUTH; :attr:`url` carries it).
        tls: ``(cert, key)``: serve TLS only (``--tls-port``, no plain port; :attr:`url` is ``rediss://``).
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        persist_dir: str | Path | None = None,
        startup_timeout_s: float = 10.0,
        password: str | None = None,
        tls: tuple[Path, Path] | None = None,
    ) -> None:
        self.port = port
        self.password = password
        self.tls = tls
        self.persist = persist_dir is not None
        self._tmp = None if self.persist else tempfile.TemporaryDirectory(prefix="mgrpo-redis-")
        self.dir = Path(persist_dir) if persist_dir is not None else Path(self._tmp.name)
        self.startup_timeout_s = startup_timeout_s
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"{'rediss' if self.tls else 'redis'}://{auth}127.0.0.1:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.dir / "redis.log"

    def _args(self) -> list[str]:
        args = [REDIS_SERVER, "--bind", "127.0.0.1", "--dir", str(self.dir)]
        if self.tls:
            cert, key = self.tls
            args += ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", str(cert),
                     "--tls-key-file", str(key), "--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no"]
        else:
            args += ["--port", str(self.port)]
        if self.password:
            args += ["--requirepass", self.password]
        args += ["--daemonize", "no", "--logfile", str(self.log_path), "--save", ""]
        if self.persist:
            return args + ["--appendonly", "yes", "--appendfsync", "always"]
        return args + ["--appendonly", "no"]

    def start(self) -> RedisServer:
        """Start the server (on the same port as before, if it ran) and wait until it is ready."""
        if self.proc is not None:
            raise RuntimeError(f"redis-server already running on port {self.port}")
        if not redis_available():
            raise RuntimeError(f"redis-server not found at {REDIS_SERVER}")
        self.dir.mkdir(parents=True, exist_ok=True)
        pick_port = self.port is None
        for _attempt in range(3 if pick_port else 1):
            if pick_port:
                self.port = free_port()
            self.proc = subprocess.Popen(self._args(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + self.startup_timeout_s
            while time.monotonic() < deadline and self.proc.poll() is None:
                if ping(self.port, tls=self.tls is not None).startswith((b"+PONG", b"-NOAUTH")):
                    return self
                time.sleep(0.02)
            self.stop(kill=True)  # exited (port taken by a racer?) or never became ready
        log = self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""
        raise RuntimeError(f"redis-server did not start on port {self.port}:\n{log}")

    def stop(self, *, kill: bool = False) -> None:
        """Stop the server: SIGTERM (flushes the append-only file) or, with ``kill``, SIGKILL."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()


@pytest.fixture(name="redis_server")
def redis_server_fixture() -> Iterator[RedisServer]:
    """A throw-away redis-server (no persistence) for one test."""
    if not redis_available():
        pytest.skip("redis-server is not installed")
    with RedisServer() as server:
        yield server


@pytest.fixture(name="persistent_redis_server")
def persistent_redis_server_fixture(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server with an append-only file in ``tmp_path``: data survives ``stop()``/``start()``."""
    if not redis_available():
        pytest.skip("redis-server is not installed")
    with RedisServer(persist_dir=tmp_path / "redis") as server:
        yield server
