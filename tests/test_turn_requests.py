"""Requests carry only what is new: the worker rebuilds every agent's whole chat from the turns' new
messages (and its own answers), and neither the task nor its gold answer crosses."""

from __future__ import annotations

import pickle

import pytest

from mgrpo_env.rollout import PolicyRequest, collect
from mgrpo_env.scripted import OraclePolicy
from mgrpo_env.turn_requests import ChatKeeper, TurnRequest, TurnSender


class AcrossTheBoundary:
    """The oracle behind the boundary: each call is compacted (the loop's side), pickled as a process
    placement would, expanded (the worker's side) and checked against the env's own request."""

    def __init__(self, scenario, role: str) -> None:
        self.oracle = OraclePolicy(scenario, role)
        self.sender, self.keeper = TurnSender(), ChatKeeper()
        self.crossed: list[TurnRequest] = []

    def __call__(self, requests: list[PolicyRequest]) -> list[str]:
        blob = pickle.dumps(self.sender.compact(requests))
        assert b"mgrpo_scenarios" not in blob  # no Task object (the gold answer) in what crosses
        turns = pickle.loads(blob)
        self.crossed += turns
        rebuilt = [self.keeper.expand(turn, []) for turn in turns]
        for request, whole in zip(requests, rebuilt, strict=True):
            assert whole.messages == request.messages and whole.task is None
            assert (whole.episode, whole.agent, whole.role) == (request.episode, request.agent, request.role)
        texts = self.oracle(requests)  # the scripted oracle reads the task: it acts on the env's request
        self.keeper.answered(rebuilt, texts)
        self.sender.answered(requests)
        return texts

    def release(self, episode: int, agent: str) -> None:
        self.sender.release(episode, agent)
        self.keeper.release(episode, agent)


def test_the_worker_rebuilds_every_chat_from_the_new_messages(small_scenario, small_world):
    tasks = list(small_scenario.tasks("stage2/test"))[:3]
    policies = {role: AcrossTheBoundary(small_scenario, role) for role in ("main", "sub")}
    records = collect(small_scenario, tasks, 2, policies, world=small_world, seed=0)
    assert sum(r.correct for r in records) >= 4  # the oracle still solves them: the actions are its own
    assert any(len(r.subs) >= 2 for r in records)  # the main agent came back after sub-agents reported
    for policy in policies.values():
        first = [t for t in policy.crossed if t.start == 0]
        later = [t for t in policy.crossed if t.start > 0]
        assert first and later
        assert all([m["role"] for m in t.new_messages] == ["system", "user"] for t in first)
        assert all([m["role"] for m in t.new_messages] == ["user"] for t in later)  # the tool response only
        # every agent was released at its episode's end: nothing is kept on either side
        assert policy.sender.sent == {} and policy.keeper.chats == {}


def test_a_lost_or_repeated_turn_is_refused():
    keeper = ChatKeeper()
    first = TurnRequest(0, "main_0", "main", 0, [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}])
    assert keeper.expand(first, []).messages == first.new_messages
    with pytest.raises(ValueError, match="start at 0, the worker holds 2"):
        keeper.expand(first, [])  # the same turn again
    keeper.answered([PolicyRequest(0, "main_0", "main", "", [], None)], ["<answer>x</answer>"])
    skipped = TurnRequest(0, "main_0", "main", 5, [{"role": "user", "content": "r"}])
    with pytest.raises(ValueError, match="start at 5, the worker holds 3"):
        keeper.expand(skipped, [])


def test_the_rebuilt_request_by_value_and_releases_of_unknown_agents():
    """What mutation testing found loose (issue 53): the observation the policy reads is the chat's last
    message, the history is the worker's own list, answers and requests pair one to one, and releasing
    an agent either side never held is no error (a collection releases every agent it started)."""
    keeper, sender = ChatKeeper(), TurnSender()
    history = [{"completion_ids": [1, 2]}]
    turn = TurnRequest(3, "sub_1", "sub", 0, [{"role": "system", "content": "s"}, {"role": "user", "content": "find X"}])
    request = keeper.expand(turn, history)
    assert request == PolicyRequest(3, "sub_1", "sub", "find X", [*turn.new_messages], None, history)
    assert request.history is history and request.observation == "find X"
    keeper.answered([request], ["<think>t</think><result>X</result>"])
    reply = keeper.expand(TurnRequest(3, "sub_1", "sub", 3, [{"role": "user", "content": "tool said Y"}]), [])
    assert reply.observation == "tool said Y" and [m["content"] for m in reply.messages] == [
        "s", "find X", "<think>t</think><result>X</result>", "tool said Y"]
    empty = keeper.expand(TurnRequest(4, "main_0", "main", 0, []), [])  # nothing yet: an empty observation
    assert (empty.observation, empty.messages) == ("", [])
    with pytest.raises(ValueError, match="zip"):  # one answer for two requests: refused, not half applied
        keeper.answered([reply, reply], ["only one"])
    for side in (keeper, sender):
        side.release(99, "main_0")  # never held: nothing to drop, no error
    sender.answered([reply])
    assert sender.sent == {(3, "sub_1"): 5}
    sender.release(3, "sub_1")
    keeper.release(3, "sub_1")
    assert sender.sent == {} and set(keeper.chats) == {(4, "main_0")}
