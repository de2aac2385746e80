"""UrlPolicy and normalize_url: every rule refuses what it should, names itself, and lets the rest through."""

from __future__ import annotations

import pytest

from mgrpo_tools import OriginMap, ToolError, UrlPolicy, normalize_url


def fake_dns(table: dict[str, list[str]]):
    """A resolver from a dict; unknown names fail like the system resolver does."""

    def resolve(host: str) -> list[str]:
        if host not in table:
            raise OSError(f"[Errno -2] Name or service not known: {host}")
        return table[host]

    return resolve


DNS = fake_dns(
    {
        "example.org": ["93.184.215.14"],
        "docs.example.org": ["93.184.215.15"],
        "en.wikipedia.org": ["185.15.59.224", "2a02:ec80:300:ed1a::1"],
        "intranet.corp": ["10.1.2.3"],
        "rebind.evil": ["93.184.215.14", "192.168.1.10"],  # one private address is enough to refuse
        "v6local.evil": ["fd00::1"],
        "metadata.evil": ["169.254.169.254"],
    }
)


def refused(policy: UrlPolicy, url: str, *, kind: str = "policy") -> str:
    with pytest.raises(ToolError) as info:
        policy.check(url)
    assert info.value.kind == kind, info.value
    return info.value.message


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("HTTP://Example.ORG/a?b=1", "http://example.org/a?b=1"),
        ("http://example.org:80/", "http://example.org/"),
        ("https://example.org:443/x", "https://example.org/x"),
        ("https://example.org:8443/x", "https://example.org:8443/x"),
        ("http://example.org", "http://example.org/"),
        ("http://example.org/p#section-2", "http://example.org/p"),
        ("http://example.org/a b?q=x y", "http://example.org/a%20b?q=x%20y"),
        ("http://example.org/%C3%A4", "http://example.org/%C3%A4"),  # no double encoding
        ("http://example.org/ä", "http://example.org/%C3%A4"),
        ("  http://example.org/  ", "http://example.org/"),
        ("http://[::1]:8080/x", "http://[::1]:8080/x"),
        ("http://Bücher.DE/", "http://xn--bcher-kva.de/"),
        ("http://example.org/?b=2&a=1", "http://example.org/?b=2&a=1"),  # query order kept
    ],
)
def test_normalize_url(url: str, expected: str) -> None:
    assert normalize_url(url) == expected
    assert normalize_url(expected) == expected  # idempotent


def test_public_urls_pass_and_come_back_normalised() -> None:
    policy = UrlPolicy(resolver=DNS)
    assert policy.check("HTTPS://Example.org:443/wiki/X#top") == "https://example.org/wiki/X"
    assert policy.check("http://en.wikipedia.org/wiki/Amber?x=1") == "http://en.wikipedia.org/wiki/Amber?x=1"
    assert policy.check("http://93.184.215.14/") == "http://93.184.215.14/"
    assert policy.is_allowed("http://example.org/")


@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.org/f",
        "file:///etc/passwd",
        "javascript:alert(1)",
        "example.org/x",
        "data:text/html,hi",
    ],
)
def test_scheme_rule(url: str) -> None:
    message = refused(UrlPolicy(resolver=DNS), url)
    assert "scheme" in message


def test_custom_schemes() -> None:
    policy = UrlPolicy(schemes=["https"], resolver=DNS)
    assert "scheme 'http'" in refused(policy, "http://example.org/")
    assert policy.check("https://example.org/") == "https://example.org/"


@pytest.mark.parametrize(
    "url", ["http://user:pw@example.org/", "http://user@example.org/", "http://example.org\\@10.0.0.1/"]
)
def test_userinfo_rule(url: str) -> None:
    assert "credentials" in refused(UrlPolicy(resolver=DNS), url)


def test_length_rule() -> None:
    policy = UrlPolicy(max_url_length=60, resolver=DNS)
    assert policy.check("http://example.org/" + "a" * 30)
    assert "too long" in refused(policy, "http://example.org/" + "a" * 60)


@pytest.mark.parametrize(
    "url", ["http:///path", "http://exa mple.org:99999/", "http://example.org:port/", "http://[::1/"]
)
def test_malformed_urls(url: str) -> None:
    refused(UrlPolicy(resolver=DNS), url)


