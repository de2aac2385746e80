"""What each web tool declares to the agent: its name, one-line description and argument schema.

One copy, light to import (no web stack): the tool classes (``SearchTool``, ``VisitTool``,
``ClickTool``) take their ``name`` / ``description`` / ``parameters`` from here, and the env builds
its system prompts and argument checks from the same objects.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

__all__ = ["ToolSchema", "SEARCH", "VISIT", "CLICK", "WEB_TOOLS"]


class ToolSchema:
    """A tool as the agent sees it: ``name``, ``description`` and a JSON schema ``parameters``."""

    def __init__(self, name: str, description: str, properties: dict[str, Any], required: list[str]) -> None:
        self.name, self.description = name, description
        self.parameters: dict[str, Any] = {"type": "object", "properties": properties, "required": required,
                                           "additionalProperties": False}


SEARCH = ToolSchema(
    "search",
    "Web search: run 1 to 3 queries and get titles, URLs and snippets.",
    {
        "queries": {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1, "maxItems": 3},
        "sites": {"type": "array", "items": {"type": "string", "minLength": 1}, "description": "restrict to these domains"},
    },
    ["queries"],
)
VISIT = ToolSchema(
    "visit",
    "Open a URL and read the page as text with numbered links, keeping the goal in mind.",
    {
        "url": {"type": "string", "minLength": 1},
        "goal": {"type": "string", "minLength": 1, "description": "what to look for on the page"},
        "page": {"type": "integer", "minimum": 1, "description": "page of a long document (default 1)"},
    },
    ["url", "goal"],
)
CLICK = ToolSchema(
    "click",
    "Follow a link of the page last visited, by its number or by its text.",
    {"link": {"type": ["integer", "string"], "description": "the link's number, or its text"}},
    ["link"],
)

#: The web tools by name.
WEB_TOOLS = MappingProxyType({t.name: t for t in (SEARCH, VISIT, CLICK)})
