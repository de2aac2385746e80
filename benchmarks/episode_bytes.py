"""Bytes of ``episodes.jsonl`` for one episode: token ids stored full (before) and compact (after).

    .venv/bin/python benchmarks/episode_bytes.py [--quick]

One single-agent episode of N turns (6 and 12; --quick: 3 and 6) runs in the real env
(``collect(..., env="single")`` -> :class:`~mgrpo_env.single.SingleAgentEnv`) on the 300-entity wiki-hops world,
full profile (the observations real LLMs see: 4,000-character visit pages, 5 search hits), with real
tool calls: it searches an entity, visits its page, searches the next one, ..., and answers at turn N.
The action texts are scripted (a random tiny model writes no tool calls, so its episodes would be
format errors, not tool responses), but each turn's ``extra`` is what
:class:`~mgrpo_algo.policies.hf_policy.TransformersPolicy` attaches had it sampled that text:

* ``prompt_ids`` from the policy's own :class:`~mgrpo_algo.policies.chat_tokens.ChatPrompter` (first turn: the
  chat template; later turns: the previous prompt + completion + the template's continuation with
  the tool response), with a byte-level BPE trained on the world (vocabulary 2,048, ChatML template);
* ``completion_ids``: the action's ids (ending with its stop tag, where ``cut_at_stop`` ends them);
* ``logprobs``: each sampled id's log-probability under a random tiny Qwen2 (hidden 64, 2 layers),
  teacher forced over the whole sequence, temperature 1 (so realistic floats, ~19 characters each);
* ``policy``, ``finish_reason`` as the policy writes them.

The record is written as before (``dataclasses.asdict``: every turn's whole prompt, what ``to_dict``
returned until now) and as now (``write_jsonl``: compact), and read back (it must equal the record).
Writes benchmarks/results/episode_bytes.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import report  # noqa: E402

from mgrpo_algo.core.sequences import trajectory_sequence  # noqa: E402
from mgrpo_algo.policies.chat_tokens import ChatPrompter  # noqa: E402
from mgrpo_algo.policies.hf_policy import _cache_kwarg
from mgrpo_env.episode import EpisodeRecord, read_jsonl, write_jsonl  # noqa: E402
from mgrpo_env.rollout import PolicyRequest, PolicyResponse, collect  # noqa: E402


class ScriptedTokenPolicy:
    """Scripted actions with TransformersPolicy's token extras (ids from its prompter; logprobs filled
    in afterwards by :func:`fill_logprobs`, one teacher-forced pass per episode)."""

    def __init__(self, scenario, tokenizer, turns: int) -> None:
        self.scenario = scenario
        self.prompter = ChatPrompter(tokenizer, max_prompt_tokens=1 << 20)
        self.turns = turns

    def _action(self, request: PolicyRequest) -> str:
        turn = len(request.history)
        if turn == self.turns - 1:
            return "<think>enough read</think><answer>unknown</answer>"
        # the task's hop entities first, then other tasks' (a long episode reads many pages)
        names = [h.entity for t in [request.task, *self.scenario.tasks("stage2/test")] for h in t.hops]
        name = list(dict.fromkeys(names))[turn // 2]
        if turn % 2 == 0:
            call = {"name": "search", "arguments": {"queries": [name]}}
        else:
            call = {"name": "visit", "arguments": {"url": self.scenario.page_url(name), "goal": f"facts about {name}"}}
        return f"<think>{call['name']} {name}</think><tool_call>{json.dumps(call)}</tool_call>"

    def __call__(self, requests):
        out = []
        for request in requests:
            text = self._action(request)
            prompt, info = self.prompter.prompt(request)
            completion = self.prompter.encode(text)
            out.append(PolicyResponse(text, {"prompt_ids": prompt, "completion_ids": completion, "logprobs": [],
                                              "policy": "hf:tiny-qwen2", "finish_reason": "stop", **info}))
        return out


@torch.no_grad()
def fill_logprobs(model, record: EpisodeRecord, chunk: int = 512) -> None:
    """Each turn's ``logprobs``: log p(sampled id) under ``model`` at T=1, from one causal pass over
    the agent's whole sequence (prompts nest, so it holds every turn at its position), fed in chunks
    with the KV cache (bounded attention memory on long episodes)."""
    from transformers import DynamicCache

    turns = record.main.turns
    ids, _, _ = trajectory_sequence([dict(t.extra, logprobs=None) for t in turns])
    cache, logps = DynamicCache(), [0.0]
    for start in range(0, len(ids), chunk):
        part = torch.tensor([ids[start: start + chunk]])
        logits = model(input_ids=part, use_cache=True, **{_cache_kwarg(): cache}).logits[0].float()
        nxt = torch.tensor(ids[start + 1: start + chunk + 1])
        logps += torch.log_softmax(logits[: len(nxt)], -1).gather(1, nxt[:, None])[:, 0].tolist()
    for t in turns:
        prompt, completion = t.extra["prompt_ids"], t.extra["completion_ids"]
        t.extra["logprobs"] = logps[len(prompt): len(prompt) + len(completion)]


def episode(scenario, world, tokenizer, model, turns: int) -> EpisodeRecord:
    task = list(scenario.tasks("stage2/test"))[0]
    policy = ScriptedTokenPolicy(scenario, tokenizer, turns)
    (record,) = collect(scenario, [task], 1, {"single": policy}, world=world, env_kwargs={"max_turns": turns}, env="single")
    kinds = [t.kind for t in record.main.turns]
    assert kinds == ["tool_call"] * (turns - 1) + ["answer"], kinds  # every call was well-formed
    assert all(t.tool_call.ok for t in record.main.turns[:-1]), "a tool call failed"
    fill_logprobs(model, record)
    return record


def measure(record: EpisodeRecord, folder: Path) -> dict[str, int]:
    """Bytes of the record's line in the old (full) and new (compact) form; checks the round trip."""
    old, new = folder / "full.jsonl", folder / "compact.jsonl"
    old.write_text(json.dumps(asdict(record), ensure_ascii=False) + "\n", encoding="utf-8")
    write_jsonl(new, [record])
    assert list(read_jsonl(new)) == [record] and list(read_jsonl(old)) == [record]
    extras = [t.extra for t in record.main.turns]
    stored = json.loads(new.read_text(encoding="utf-8"))["main"]["turns"]
    return {"full": old.stat().st_size, "compact": new.stat().st_size,
            # the token extras alone (the rest of the line - messages, observations - is the same)
            "extras_full": len(json.dumps(extras)), "extras_compact": len(json.dumps([t["extra"] for t in stored])),
            "tokens": len(extras[-1]["prompt_ids"]) + len(extras[-1]["completion_ids"]),
            "stored_prompt_ids_full": sum(len(e["prompt_ids"]) for e in extras)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 and 6 turns (CI smoke)")
    args = parser.parse_args()
    from mgrpo_algo.policies.models import build_tiny_model, corpus_texts, train_tokenizer
    from mgrpo_scenarios.wiki_hops import WikiHops

    torch.set_num_threads(1)
    lengths = (3, 6) if args.quick else (6, 12)
    rows, raw = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        scenario = WikiHops(seed=0, num_entities=300, data_dir=Path(tmp) / "data")
        scenario.build()
        tokenizer = train_tokenizer(corpus_texts(scenario, max_pages=120, max_tasks=100), vocab_size=2048)
        model = build_tiny_model(tokenizer, hidden_size=64, num_layers=2, max_position_embeddings=1 << 16, seed=0)
        with scenario.open() as world:
            for n in lengths:
                raw[n] = measure(episode(scenario, world, tokenizer, model, n), Path(tmp))
    for n, m in raw.items():
        rows += [(f"{n} turns: full (before)", m["full"], "bytes of the episode's line"),
                 (f"{n} turns: compact (after)", m["compact"], f"bytes; {m['full'] / m['compact']:.1f}x smaller"),
                 (f"{n} turns: token extras full", m["extras_full"], "bytes of the turns' extras alone"),
                 (f"{n} turns: token extras compact", m["extras_compact"], "bytes"),
                 (f"{n} turns: sequence tokens", m["tokens"], f"last prompt + completion; full stores {m['stored_prompt_ids_full']} prompt ids")]
    a, b = lengths
    for form in ("full", "compact", "extras_full", "extras_compact"):
        rows.append((f"{form}: bytes {b} turns / {a} turns", raw[b][form] / raw[a][form], "2 = linear in turns"))
    report("episode_bytes", rows, {"turns": {str(n): m for n, m in raw.items()},
                                   "setup": "single agent, wiki-hops 300 entities (full profile), BPE vocab 2048, "
                                            "scripted search/visit actions with TransformersPolicy's token extras"})


if __name__ == "__main__":
    main()