def test_control_characters_refused() -> None:
    assert "control" in refused(UrlPolicy(resolver=DNS), "http://example.org/a\nb")


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://127.0.0.1/", "loopback"),
        ("http://127.8.9.10:8080/", "loopback"),
        ("http://[::1]/", "loopback"),
        ("http://[::ffff:127.0.0.1]/", "loopback"),  # IPv4-mapped IPv6
        ("http://[::ffff:10.0.0.1]/", "private"),
        ("http://[2002:c0a8:0101::]/", "private"),  # 6to4 wrapping 192.168.1.1
        ("http://10.0.0.1/", "private"),
        ("http://172.16.5.4/", "private"),
        ("http://192.168.1.1/", "private"),
        ("http://[fd12:3456::1]/", "private"),
        ("http://169.254.169.254/latest/meta-data", "link-local"),  # cloud metadata endpoint
        ("http://[fe80::1]/", "link-local"),
        ("http://224.0.0.251/", "multicast"),
        ("http://[ff02::1]/", "multicast"),
        ("http://0.0.0.0/", "unspecified"),
        ("http://240.0.0.1/", "reserved"),
        ("http://100.64.0.1/", "non-global"),  # carrier-grade NAT
        ("http://localhost:8000/", "loopback"),
        ("http://api.localhost/", "loopback"),
    ],
)
def test_private_address_literals_refused(url: str, reason: str) -> None:
    message = refused(UrlPolicy(resolver=DNS), url)
    assert reason in message and "private networks" in message


@pytest.mark.parametrize(
    ("url", "address"),
    [
        ("http://intranet.corp/", "10.1.2.3"),
        ("http://rebind.evil/", "192.168.1.10"),
        ("http://v6local.evil/", "fd00::1"),
        ("http://metadata.evil/", "169.254.169.254"),
    ],
)
def test_names_resolving_to_private_addresses_refused(url: str, address: str) -> None:
    message = refused(UrlPolicy(resolver=DNS), url)
    assert "resolves to" in message and address in message


def test_system_resolver_sees_through_numeric_hosts() -> None:
    # getaddrinfo accepts these spellings of 127.0.0.1; the policy must judge the address, not the text.
    policy = UrlPolicy()
    for url in ("http://2130706433/", "http://0x7f000001/", "http://127.1/"):
        assert "loopback" in refused(policy, url)


def test_unresolvable_host_is_a_network_error() -> None:
    message = refused(UrlPolicy(resolver=DNS), "http://no-such-host.invalid/", kind="http")
    assert "cannot resolve" in message


def test_resolve_false_applies_static_rules_only() -> None:
    policy = UrlPolicy(resolver=DNS)
    assert policy.check("http://intranet.corp/x", resolve=False) == "http://intranet.corp/x"
    assert policy.check("http://no-such-host.invalid/", resolve=False)
    with pytest.raises(ToolError):
        policy.check("http://10.0.0.1/", resolve=False)  # literals are still judged
    with pytest.raises(ToolError):
        policy.check("ftp://example.org/", resolve=False)


def test_allow_private() -> None:
    policy = UrlPolicy(allow_private=True, resolver=DNS)
    assert policy.check("http://10.0.0.1/") == "http://10.0.0.1/"
    assert policy.check("http://intranet.corp/") == "http://intranet.corp/"
    refused(policy, "http://user:pw@10.0.0.1/")  # other rules still hold


def test_allow_origin_is_exact() -> None:
    policy = UrlPolicy(resolver=DNS)
    policy.allow_origin("http://127.0.0.1:8123")
    assert policy.check("http://127.0.0.1:8123/wiki/X") == "http://127.0.0.1:8123/wiki/X"
    assert policy.allowed_origins == ["http://127.0.0.1:8123"]
    assert "loopback" in refused(policy, "http://127.0.0.1:8124/")  # another port
    assert "loopback" in refused(policy, "http://127.0.0.1/")  # the default port
    assert "scheme" not in refused(policy, "https://127.0.0.1:8123/")  # another scheme: address rule
    assert "loopback" in refused(policy, "http://localhost:8123/")  # another host spelling
    policy.disallow_origin("http://127.0.0.1:8123")
    refused(policy, "http://127.0.0.1:8123/wiki/X")


