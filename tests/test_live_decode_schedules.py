"""benchmarks/live_decode.py's schedule figures, on episodes whose steps are counted by hand: the
synchronous rounds the rollout loop runs, and continuous batching (the lever it measured and did not
build)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

spec = importlib.util.spec_from_file_location("live_decode", Path(__file__).parents[1] / "benchmarks" / "live_decode.py")
live_decode = importlib.util.module_from_spec(spec)
spec.loader.exec_module(live_decode)


def _turn(tokens: int, delegate: bool = False) -> SimpleNamespace:
    return SimpleNamespace(extra={"completion_ids": [7] * tokens},
                           tool_call=SimpleNamespace(tool="delegate") if delegate else None)


def _record(main: list[SimpleNamespace], subs: list[list[int]]) -> SimpleNamespace:
    return SimpleNamespace(main=SimpleNamespace(turns=main), subs=[SimpleNamespace(turns=[_turn(n) for n in s]) for s in subs])


def test_turns_run_in_order_with_each_delegation_followed_by_its_sub_agent():
    record = _record([_turn(3, delegate=True), _turn(4, delegate=True), _turn(1)], [[2, 5], [6]])
    assert live_decode.turn_lengths(record) == [("main", 3), ("sub", 2), ("sub", 5), ("main", 4), ("sub", 6), ("main", 1)]


def test_rounds_and_continuous_batching_counted_by_hand():
    # episode 1: main 3, its sub-agent 2, main 1; episode 2: main 5 (answers at once)
    records = [_record([_turn(3, delegate=True), _turn(1)], [[2]]), _record([_turn(5)], [])]
    figures = live_decode.schedules(records)
    # rounds: main max(3, 5) = 5, then sub 2, then main 1: 8 model steps in 3 calls
    assert (figures["rounds_steps"], figures["rounds_calls"]) == (8, 3)
    # continuous: ticks 1-3 main only (episode 1's main turn ends at 3), ticks 4-5 main (episode 2) and
    # sub (episode 1) together, tick 6 episode 1's last main turn: 6 ticks, 1+1+1+2+2+1 = 8 model steps,
    # prefills at tick 1 (main), 4 (sub), 6 (main)
    assert (figures["continuous_ticks"], figures["continuous_steps"], figures["continuous_prefills"]) == (6, 8, 3)
    assert figures["longest_episode"] == 6
