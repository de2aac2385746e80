"""httpx transports that connect only to the addresses the URL policy checked (no DNS rebinding).

A URL policy that resolves a name to judge it, followed by an HTTP client that resolves the same name
again to connect, leaves a window in which a hostile DNS server can answer a public address first and
``127.0.0.1`` second. The transports here close it one layer down, in httpcore's network backend:
``connect_tcp(host, port)`` asks :meth:`UrlPolicy.connect_addresses` for the addresses (one
resolution, judged by the policy's address rules) and opens the socket to one of those addresses.
Everything above the socket is unchanged: the request URL, the ``Host`` header, the connection pool
key and TLS (SNI and certificate checks) still use the host name.

Example::

    client = httpx.Client(transport=PinnedTransport(policy))
    client.get("http://example.org/")   # connects to the address policy.connect_addresses gave
"""

from __future__ import annotations

import ipaddress
import typing

import anyio
import httpcore
import httpx

from .url_policy import UrlPolicy

__all__ = ["PinnedTransport", "AsyncPinnedTransport", "PinnedBackend", "AsyncPinnedBackend"]

SocketOptions = typing.Iterable[typing.Any] | None


class PinnedBackend(httpcore.NetworkBackend):
    """httpcore's sync backend, connecting to the policy's checked addresses for a host name."""

    def __init__(self, policy: UrlPolicy, inner: httpcore.NetworkBackend | None = None) -> None:
        self.policy = policy
        self.inner = inner or httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: SocketOptions = None,
    ) -> httpcore.NetworkStream:
        # A ToolError from the policy propagates through httpx unchanged (it is no httpcore error).
        addresses = self.policy.connect_addresses(host, port)
        error: Exception | None = None
        for address in addresses:  # as socket.create_connection does: the first that answers
            try:
                return self.inner.connect_tcp(
                    address, port, timeout=timeout, local_address=local_address, socket_options=socket_options
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                error = exc
        assert error is not None  # connect_addresses never returns an empty list
        raise error

    def connect_unix_socket(self, *args: typing.Any, **kwargs: typing.Any) -> httpcore.NetworkStream:
        raise httpcore.ConnectError("unix sockets are not used by the web tools")

    def sleep(self, seconds: float) -> None:
        self.inner.sleep(seconds)


class AsyncPinnedBackend(httpcore.AsyncNetworkBackend):
    """The asyncio/anyio twin of :class:`PinnedBackend`; the lookup runs in a worker thread."""

    def __init__(self, policy: UrlPolicy, inner: httpcore.AsyncNetworkBackend | None = None) -> None:
        self.policy = policy
        self.inner = inner or httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: SocketOptions = None,
    ) -> httpcore.AsyncNetworkStream:
        if _is_ip_literal(host):  # no lookup: skip the thread hop (every request of a loopback site)
            addresses = self.policy.connect_addresses(host, port)
        else:
            # getaddrinfo blocks: keep it off the event loop (Chromium's route handlers share that loop).
            addresses = await anyio.to_thread.run_sync(self.policy.connect_addresses, host, port)
        error: Exception | None = None
        for address in addresses:
            try:
                return await self.inner.connect_tcp(
                    address, port, timeout=timeout, local_address=local_address, socket_options=socket_options
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                error = exc
        assert error is not None
        raise error

    async def connect_unix_socket(self, *args: typing.Any, **kwargs: typing.Any) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("unix sockets are not used by the web tools")

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


def _is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return False
    return True


def _pool_kwargs(limits: httpx.Limits, verify: bool) -> dict[str, typing.Any]:
    return {
        "ssl_context": httpx.create_ssl_context(verify=verify, trust_env=False),
        "max_connections": limits.max_connections,
        "max_keepalive_connections": limits.max_keepalive_connections,
        "keepalive_expiry": limits.keepalive_expiry,
    }


class PinnedTransport(httpx.HTTPTransport):
    """``httpx.HTTPTransport`` whose connections go through :class:`PinnedBackend`.

    httpx has no public hook for the network backend, so the pool httpx built is replaced by an
    identical ``httpcore.ConnectionPool`` given the pinned backend; httpx's request and error
    handling (which use that pool) stay as they are.
    """

    def __init__(self, policy: UrlPolicy, *, limits: httpx.Limits | None = None, verify: bool = True) -> None:
        limits = limits or httpx.Limits()
        super().__init__(limits=limits, verify=verify, trust_env=False)
        if not isinstance(getattr(self, "_pool", None), httpcore.ConnectionPool):
            raise RuntimeError("this httpx version keeps no httpcore pool in HTTPTransport._pool")
        self._pool.close()
        self._pool = httpcore.ConnectionPool(network_backend=PinnedBackend(policy), **_pool_kwargs(limits, verify))


class AsyncPinnedTransport(httpx.AsyncHTTPTransport):
    """``httpx.AsyncHTTPTransport`` whose connections go through :class:`AsyncPinnedBackend`."""

    def __init__(self, policy: UrlPolicy, *, limits: httpx.Limits | None = None, verify: bool = True) -> None:
        limits = limits or httpx.Limits()
        super().__init__(limits=limits, verify=verify, trust_env=False)
        if not isinstance(getattr(self, "_pool", None), httpcore.AsyncConnectionPool):
            raise RuntimeError("this httpx version keeps no httpcore pool in AsyncHTTPTransport._pool")
        # The pool httpx built has opened nothing yet; dropping it needs no await.
        self._pool = httpcore.AsyncConnectionPool(
            network_backend=AsyncPinnedBackend(policy), **_pool_kwargs(limits, verify)
        )
