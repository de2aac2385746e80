"""Token ids stored linearly: compact/expand of turn extras, JSONL round trip, old files, sequences."""

from __future__ import annotations

import copy
import json
import random
from dataclasses import asdict

import pytest

from mgrpo_algo.core.sequences import trajectory_sequence
from mgrpo_env.episode import (
    AgentTrajectory,
    EpisodeRecord,
    ToolCall,
    Turn,
    compact_token_extras,
    expand_token_extras,
    read_jsonl,
    write_jsonl,
)


def _nested_extras(turns: int, first: int = 40, completion: int = 12, response: int = 30, seed: int = 0) -> list[dict]:
    """What a token-tracking policy attaches over ``turns`` turns: every prompt = the previous prompt
    + its completion + a tool response (the shape of TransformersPolicy's extras)."""
    rng = random.Random(seed)
    extras, prefix = [], [rng.randrange(1000) for _ in range(first)]
    for t in range(turns):
        sampled = [rng.randrange(1000) for _ in range(completion)]
        extras.append({"prompt_ids": list(prefix), "completion_ids": sampled,
                       "logprobs": [-rng.random() for _ in sampled], "policy": "hf:tiny", "finish_reason": "stop"})
        prefix = prefix + sampled + [rng.randrange(1000) for _ in range(response + t % 3)]
    return extras


def _record() -> EpisodeRecord:
    """An episode with every case: nesting turns, a non-nesting (cut) prompt, a turn with no extra,
    a turn after it, a scripted sub-agent without ids, and a token-tracked sub-agent."""
    main = _nested_extras(4)
    main[2] = {**main[2], "prompt_ids": main[2]["prompt_ids"][5:]}  # does not nest (truncated)
    main[3] = {**main[3], "prompt_ids": main[2]["prompt_ids"] + main[2]["completion_ids"] + [7, 8, 9]}  # nests again
    main_turns = [Turn(f"a{i}", "tool_call", f"o{i}", extra=e) for i, e in enumerate(main)]
    main_turns.insert(4, Turn("bad", "error", "err", error_kind="no_tag"))  # no extra at all
    main_turns.append(Turn("late", "answer", extra=_nested_extras(2, seed=3)[1]))  # after a turn without ids
    scripted = AgentTrajectory("sub_0", "sub", turns=[
        Turn("<tool_call>x</tool_call>", "tool_call", "r", tool_call=ToolCall("search", {"queries": ["a"]}, True, latency_s=0.5)),
        Turn("<result>y</result>", "result", extra={"policy": "oracle"}),
    ], final="y", task="t")
    tracked = AgentTrajectory("sub_1", "sub", turns=[Turn(f"s{i}", "tool_call", extra=e) for i, e in enumerate(_nested_extras(3, seed=1))])
    return EpisodeRecord("ep", {"id": "q"}, seed=1, main=AgentTrajectory("main_0", "main", turns=main_turns),
                         subs=[scripted, tracked], rewards={"main_0": 1.0})


def test_record_round_trips_exactly_through_jsonl(tmp_path):
    record = _record()
    before = copy.deepcopy(record)
    path = tmp_path / "episodes.jsonl"
    write_jsonl(path, [record])
    assert record == before  # writing does not touch the in-memory (full) extras
    (back,) = read_jsonl(path)
    assert back == record
    assert [list(t.extra) for t in back.main.turns] == [list(t.extra) for t in record.main.turns]  # key order too
    stored = json.loads(path.read_text())["main"]["turns"]
    forms = ["full" if "prompt_ids" in t["extra"] else "compact" if "prompt_shared" in t["extra"] else "none"
             for t in stored]
    # first: full; nesting: compact; cut prompt: full; then nesting again; no extra; after it: full
    assert forms == ["full", "compact", "full", "compact", "none", "full"]
    assert stored[1]["extra"]["prompt_shared"] == len(record.main.turns[0].extra["prompt_ids"]) + 12
    tracked = json.loads(path.read_text())["subs"][1]["turns"]
    assert ["prompt_ids" in t["extra"] for t in tracked] == [True, False, False]


def test_old_files_with_full_prompt_ids_still_read(tmp_path):
    record = _record()
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(asdict(record)) + "\n")  # the format before compaction: plain asdict
    assert "prompt_shared" not in path.read_text()
    (back,) = read_jsonl(path)
    assert back == record


def test_compact_then_expand_is_the_identity_and_idempotent():
    extras = _nested_extras(6)
    original = copy.deepcopy(extras)
    compact = compact_token_extras(extras)
    assert extras == original  # inputs untouched
    assert all("prompt_ids" not in e for e in compact[1:]) and "prompt_ids" in compact[0]
    assert [len(e["prompt_new_ids"]) for e in compact[1:]] == [30 + t % 3 for t in range(5)]
    assert expand_token_extras(compact) == extras
    assert compact_token_extras(compact) == compact
    assert expand_token_extras(extras) == extras
    assert compact_token_extras([]) == [] and expand_token_extras([]) == []


