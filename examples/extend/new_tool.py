"""A new tool, registered from outside the package: ``calculate``, exact arithmetic for the sub-agents.

A tool is what the agent is shown (a ``ToolSpec``: name, one-line description, JSON schema of its
arguments, checked on every call) and an object that runs it (``tool(arguments) -> ToolResult``,
here a ``BaseTool``, which times the call and turns every failure into a failed result). One
``register_tool`` call adds both, with a factory that builds a fresh instance per agent from the
running world, and the roles whose tool set gets it; the env then shows it in those roles' system
prompts, accepts calls to it, runs them and records them like the web tools. A scenario can also name
it in its own ``role_tools``.

This file is the whole change. It runs two episodes of the hierarchy with scripted policies (as
``examples/custom_loop.py`` does): the main agent delegates a sum, the sub-agent calls ``calculate``
and reports what it returned, the main agent answers with the report.

    python examples/extend/new_tool.py
"""

from __future__ import annotations

import ast
import json
import operator
from collections.abc import Mapping
from typing import Any

import mgrpo_env
from mgrpo_env.protocol import ToolSpec, register_tool
from mgrpo_tools.base import BaseTool, ToolError, require_str

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos}


class Calculate(BaseTool):
    name = "calculate"
    description = "Evaluate an arithmetic expression (numbers, + - * / ** and parentheses) exactly."
    parameters = {"type": "object", "properties": {"expression": {"type": "string", "minLength": 1}},
                  "required": ["expression"], "additionalProperties": False}

    def run(self, arguments: Mapping[str, Any]) -> str:
        expression = require_str(arguments, "expression", max_len=200)
        try:
            return str(self._eval(ast.parse(expression, mode="eval").body))
        except (SyntaxError, ZeroDivisionError, OverflowError) as exc:
            raise ToolError("arguments", f"cannot evaluate {expression!r}: {exc}") from None

    def _eval(self, node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            if isinstance(node.op, ast.Pow) and abs(self._eval(node.right)) > 64:
                raise ToolError("arguments", "exponent too large")
            return _OPS[type(node.op)](self._eval(node.left), self._eval(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](self._eval(node.operand))
        raise ToolError("arguments", f"only numbers and + - * / ** are allowed, got {type(node).__name__}")


register_tool(ToolSpec(Calculate.name, Calculate.description, Calculate.parameters),
              factory=lambda world: Calculate(), roles=("sub",))


def tool_call(name: str, **arguments: object) -> str:
    return f"<think>call {name}</think><tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def main_policy(observation: str, messages: list[dict[str, str]], expression: str) -> str:
    if len(messages) <= 2:  # nothing done yet: delegate the sum
        return tool_call("delegate", task=f"Compute {expression}")
    report = observation.removeprefix("<tool_response>").removesuffix("</tool_response>").strip()
    return f"<think>the sub-agent computed it</think><answer>{report}</answer>"


def sub_policy(observation: str, messages: list[dict[str, str]]) -> str:
    if sum(m["role"] == "assistant" for m in messages) == 0:
        return tool_call("calculate", expression=messages[1]["content"].removeprefix("Subtask: Compute "))
    value = observation.removeprefix("<tool_response>").removesuffix("</tool_response>").strip()
    return f"<think>report</think><result>{value}</result>"


def main() -> None:
    env = mgrpo_env.env(scenario="wiki-hops", split="stage1/test", scenario_kwargs={"num_entities": 300})
    for episode, expression in enumerate(["(17 + 25) * 3", "2 ** 10 - 24 / 8"]):
        env.reset(seed=episode)
        for agent in env.agent_iter():
            observation, reward, termination, truncation, info = env.last()
            if termination or truncation:
                env.step(None)
                continue
            if agent.startswith("sub") and len(info["messages"]) == 2:
                print(f"{agent}'s system prompt shows the tool:", Calculate.description in info["messages"][0]["content"])
            text = observation["text"]
            action = (main_policy(text, info["messages"], expression) if agent.startswith("main")
                      else sub_policy(text, info["messages"]))
            env.step(action)
        record = env.unwrapped.record
        call = record.subs[0].turns[0].tool_call
        print(f"episode {episode}: {call.tool}({call.arguments}) ok={call.ok} -> the sub-agent reported "
              f"{record.subs[0].final!r}; the main agent answered {record.final_answer!r}")
    env.close()


if __name__ == "__main__":
    main()
