"""A web that misbehaves on purpose (mgrpo_tools.faultserver): every fault is an error observation
with a stable kind, through the tools, the browser and the AEC env; nothing raises or hangs.

The fault server binds 127.0.0.1 and is let through the URL policy explicitly, as the virtual origin
``http://faults.test``. The long version (>= 10,000 calls) is ``benchmarks/fault_soak.py``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest

from mgrpo_env.aec import MGRPOEnv
from mgrpo_tools import UrlPolicy
from mgrpo_tools.base import ToolError
from mgrpo_tools.faultserver import FAULTS, VIRTUAL_ORIGIN, FaultServer, admit
from mgrpo_tools.fetch import HttpFetcher
from mgrpo_tools.visit import make_browsing_tools

ORIGIN = VIRTUAL_ORIGIN
CHROMIUM = "/usr/bin/chromium"

# What the plain-HTTP visit tool answers for each fault: an error kind, or "ok" for pages that are
# readable after all (invalid UTF-8 is decoded with U+FFFD; the JavaScript pages carry their HTML).
EXPECTED_HTTP = {
    "/500": "http",
    "/503": "http",
    "/reset": "http",
    "/reset-early": "http",
    "/drip": "timeout",
    "/redirect-loop": "http",
    "/redirect-chain": "http",
    "/gzip-bomb": "content",
    "/big": "content",
    "/big-declared": "content",
    "/binary": "content",
    "/binary-as-html": "content",
    "/invalid-utf8": "ok",
    "/js-never-settles": "ok",
    "/js-busy-loop": "ok",
    "/ok": "ok",
}


def kind(error: str | None) -> str:
    return "ok" if error is None else error.split(":", 1)[0]


@pytest.fixture(scope="module", name="faults")
def faults_fixture() -> Iterator[FaultServer]:
    with FaultServer(drip_s=20) as server:
        yield server


@pytest.fixture(name="policy")
def policy_fixture(faults: FaultServer) -> UrlPolicy:
    return admit(UrlPolicy(), faults.origin)  # the one explicit allowance


def test_every_fault_is_known_to_the_test() -> None:
    assert set(FAULTS) == set(EXPECTED_HTTP)


def test_http_visit_gives_a_stable_error_kind_per_fault(policy: UrlPolicy) -> None:
    with HttpFetcher(policy, timeout_s=2.0) as http:
        visit = make_browsing_tools(http, None, "never")["visit"]
        for path, expected in EXPECTED_HTTP.items():
            seen = {kind(visit({"url": f"{ORIGIN}{path}?n={n}", "goal": "facts"}).error) for n in range(3)}
            assert seen == {expected}, (path, seen)
        text = visit({"url": f"{ORIGIN}/invalid-utf8?n=9", "goal": "facts"}).text
        assert "\ufffd" in text and "still a page worth reading" in text


def test_the_fault_server_is_not_reachable_by_its_real_address(policy: UrlPolicy, faults: FaultServer) -> None:
    with HttpFetcher(policy, timeout_s=2.0) as http:
        visit = make_browsing_tools(http, None, "never")["visit"]
        result = visit({"url": faults.origin + "/ok", "goal": "x"})
    assert kind(result.error) == "policy"
    with HttpFetcher(UrlPolicy()) as http:  # without the allowance, faults.test is just a name
        result = make_browsing_tools(http, None, "never")["visit"]({"url": f"{ORIGIN}/ok", "goal": "x"})
    assert not result.ok


@pytest.mark.browser
def test_browser_faults(policy: UrlPolicy) -> None:
    from mgrpo_tools.browser import BrowserFetcher

    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip("Chromium is not installed")
    expected = {
        "/500": "http", "/reset": "http", "/drip": "timeout", "/redirect-loop": "http",
        "/gzip-bomb": "content", "/big": "content", "/binary": "content", "/binary-as-html": "content",
        "/js-busy-loop": "timeout",
    }
    with BrowserFetcher(policy, executable_path=CHROMIUM, timeout_s=8.0, max_idle_wait_s=0.5) as browser:
        for path, want in expected.items():
            with pytest.raises(ToolError) as info:
                browser.fetch(f"{ORIGIN}{path}?n=1")
            assert info.value.kind == want, (path, info.value)
            assert "127.0.0.1" not in info.value.message  # errors name the URL the agent sees
        # A page that never stops polling is read after the bounded quiet wait, with its JS text.
        page = browser.fetch(f"{ORIGIN}/js-never-settles?n=1")
        assert "The counter page has ticked" in page.text
        assert "Fine" in browser.fetch(f"{ORIGIN}/ok?n=2").text  # still usable after all that


def test_faults_through_the_aec_env(small_scenario, faults: FaultServer) -> None:
    paths = [p for p, k in EXPECTED_HTTP.items() if not p.startswith("/js-")]
    with small_scenario.open() as world:
        world.policy.map_origin(ORIGIN, faults.origin)
        world.http.close()
        world.http = HttpFetcher(world.policy, timeout_s=2.0)
        env = MGRPOEnv(small_scenario, "stage1", world=world, max_sub_turns=len(paths) + 2, max_main_turns=3)
        env.reset(seed=0)
        sub_actions = iter(
            [f'<tool_call>{{"name": "visit", "arguments": {{"url": "{ORIGIN}{p}?n=1", "goal": "x"}}}}</tool_call>'
             for p in paths] + ["<result>done</result>"]
        )
        main_actions = iter(['<tool_call>{"name": "delegate", "arguments": {"task": "read"}}</tool_call>',
                             "<answer>none</answer>"])
        for agent in env.agent_iter(max_iter=100):
            _obs, _reward, term, trunc, _info = env.last()
            env.step(None if term or trunc else next(main_actions if agent == "main_0" else sub_actions))
        record = env.record
        env.close()
    assert record is not None and record.end_reason == "answer"
    calls = record.subs[0].tool_calls
    assert [kind(c.error) for c in calls] == [EXPECTED_HTTP[p] for p in paths]
    assert set(record.rewards) == {"main_0", "sub_0"}
    json.dumps(record.to_dict())  # the record is complete enough to write
