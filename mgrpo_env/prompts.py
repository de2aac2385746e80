"""The agents' system prompts: the role (its spec's words, ``mgrpo_env.roles``), the protocol, and the tools
with their JSON schemas."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from .roles import ROLE_TABLE

__all__ = ["FINAL_TAGS", "PROMPT_STYLES", "system_prompt"]

class _FinalTags(Mapping[str, str]):
    """Each role's final-action tag: its ``RoleSpec.final_tag``, read live (a registered role's too)."""

    def __getitem__(self, role: str) -> str:
        return ROLE_TABLE[role].final_tag

    def __iter__(self) -> Iterator[str]:
        return iter(ROLE_TABLE)

    def __len__(self) -> int:
        return len(ROLE_TABLE)


#: The final-action tag of each role: its ``RoleSpec.final_tag`` in the one role table.
FINAL_TAGS: Mapping[str, str] = _FinalTags()

#: System prompt styles: ``full`` (the protocol and the tools' JSON schemas, for real LLMs) and
#: ``compact`` (a few dozen tokens: the role, the tools' signatures and the final tag, for tiny models).
PROMPT_STYLES = ("full", "compact")


def system_prompt(role: str, tools: Mapping[str, Any], style: str = "full") -> str:
    """The role's system prompt: the protocol and the tools with their JSON schemas (deterministic).

    ``style="compact"`` gives a one-line prompt (role, tool signatures, final tag) for small models
    trained from scratch, whose cost grows with every prompt token and who never read the schemas.

    Raises ValueError for an unknown role or style.
    """
    if role not in FINAL_TAGS:
        raise ValueError(f"unknown role {role!r}; expected one of {sorted(FINAL_TAGS)}")
    if style not in PROMPT_STYLES:
        raise ValueError(f"unknown prompt style {style!r}; expected one of {list(PROMPT_STYLES)}")
    if style == "compact":
        final = FINAL_TAGS[role]
        names = ", ".join(spec.name for spec in tools.values()) or "none"
        return f"{ROLE_TABLE[role].compact_intro} Tools: {names}. End: <{final}>."
    tool_lines = [json.dumps(_spec_json(spec), ensure_ascii=False) for spec in tools.values()]
    return "\n".join(
        [
            ROLE_TABLE[role].intro,
            "",
            "Each turn, first think inside <think>...</think>, then write exactly one of:",
            '- a tool call: <tool_call>{"name": "<tool name>", "arguments": {<arguments>}}</tool_call>',
            f"- {ROLE_TABLE[role].final_text}",
            "Tool outputs come back inside <tool_response>...</tool_response>. A malformed turn gets an "
            "error message instead.",
            "",
            "Tools (JSON schemas):",
            *(tool_lines or ["(none)"]),
        ]
    )


def _spec_json(spec: Any) -> dict[str, Any]:
    return {"name": spec.name, "description": spec.description, "parameters": spec.parameters}
