"""SSRF gaps: the connection goes to the address the policy checked; deprecated IPv6 ranges refused.

DNS is what the tests control: ``socket.getaddrinfo`` is replaced for the test by a table in which
``rebind.test`` answers a public address (93.184.216.34) the first time and ``127.0.0.1`` afterwards,
as a rebinding DNS server would. The "internet" is simulated one layer down: a connection to
93.184.216.34 is delivered to a stand-in server on 127.0.0.2 (same port), while an "internal" server
listens on 127.0.0.1. A client that resolves the name again at connect time reaches the internal one.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anyio
import pytest

from mgrpo_tools import ToolError, UrlPolicy
from mgrpo_tools.fetch import HttpFetcher

PUBLIC = "93.184.216.34"
_real_getaddrinfo = socket.getaddrinfo


class _Recorder(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        server: Any = self.server
        server.seen.append((self.path, self.headers.get("Host", "")))
        body = f"<html><head><title>{server.label}</title></head><body><p>{server.label} {server.extra}</p></body></html>"
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass


def _serve(host: str, port: int, label: str, extra: str = "") -> ThreadingHTTPServer:
    server = ThreadingHTTPServer((host, port), _Recorder)
    server.daemon_threads = True
    server.seen, server.label, server.extra = [], label, extra  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server


@pytest.fixture(name="pair")
def pair_fixture() -> Iterator[tuple[ThreadingHTTPServer, ThreadingHTTPServer, int]]:
    """(internal server on 127.0.0.1:P, public stand-in on 127.0.0.2:P, P)."""
    for _attempt in range(20):  # the same port must be free on both addresses
        public = _serve("127.0.0.2", 0, "PUBLIC-STAND-IN")
        port = public.server_address[1]
        try:
            internal = _serve("127.0.0.1", port, "INTERNAL-SECRET")
        except OSError:
            public.shutdown()
            public.server_close()
            continue
        break
    else:
        pytest.skip("no port free on both 127.0.0.1 and 127.0.0.2")
    yield internal, public, port
    for server in (internal, public):
        server.shutdown()
        server.server_close()


@pytest.fixture(name="rebinding_dns")
def rebinding_dns_fixture(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Replace getaddrinfo: ``rebind.test`` is public once, then loopback; PUBLIC goes to 127.0.0.2."""
    asked: list[str] = []

    def fake(host: Any, port: Any, family: int = 0, type: int = 0, proto: int = 0, flags: int = 0) -> list[Any]:  # noqa: A002
        name = host.decode() if isinstance(host, bytes) else host
        if name == "rebind.test":
            asked.append(name)
            answer = PUBLIC if len(asked) == 1 else "127.0.0.1"
        elif name == PUBLIC:
            answer = "127.0.0.2"  # the simulated internet: PUBLIC is the stand-in
        else:
            return _real_getaddrinfo(host, port, family, type, proto, flags)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (answer, int(port or 0)))]

    monkeypatch.setattr(socket, "getaddrinfo", fake)
    # anyio (the async client's sockets) connects to an IP literal without asking getaddrinfo.
    real_connect = anyio.connect_tcp

    async def connect(remote_host: Any, remote_port: int, **kwargs: Any) -> Any:
        host = "127.0.0.2" if str(remote_host) == PUBLIC else remote_host
        return await real_connect(host, remote_port, **kwargs)

    monkeypatch.setattr(anyio, "connect_tcp", connect)
    return asked


def test_http_fetch_connects_to_the_address_the_policy_checked(pair: Any, rebinding_dns: list[str]) -> None:
    internal, public, port = pair
    with HttpFetcher(UrlPolicy(), timeout_s=10) as http:
        result = http.fetch(f"http://rebind.test:{port}/page")
    assert "PUBLIC-STAND-IN" in result.text
    assert internal.seen == []  # the second DNS answer (127.0.0.1) was never used
    assert public.seen == [("/page", f"rebind.test:{port}")]  # the Host header keeps the name
    assert rebinding_dns == ["rebind.test"]  # one resolution: the one that was judged


def test_http_fetch_refuses_a_name_that_resolves_to_loopback_when_connecting(pair: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    internal, _public, port = pair
    answers = iter([[PUBLIC], ["127.0.0.1"]])
    # The policy's resolver is what the connection uses: a loopback answer there is refused.
    policy = UrlPolicy(resolver=lambda host: next(answers))
    assert policy.check(f"http://evil.test:{port}/") == f"http://evil.test:{port}/"  # first answer: public
    with HttpFetcher(policy, timeout_s=10) as http, pytest.raises(ToolError) as info:
        http.fetch(f"http://evil.test:{port}/x")  # second answer: loopback
    assert info.value.kind == "policy" and "127.0.0.1" in info.value.message
    assert internal.seen == []


def test_trusted_names_connect_through_the_policy_resolver(pair: Any) -> None:
    internal, _public, port = pair
    # An allowed origin skips the address rules, but the name is still resolved by the policy only
    # (the system resolver does not know "lab.test").
    policy = UrlPolicy(resolver=lambda host: ["127.0.0.1"] if host == "lab.test" else [])
    policy.allow_origin(f"http://lab.test:{port}")
    with HttpFetcher(policy, timeout_s=10) as http:
        assert "INTERNAL-SECRET" in http.fetch(f"http://lab.test:{port}/lab").text
    assert internal.seen == [("/lab", f"lab.test:{port}")]


@pytest.mark.browser
def test_browser_subrequests_connect_to_the_address_the_policy_checked(pair: Any, rebinding_dns: list[str]) -> None:
    import os

    from mgrpo_tools.browser import BrowserFetcher

    chromium = "/usr/bin/chromium"
    if not os.access(chromium, os.X_OK):
        pytest.skip("Chromium is not installed")
    internal, public, port = pair
    pixel = f"http://rebind.test:{port}/pixel"
    page = _serve("127.0.0.1", 0, "EMBEDDING-PAGE", f'<img src="{pixel}">')
    try:
        policy = UrlPolicy()
        policy.allow_origin(f"http://127.0.0.1:{page.server_address[1]}")
        with BrowserFetcher(policy, executable_path=chromium, timeout_s=60) as browser:
            result = browser.fetch(f"http://127.0.0.1:{page.server_address[1]}/page")
        assert "EMBEDDING-PAGE" in result.text
        assert [path for path, _host in public.seen] == ["/pixel"]  # reached the checked address
        assert internal.seen == []
        assert rebinding_dns == ["rebind.test"]
    finally:
        page.shutdown()
        page.server_close()


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("fec0::1", "site-local"),
        ("fec0:1:2:3::4", "site-local"),
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "Teredo"),  # a Teredo address with a public client
        ("2001::f7f7:f7f7", "Teredo"),  # client 8.8.8.8, obfuscated: still refused
        ("3fff::1", "documentation"),
        ("192.0.0.8", "IETF protocol"),
    ],
)
def test_deprecated_and_special_ranges_refused(address: str, reason: str) -> None:
    policy = UrlPolicy(resolver=lambda host: [address])
    literal = f"[{address}]" if ":" in address else address
    for url in (f"http://{literal}/", "http://looks-public.test/"):  # as a literal and as a DNS answer
        with pytest.raises(ToolError) as info:
            policy.check(url)
        assert info.value.kind == "policy" and reason in info.value.message, info.value.message
    with pytest.raises(ToolError):
        policy.connect_addresses("looks-public.test", 80)