def test_origin_map_is_exact_and_two_way() -> None:
    origins = OriginMap()
    origins.add("http://wiki-hops.test", "http://127.0.0.1:8123")
    assert origins.to_real("http://wiki-hops.test/wiki/X?a=1#f") == "http://127.0.0.1:8123/wiki/X?a=1#f"
    assert origins.to_real("HTTP://Wiki-Hops.TEST:80/wiki/X") == "http://127.0.0.1:8123/wiki/X"  # same origin
    assert origins.to_virtual("http://127.0.0.1:8123/wiki/X") == "http://wiki-hops.test/wiki/X"
    for untouched in (
        "http://example.com/wiki/X",  # a real external URL is never remapped
        "http://wiki-hops.test:8080/wiki/X",  # the virtual host on another port
        "https://wiki-hops.test/wiki/X",  # ... or another scheme
        "http://sub.wiki-hops.test/wiki/X",
        "http://user@wiki-hops.test/wiki/X",  # credentials: left for the policy to refuse
        "http://[::1/",  # malformed
    ):
        assert origins.to_real(untouched) == untouched
    assert origins.to_virtual("http://127.0.0.1:8124/x") == "http://127.0.0.1:8124/x"
    text = "see http://127.0.0.1:8123/wiki/A and http://127.0.0.1:81234/x and http://127.0.0.1:8123.evil/y"
    assert origins.virtualize_text(text) == (
        "see http://wiki-hops.test/wiki/A and http://127.0.0.1:81234/x and http://127.0.0.1:8123.evil/y"
    )
    with pytest.raises(ValueError):
        origins.add("http://wiki-hops.test", "http://127.0.0.1:9999")  # already mapped elsewhere
    with pytest.raises(ValueError):
        origins.add("wiki-hops.test", "http://127.0.0.1:9999")  # not an origin
    assert origins.items() == [("http://wiki-hops.test", "http://127.0.0.1:8123")]
    origins.remove("http://wiki-hops.test")
    assert not origins and origins.to_real("http://wiki-hops.test/") == "http://wiki-hops.test/"


def test_map_origin_allows_only_the_virtual_origin() -> None:
    # example.com "resolves" to the loopback address that serves the virtual origin: still refused.
    policy = UrlPolicy(resolver=fake_dns({"example.com": ["127.0.0.1"], "wiki-hops.test": ["127.0.0.1"]}))
    policy.map_origin("http://wiki-hops.test", "http://127.0.0.1:8123")
    assert policy.check("http://wiki-hops.test/wiki/X") == "http://wiki-hops.test/wiki/X"
    assert not policy.needs_lookup("http://wiki-hops.test/wiki/X")
    assert policy.allowed_origins == ["http://wiki-hops.test:80"]  # the port made explicit
    assert "loopback" in refused(policy, "http://example.com/wiki/X")  # decided as before, not remapped
    assert "loopback" in refused(policy, "http://wiki-hops.test:8080/wiki/X")  # another port: not the site
    assert "loopback" in refused(policy, "https://wiki-hops.test/wiki/X")
    assert "loopback" in refused(policy, "http://127.0.0.1:8123/wiki/X")  # the real origin is not allowed
    policy.unmap_origin("http://wiki-hops.test")
    assert "loopback" in refused(policy, "http://wiki-hops.test/wiki/X")
    assert policy.origin_map.to_real("http://wiki-hops.test/") == "http://wiki-hops.test/"


def test_allow_origin_default_port() -> None:
    policy = UrlPolicy(resolver=DNS)
    policy.allow_origin("http://10.0.0.5")
    assert policy.check("http://10.0.0.5:80/a") == "http://10.0.0.5/a"
    with pytest.raises(ValueError):
        policy.allow_origin("not a url")


def test_allow_list_exact_and_suffix() -> None:
    policy = UrlPolicy(allow_hosts=["en.wikipedia.org", ".example.org"], resolver=DNS)
    assert policy.check("http://en.wikipedia.org/") == "http://en.wikipedia.org/"
    assert policy.check("http://example.org/") == "http://example.org/"
    assert policy.check("http://docs.example.org/") == "http://docs.example.org/"
    assert "allow-list" in refused(policy, "http://de.wikipedia.org/")
    assert "allow-list" in refused(policy, "http://notexample.org/")  # a suffix matches at a dot only
    assert "private networks" in refused(
        UrlPolicy(allow_hosts=["intranet.corp"], resolver=DNS), "http://intranet.corp/"
    )  # the allow-list does not lift the address rule


def test_deny_list_beats_allow_list_and_origins() -> None:
    policy = UrlPolicy(
        allow_hosts=[".example.org"], deny_hosts=["docs.example.org", ".bad.test"], resolver=DNS
    )
    assert "deny-list" in refused(policy, "http://docs.example.org/")
    assert "deny-list" in refused(policy, "http://x.bad.test/")
    assert "deny-list" in refused(policy, "http://bad.test/")
    assert policy.check("http://example.org/")
    policy.allow_origin("http://docs.example.org")
    assert "deny-list" in refused(policy, "http://docs.example.org/")


def test_non_string_url() -> None:
    with pytest.raises(ToolError) as info:
        UrlPolicy().check(42)  # type: ignore[arg-type]
    assert info.value.kind == "policy"