def test_a_compact_turn_that_does_not_match_its_predecessor_is_refused(tmp_path):
    compact = compact_token_extras(_nested_extras(3))
    with pytest.raises(ValueError, match="turn 1 shares"):
        expand_token_extras([compact[0], {**compact[1], "prompt_shared": compact[1]["prompt_shared"] - 1}, compact[2]])
    with pytest.raises(ValueError, match="turn 0 shares"):
        expand_token_extras(compact[1:])  # the first turn dropped
    record = _record()
    path = tmp_path / "e.jsonl"
    write_jsonl(path, [record])
    data = json.loads(path.read_text())
    del data["main"]["turns"][0]
    path.write_text(json.dumps(data) + "\n")
    with pytest.raises(ValueError, match=r"e.jsonl:1: not an episode record \(turn 0 shares"):
        list(read_jsonl(path))


def _bytes(turns: int) -> tuple[int, int]:
    """(full, compact) bytes of one agent's extras written as JSON."""
    extras = _nested_extras(turns)
    return len(json.dumps(extras)), len(json.dumps(compact_token_extras(extras)))


def test_compact_form_is_smaller_and_linear_in_turns():
    sizes = {n: _bytes(n) for n in range(2, 13)}
    assert all(compact < full for full, compact in sizes.values())
    compact_steps = [sizes[n + 1][1] - sizes[n][1] for n in range(2, 12)]
    full_steps = [sizes[n + 1][0] - sizes[n][0] for n in range(2, 12)]
    # each added turn costs about the same in the compact form (its new ids, completion, logprobs) ...
    assert max(compact_steps) < 1.3 * min(compact_steps)
    # ... while the full form pays for the whole history again: the step grows with the turn index
    assert full_steps[-1] > 2.5 * full_steps[0] and full_steps == sorted(full_steps)
    assert sizes[12][1] < 0.35 * sizes[12][0]


def test_trajectory_sequence_is_the_same_from_compact_full_and_mixed_extras():
    extras = _nested_extras(6)
    compact = compact_token_extras(extras)
    mixed = [compact[i] if i % 2 else extras[i] for i in range(len(extras))]
    full_seq = trajectory_sequence(extras)
    assert trajectory_sequence(compact) == full_seq
    assert trajectory_sequence(mixed) == full_seq
    ids, mask, logps = full_seq
    assert ids == extras[-1]["prompt_ids"] + extras[-1]["completion_ids"]
    assert sum(mask) == 6 * 12 and len(logps) == len(ids)


def test_trajectory_sequence_refuses_compact_turns_that_do_not_fit():
    compact = compact_token_extras(_nested_extras(3))
    with pytest.raises(ValueError, match="shares"):
        trajectory_sequence(compact[1:])
    with pytest.raises(ValueError, match="shares"):
        trajectory_sequence([compact[0], {**compact[1], "prompt_shared": 3}])
    with pytest.raises(ValueError, match="no completion_ids"):
        trajectory_sequence([compact[0], {k: v for k, v in compact[1].items() if k != "completion_ids"}])


def test_real_policy_episodes_are_stored_compact_and_read_back_equal(tokenizer, small_scenario, small_world, tmp_path):
    """TransformersPolicy through the env: its nesting prompts are written compact, read back equal,
    and the stored (compact) extras give the trainer the same sequence as the in-memory ones."""
    torch = pytest.importorskip("torch")
    from mgrpo_algo.policies.hf_policy import TransformersPolicy
    from mgrpo_algo.policies.models import build_tiny_model
    from mgrpo_env.rollout import collect

    model = build_tiny_model(tokenizer, hidden_size=64, num_layers=2, seed=0)
    policies = {role: TransformersPolicy(model, tokenizer, role=role, max_new_tokens=8, seed=i)
                for i, role in enumerate(("main", "sub"))}
    tasks = list(small_scenario.tasks("stage2/test"))[:1]
    with torch.no_grad():
        records = collect(small_scenario, tasks, 2, policies, world=small_world, env_kwargs={"max_main_turns": 3})
    path = tmp_path / "episodes.jsonl"
    write_jsonl(path, records)
    assert list(read_jsonl(path)) == records
    for record, line in zip(records, path.read_text().splitlines(), strict=True):
        stored = [t["extra"] for t in json.loads(line)["main"]["turns"]]
        assert len(stored) == 3 and "prompt_ids" in stored[0]
        assert all("prompt_shared" in e and "prompt_ids" not in e for e in stored[1:])
        assert trajectory_sequence(stored) == trajectory_sequence([t.extra for t in record.main.turns])
        assert len(line) < len(json.dumps(asdict(record)))
