"""A plain PettingZoo loop over the M-GRPO hierarchy with your own policy per role.

No training library: ``mgrpo_env`` is a PettingZoo AEC env, so any code that can turn an observation
into text can drive it. Here both roles are hand-written scripts:

* the main agent (``main_0``) delegates the whole question to one sub-agent, then answers with the
  first line of the sub-agent's report;
* each sub-agent (``sub_0``, ...) searches the subtask's capitalised words, visits the first hit and
  reports the infobox value whose key best matches the subtask's words.

It is not a good researcher (the scripted oracle in ``mgrpo_env.scripted`` is); it shows the loop,
the protocol (``<think>`` then one ``<tool_call>``, ``<answer>`` or ``<result>``), the rewards and the
episode record. Run: ``python examples/custom_loop.py`` (a 300-entity world is built on first use,
cached under ``~/.cache/mgrpo``).
"""

from __future__ import annotations

import json
import re

import mgrpo_env

URL = re.compile(r"https?://[^\s)\]>\"']+")


def tool_call(name: str, **arguments: object) -> str:
    """One protocol turn that calls a tool."""
    return f"<think>call {name}</think><tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def body(observation: str) -> str:
    """The text inside ``<tool_response>...</tool_response>``."""
    return observation.removeprefix("<tool_response>").removesuffix("</tool_response>").strip()


def main_policy(observation: str, messages: list[dict[str, str]]) -> str:
    """Turn 1: delegate the question. Afterwards: answer with the report (its first line)."""
    if len(messages) <= 2:  # system prompt + question: nothing done yet
        return tool_call("delegate", task=messages[1]["content"])
    report = body(observation).splitlines()[0] if body(observation) else "unknown"
    return f"<think>the sub-agent reported</think><answer>{report[:100]}</answer>"


def sub_policy(observation: str, messages: list[dict[str, str]]) -> str:
    """Search, visit the first hit, report the best-matching infobox value."""
    turns = sum(m["role"] == "assistant" for m in messages)
    if turns == 0:
        subtask = messages[1]["content"].removeprefix("Subtask: ")
        names = re.findall(r"\b[A-Z][a-z]+(?: [A-Z][a-z]+)*", subtask) or [subtask]
        return tool_call("search", queries=[max(names, key=len)])
    urls = URL.findall(observation)
    if turns == 1 and urls:
        return tool_call("visit", url=urls[0], goal="answer the subtask")
    # the infobox rows read "Key | Value": report the value whose key shares most words with the subtask
    words = {w[:4] for w in re.findall(r"[a-z]{4,}", messages[1]["content"].lower())}
    rows = [line.split(" | ", 1) for line in body(observation).splitlines() if " | " in line]
    scored = [(sum(w[:4] in words for w in re.findall(r"[a-z]{4,}", key.lower())), value) for key, value in rows]
    best = max(scored, key=lambda kv: kv[0], default=(0, "nothing found"))[1]
    value = re.sub(r" \[\d+\]", "", best)  # drop link numbers: "Kifush [2]" -> "Kifush"
    return f"<think>report</think><result>{value}</result>"


POLICIES = {"main": main_policy, "sub": sub_policy}

env = mgrpo_env.env(scenario="wiki-hops", split="stage1/test", scenario_kwargs={"num_entities": 300})
for episode in range(3):
    env.reset(seed=episode)
    for agent in env.agent_iter():
        observation, reward, termination, truncation, info = env.last()
        if termination or truncation:
            print(f"  {agent} done, reward {reward:.2f}, components {info.get('reward_components')}")
            env.step(None)
            continue
        role = agent.split("_")[0]  # "main_0" -> main, "sub_3" -> sub
        action = POLICIES[role](observation["text"], info["messages"])
        print(f"  {agent}: {action[:110]}")
        env.step(action)
    record = env.unwrapped.record  # the whole episode: every agent's turns, tool calls and rewards
    print(f"episode {episode}: question {record.task['question']!r}")
    print(f"  gold {record.task['answer']!r}, answered {record.final_answer!r}, correct {record.correct}, "
          f"rewards {record.rewards}, sub-agents {len(record.subs)}, end {record.end_reason}")
    print(f"  record as JSON: {len(json.dumps(record.to_dict()))} characters (mgrpo_env.write_jsonl writes many)")
env.close()
