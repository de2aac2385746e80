"""Bytes that cross the worker boundary per turn under the ``processes`` placement: the whole chat
and the task (before issue 43) against the turn's new messages and an episode key (now).

    .venv/bin/python benchmarks/request_bytes.py [--quick]

One single-agent episode of N turns (6, 12 and 24; --quick: 3 and 6) runs in the real env on the
300-entity wiki-hops world, full profile (4,000-character visit pages, 5 search hits), with real tool
calls: it searches an entity, visits its page, searches the next one, ..., and answers at turn N. The
actions come from a scripted role worker spawned by the real ``processes`` placement
(:func:`mgrpo_algo.distributed.placement.spawn`: a child process, a pipe, pickled calls); the bytes are
what the placement's pipe carries for each ``act`` call (``multiprocessing``'s own pickler on the
exact message it sends), measured by wrapping the handle's connection.

* before: the loop sent each turn's :class:`~mgrpo_env.rollout.PolicyRequest` whole (every message
  of the chat so far, the task with its gold answer, the observation);
* now: :class:`~mgrpo_env.turn_requests.TurnRequest` (the messages the worker has not seen: the
  tool response; the worker keeps the chat and appends its own answer).

Both forms drive the same worker to the same actions (checked: equal records). Writes
benchmarks/results/request_bytes.json and prints the table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from common import report  # noqa: E402

from mgrpo_env.rollout import PolicyRequest, collect  # noqa: E402
from mgrpo_env.turn_requests import ChatKeeper, TurnRequest, TurnSender  # noqa: E402


class ScriptedWorker:
    """A role worker whose policy is a script (search, visit, ..., answer at turn ``turns``): it answers
    both forms of request, the whole one (before) and the new messages only (now)."""

    def __init__(self, turns: int, entities: list[str], urls: list[str]) -> None:
        self.turns, self.entities, self.urls = turns, entities, urls
        self.chats = ChatKeeper()

    def _action(self, request: PolicyRequest) -> str:
        turn = sum(m["role"] == "assistant" for m in request.messages)
        if turn == self.turns - 1:
            return "<think>enough read</think><answer>unknown</answer>"
        i = turn // 2
        if turn % 2 == 0:
            call = {"name": "search", "arguments": {"queries": [self.entities[i]]}}
        else:
            call = {"name": "visit", "arguments": {"url": self.urls[i], "goal": f"facts about {self.entities[i]}"}}
        return f"<think>{call['name']} {self.entities[i]}</think><tool_call>{json.dumps(call)}</tool_call>"

    def act_whole(self, iteration: int, requests: list[PolicyRequest]) -> list[str]:
        return [self._action(r) for r in requests]

    def act(self, iteration: int, turns: list[TurnRequest]) -> list[str]:
        requests = [self.chats.expand(t, []) for t in turns]
        texts = [self._action(r) for r in requests]
        self.chats.answered(requests, texts)
        return texts

    def release(self, episode: int, agent: str) -> None:
        self.chats.release(episode, agent)


class Counted:
    """The loop's policy over the handle, in one of the two forms; records the pipe's bytes per call."""

    def __init__(self, handle: Any, form: str) -> None:
        self.handle, self.form, self.sender = handle, form, TurnSender()
        self.sizes: list[int] = []
        self.task_crossed = False
        conn = handle._conn
        send = conn.send

        def counting_send(obj: Any) -> None:
            blob = bytes(ForkingPickler.dumps(obj))  # what Connection.send writes
            if len(obj) > 2 and obj[2] in ("act", "act_whole"):
                self.sizes.append(len(blob))
                self.task_crossed |= b"mgrpo_scenarios.base" in blob  # the Task dataclass (gold answer inside)
            send(obj)

        conn.send = counting_send

    def __call__(self, requests: list[PolicyRequest]) -> list[str]:
        if self.form == "before":
            return self.handle.call("act_whole", 0, list(requests))
        texts = self.handle.call("act", 0, self.sender.compact(requests))
        self.sender.answered(requests)
        return texts

    def release(self, episode: int, agent: str) -> None:
        self.sender.release(episode, agent)
        self.handle.call("release", episode, agent)


def run(scenario: Any, world: Any, turns: int, form: str) -> tuple[list[int], bool, Any]:
    from mgrpo_algo.distributed.placement import spawn

    task = list(scenario.tasks("stage2/test"))[0]
    names = [h.entity for t in [task, *scenario.tasks("stage2/test")] for h in t.hops]
    entities = list(dict.fromkeys(names))[: turns]
    handle = spawn(ScriptedWorker, {"turns": turns, "entities": entities,
                                    "urls": [scenario.page_url(e) for e in entities]},
                   placement="processes", name=f"bytes-{form}-{turns}")
    try:
        policy = Counted(handle, form)
        (record,) = collect(scenario, [task], 1, {"single": policy}, world=world, env_kwargs={"max_turns": turns},
                            env="single")
    finally:
        handle.close()
    kinds = [t.kind for t in record.main.turns]
    assert kinds == ["tool_call"] * (turns - 1) + ["answer"], kinds  # every call was well-formed
    assert all(t.tool_call.ok for t in record.main.turns[:-1]), "a tool call failed"
    return policy.sizes, policy.task_crossed, record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 and 6 turns (CI smoke)")
    args = parser.parse_args()
    from mgrpo_scenarios.wiki_hops import WikiHops

    lengths = (3, 6) if args.quick else (6, 12, 24)
    raw: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        scenario = WikiHops(seed=0, num_entities=300, data_dir=Path(tmp) / "data")
        scenario.build()
        with scenario.open() as world:
            for n in lengths:
                out = {}
                records = {}
                for form in ("before", "now"):
                    sizes, crossed, records[form] = run(scenario, world, n, form)
                    out[form] = {"per_turn": sizes, "mean": statistics.mean(sizes), "first": sizes[0],
                                 "last": sizes[-1], "total": sum(sizes), "task_crossed": crossed}
                same = [t.action for t in records["before"].main.turns] == [t.action for t in records["now"].main.turns]
                assert same, "the two forms drove the worker to different actions"
                raw[str(n)] = out
    rows = []
    print(f"{'turns':>5} | {'before: mean B/turn':>20} | {'last turn':>10} | {'now: mean B/turn':>17} | "
          f"{'last turn':>10} | {'first turn':>10} | task crossed (before/now)")
    for n, m in raw.items():
        b, w = m["before"], m["now"]
        print(f"{n:>5} | {b['mean']:>20.0f} | {b['last']:>10} | {w['mean']:>17.0f} | {w['last']:>10} | "
              f"{w['first']:>10} | {b['task_crossed']}/{w['task_crossed']}")
        rows += [(f"{n} turns: before, bytes per turn (mean)", round(b["mean"]), f"last turn {b['last']}; total {b['total']}"),
                 (f"{n} turns: now, bytes per turn (mean)", round(w["mean"]),
                  f"last turn {w['last']}, first {w['first']}; total {w['total']}"),
                 (f"{n} turns: the task crossed (before / now)", f"{b['task_crossed']} / {w['task_crossed']}", "")]
    first, last = list(raw)[0], list(raw)[-1]
    for form in ("before", "now"):
        ratio = raw[last][form]["mean"] / raw[first][form]["mean"]
        rows.append((f"{form}: mean bytes per turn, {last} turns / {first} turns", round(ratio, 2),
                     "1 = constant in the number of turns"))
        print(f"{form}: mean bytes per turn at {last} turns / at {first} turns = {ratio:.2f}")
    report("request_bytes", rows, {"turns": raw, "setup": "single agent, wiki-hops 300 entities (full profile), "
                                   "scripted search/visit actions from a worker under the processes placement"})


if __name__ == "__main__":
    main()
