"""Which URLs the web tools may fetch, and the canonical form of a URL.

Every URL an agent asks for, every redirect hop and (in the browser) every sub-resource request is
passed through :meth:`UrlPolicy.check` before any byte goes on the wire. The defaults refuse what a
research agent must never reach: non-web schemes, credentials in URLs, and private, loopback,
link-local, reserved or multicast addresses, including public-looking host names that *resolve*
to such addresses. The scenario's own loopback site is let through with
:meth:`UrlPolicy.allow_origin` (only that exact scheme, host and port), or, better, given a stable
virtual origin with :meth:`UrlPolicy.map_origin`: the virtual origin (``http://wiki-hops.test``) is
allowed and is what every URL shows, and :attr:`UrlPolicy.origin_map` tells the fetchers which real
origin (``http://127.0.0.1:43125``) to connect to. The policy always judges the virtual URL; a URL
on any other origin (an external site, the virtual host on another port or scheme) is never mapped
and is judged by the rules below as before.

DNS rebinding: a name checked here could resolve to another address when the client connects. The
fetchers therefore never let their client resolve a name: they connect through
:meth:`UrlPolicy.connect_addresses` (see :mod:`.pinning`), which resolves the name once, applies the
address rules to that answer and returns the addresses the connection must use. What was checked is
what is connected to. Chromium's own resolver is switched off (every request it makes is served by
the browser fetcher's route handler through the same pinned client).

Example::

    policy = UrlPolicy()
    policy.allow_origin(site.origin)          # "http://127.0.0.1:43125"
    url = policy.check("HTTP://Example.org:80/a?b=1#frag")   # -> "http://example.org/a?b=1"

    policy.map_origin("http://wiki-hops.test", site.origin)
    policy.check("http://wiki-hops.test/wiki/X")             # allowed, as written
    policy.origin_map.to_real("http://wiki-hops.test/wiki/X")  # -> "http://127.0.0.1:43125/wiki/X"
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading
from collections.abc import Callable, Iterable
from urllib.parse import SplitResult, quote, urlsplit, urlunsplit

from .base import ToolError
from .origin_map import OriginMap

__all__ = ["UrlPolicy", "normalize_url", "origin_of", "DEFAULT_PORTS"]

DEFAULT_PORTS = {"http": 80, "https": 443}

# Characters left as they are when re-quoting a path or query: the reserved set plus '%' so that
# already-encoded sequences are not encoded twice.
_PATH_SAFE = "/%:@!$&'()*+,;=-._~"
_QUERY_SAFE = _PATH_SAFE + "?"

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str], list[str]]


def _split(url: str) -> SplitResult:
    """``urlsplit`` with a clear error instead of ValueError (bad port, bad IPv6 literal)."""
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError for a non-numeric or out-of-range port
    except ValueError as exc:
        raise ToolError("policy", f"malformed URL {url!r}: {exc}") from None
    return parts


def _canonical_host(host: str) -> str:
    """Lower-case host; non-ASCII names to their IDNA (punycode) form so one host has one spelling."""
    host = host.lower().rstrip(".")
    if host and not host.isascii():
        with contextlib.suppress(UnicodeError):  # leave it; the connection fails with a clear error
            host = host.encode("idna").decode("ascii")
    return host


def _netloc(host: str, port: int | None) -> str:
    shown = f"[{host}]" if ":" in host else host  # IPv6 literals need their brackets back
    return shown if port is None else f"{shown}:{port}"


def normalize_url(url: str) -> str:
    """The canonical form of ``url``, used as a cache key and for comparing URLs.

    Lower-cases scheme and host, drops the default port (80 for http, 443 for https) and the
    fragment, keeps the query, turns an empty path into ``/`` and percent-encodes characters that
    are not allowed in a URL (spaces, non-ASCII) without double-encoding existing escapes.
    Userinfo is kept (so that :meth:`UrlPolicy.check` can refuse it); surrounding whitespace is
    stripped.

    >>> normalize_url("HTTP://Example.ORG:80/a b?q=1#top")
    'http://example.org/a%20b?q=1'
    """
    parts = _split(url.strip())
    scheme = parts.scheme.lower()
    host = _canonical_host(parts.hostname or "")
    port = parts.port
    if port is not None and DEFAULT_PORTS.get(scheme) == port:
        port = None
    netloc = _netloc(host, port)
    if parts.username is not None or parts.password is not None:
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@{netloc}"
    path = quote(parts.path, safe=_PATH_SAFE) or ("/" if netloc else "")
    query = quote(parts.query, safe=_QUERY_SAFE)
    return urlunsplit((scheme, netloc, path, query, ""))


def origin_of(url: str) -> tuple[str, str, int | None]:
    """``(scheme, host, port)`` of a URL with the port made explicit for http and https."""
    parts = _split(url.strip())
    scheme = parts.scheme.lower()
    port = parts.port if parts.port is not None else DEFAULT_PORTS.get(scheme)
    return scheme, _canonical_host(parts.hostname or ""), port


# Special-purpose ranges this Python's ``ipaddress`` may judge global (its tables lag the IANA
# registries): each entry is (network, reason). Teredo is refused outright: its "client" IPv4 is only
# where the NAT was, and a relay would carry the packets anywhere.
_EXTRA_FORBIDDEN: tuple[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, str], ...] = (
    (ipaddress.ip_network("fec0::/10"), "site-local (deprecated)"),
    (ipaddress.ip_network("2001::/32"), "Teredo"),
    (ipaddress.ip_network("3fff::/20"), "documentation"),  # RFC 9637 (2024)
    (ipaddress.ip_network("192.0.0.0/24"), "IETF protocol assignments"),  # whole /24: RFC 6890
)


def _forbidden_reason(ip: IpAddress) -> str | None:
    """Why ``ip`` must not be contacted, or None for a public address."""
    for network, name in _EXTRA_FORBIDDEN:
        if ip.version == network.version and ip in network:
            return name
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.is_site_local:  # fec0::/10 is caught above; kept for a future table that moves it
            return "site-local (deprecated)"
        # An IPv4 address tunnelled in IPv6 (mapped, 6to4) is judged as the IPv4 address it reaches.
        embedded = ip.ipv4_mapped or ip.sixtofour
        if embedded is not None:
            return _forbidden_reason(embedded)
    checks = (
        ("loopback", ip.is_loopback),
        ("unspecified", ip.is_unspecified),
        ("link-local", ip.is_link_local),
        ("multicast", ip.is_multicast),
        ("reserved", ip.is_reserved),
        ("private", ip.is_private),
        # Shared address space (100.64.0.0/10) and the like: neither private nor global.
        ("non-global", not ip.is_global),
    )
    for name, hit in checks:
        if hit:
            return name
    return None


def _system_resolver(host: str) -> list[str]:
    """All addresses ``host`` resolves to (IPv4 and IPv6), via the system resolver."""
    infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    return sorted({str(info[4][0]) for info in infos})


class UrlPolicy:
    """Decides whether a URL may be fetched; thread-safe.

    Rules, in the order they are checked (the first that fails names itself in the error):

    1. ``max_url_length``: longer URLs are refused.
    2. scheme in ``schemes`` (default http and https).
    3. a host is present and the URL carries no userinfo (``user:pass@``).
    4. host not in ``deny_hosts``.
    5. an origin registered with :meth:`allow_origin` or :meth:`map_origin` is accepted here
       (exact scheme, host, port), without the allow-list and address checks: it is the
       scenario's own site.
    6. host in ``allow_hosts`` when an allow-list is given.
    7. unless ``allow_private``: the host, if an IP literal, or every address it resolves to,
       must be public (not private, loopback, link-local, reserved, multicast, unspecified).

    Host entries (allow and deny) are an exact host (``"example.org"``) or a domain suffix written
    with a leading dot (``".example.org"``), which matches ``example.org`` and all its subdomains.

    Args:
        schemes: accepted URL schemes.
        allow_hosts: if given, only these hosts (plus allowed origins) may be fetched.
        deny_hosts: hosts that are always refused, even inside the allow-list.
        allow_private: accept private and loopback addresses (a trusted lab network).
        max_url_length: longest accepted URL, in characters.
        resolver: ``host -> [address, ...]``; defaults to ``socket.getaddrinfo``. Tests inject one.
    """

    def __init__(
        self,
        *,
        schemes: Iterable[str] = ("http", "https"),
        allow_hosts: Iterable[str] | None = None,
        deny_hosts: Iterable[str] = (),
        allow_private: bool = False,
        max_url_length: int = 2048,
        resolver: Resolver | None = None,
    ) -> None:
        self.schemes = frozenset(s.lower() for s in schemes)
        self.allow_hosts = None if allow_hosts is None else frozenset(_canonical_host(h) for h in allow_hosts)
        self.deny_hosts = frozenset(_canonical_host(h) for h in deny_hosts)
        self.allow_private = allow_private
        self.max_url_length = max_url_length
        self._resolver = resolver or _system_resolver
        self._origins: set[tuple[str, str, int | None]] = set()
        self._lock = threading.Lock()
        self.origin_map = OriginMap()

    # -- origins -------------------------------------------------------------------------------

    def allow_origin(self, origin: str) -> None:
        """Accept this exact origin (``"http://127.0.0.1:43125"``) even though it is private.

        Only the same scheme, host and port pass; other ports of the same host stay refused.
        """
        scheme, host, port = origin_of(origin)
        if not scheme or not host:
            raise ValueError(f"an origin needs a scheme and a host, got {origin!r}")
        with self._lock:
            self._origins.add((scheme, host, port))

    def disallow_origin(self, origin: str) -> None:
        """Undo :meth:`allow_origin` (when a scenario's site is torn down)."""
        with self._lock:
            self._origins.discard(origin_of(origin))

    def map_origin(self, virtual: str, real: str) -> None:
        """Allow the virtual origin ``virtual`` and serve it from ``real`` (see :mod:`.origin_map`).

        URLs keep showing ``virtual``; the fetchers connect to ``real``. ``real`` itself is not
        allowed by this call: a URL naming it is refused like any loopback address (the fetchers
        turn a redirect to it back into the virtual origin before checking it).
        """
        self.origin_map.add(virtual, real)
        self.allow_origin(virtual)

    def unmap_origin(self, virtual: str) -> None:
        """Undo :meth:`map_origin` (when the site behind it is torn down)."""
        self.origin_map.remove(virtual)
        self.disallow_origin(virtual)

    @property
    def allowed_origins(self) -> list[str]:
        """The origins registered with :meth:`allow_origin`, as URLs."""
        with self._lock:
            return sorted(f"{s}://{_netloc(h, p)}" for s, h, p in self._origins)

    # -- checking ------------------------------------------------------------------------------

    def is_allowed(self, url: str) -> bool:
        """True when :meth:`check` would accept ``url``."""
        try:
            self.check(url)
        except ToolError:
            return False
        return True

    def needs_lookup(self, url: str) -> bool:
        """True when :meth:`check` would ask DNS about ``url``'s host (a blocking call).

        False for IP literals, allowed origins, ``allow_private`` and URLs the static rules refuse,
        so that async callers can run the cheap checks inline and only lookups in a thread.
        """
        try:
            normalised = self.check(url, resolve=False)
        except ToolError:
            return False
        if self.allow_private:
            return False
        with self._lock:
            if origin_of(normalised) in self._origins:
                return False
        host = origin_of(normalised)[1].split("%", 1)[0]
        try:
            ipaddress.ip_address(host)
        except ValueError:
            return True
        return False

    def connect_addresses(self, host: str, port: int | None) -> list[str]:
        """The addresses a connection to ``host:port`` must use, resolved once and checked.

        The fetchers' network layer (:mod:`.pinning`) calls this instead of letting the HTTP client
        resolve the name, so the addresses judged here are the ones connected to (no DNS-rebinding
        window). An IP literal is returned as it is (its URL was judged by :meth:`check`); a name is
        resolved with the policy's resolver and every answer must pass the address rules, unless the
        host and port are an allowed origin, the real side of a mapped origin, or ``allow_private``
        is set. Raises ``ToolError("policy")`` for a forbidden answer and ``ToolError("http")`` when
        the name does not resolve.
        """
        host = _canonical_host(host.strip("[]"))
        literal = host.split("%", 1)[0]
        try:
            ip = ipaddress.ip_address(literal)
        except ValueError:
            ip = None
        if ip is not None:
            return [host]
        with self._lock:
            trusted = any(h == host and p == port for _s, h, p in self._origins)
        trusted = trusted or any(origin_of(real)[1:] == (host, port) for _v, real in self.origin_map.items())
        if self.allow_private or trusted:
            return self._resolve(host)
        self._check_addresses(host, resolve=False)  # "localhost" and the like, before asking DNS
        addresses = self._resolve(host)
        self._judge(host, addresses)
        return addresses

    def _resolve(self, host: str) -> list[str]:
        try:
            addresses = list(self._resolver(host))
        except (OSError, UnicodeError) as exc:
            raise ToolError("http", f"cannot resolve host '{host}': {exc}") from None
        if not addresses:
            raise ToolError("http", f"cannot resolve host '{host}': no addresses")
        return addresses

    def check(self, url: str, *, resolve: bool = True) -> str:
        """Return the normalised URL, or raise ``ToolError("policy", ...)`` naming the broken rule.

        With ``resolve=False`` a host name is not looked up (IP literals are still judged): the
        static rules only, used to build a cache key before deciding whether to go online. A name
        that cannot be resolved raises ``ToolError("http", ...)``: it is a network failure, not a
        policy decision, but the fetch is refused all the same.
        """
        if not isinstance(url, str):
            raise ToolError("policy", f"a URL must be a string, got {type(url).__name__}")
        url = url.strip()
        if len(url) > self.max_url_length:
            raise ToolError("policy", f"URL too long ({len(url)} > {self.max_url_length} characters)")
        if any(ord(c) < 32 or ord(c) == 127 for c in url):
            raise ToolError("policy", "URL contains control characters")
        parts = _split(url)
        scheme = parts.scheme.lower()
        if scheme not in self.schemes:
            shown = scheme or "(none)"
            raise ToolError(
                "policy",
                f"scheme '{shown}' not allowed in {url!r} (allowed: {', '.join(sorted(self.schemes))})",
            )
        if "@" in parts.netloc or parts.username is not None:
            raise ToolError("policy", "credentials (user:password@) in URLs are not allowed")
        if "\\" in parts.netloc:
            raise ToolError("policy", f"malformed host in {url!r}")
        host = _canonical_host(parts.hostname or "")
        if not host:
            raise ToolError("policy", f"URL has no host: {url!r}")
        normalised = normalize_url(url)
        if len(normalised) > self.max_url_length:
            raise ToolError("policy", f"URL too long ({len(normalised)} > {self.max_url_length} characters)")
        if self._matches(host, self.deny_hosts):
            raise ToolError("policy", f"host '{host}' is on the deny-list")
        with self._lock:
            if origin_of(normalised) in self._origins:
                return normalised
        if self.allow_hosts is not None and not self._matches(host, self.allow_hosts):
            raise ToolError("policy", f"host '{host}' is not on the allow-list")
        if not self.allow_private:
            self._check_addresses(host, resolve=resolve)
        return normalised

    @staticmethod
    def _matches(host: str, entries: frozenset[str]) -> bool:
        if host in entries:
            return True
        return any(entry.startswith(".") and (host.endswith(entry) or host == entry[1:]) for entry in entries)

    def _check_addresses(self, host: str, *, resolve: bool) -> None:
        literal = host.split("%", 1)[0]  # an IPv6 zone id ("fe80::1%eth0") is not part of the address
        try:
            ip = ipaddress.ip_address(literal)
        except ValueError:
            ip = None
        if ip is not None:
            reason = _forbidden_reason(ip)
            if reason:
                raise ToolError("policy", f"address {host} is {reason}; private networks are not allowed")
            return
        if host == "localhost" or host.endswith(".localhost"):
            raise ToolError("policy", f"host '{host}' is loopback; private networks are not allowed")
        if not resolve:
            return
        self._judge(host, self._resolve(host))

    @staticmethod
    def _judge(host: str, addresses: list[str]) -> None:
        """Refuse unless every address ``host`` resolved to is public (one private answer is enough)."""
        for address in addresses:
            try:
                resolved = ipaddress.ip_address(address.split("%", 1)[0])
            except ValueError:
                raise ToolError(
                    "policy", f"host '{host}' resolved to an unparseable address {address!r}"
                ) from None
            reason = _forbidden_reason(resolved)
            if reason:
                raise ToolError(
                    "policy",
                    f"host '{host}' resolves to {address}, which is {reason}; private networks are not allowed",
                )
