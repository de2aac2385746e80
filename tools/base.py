"""The tool interface every agent tool implements.

A tool is called with the protocol's ``arguments`` dict (parsed from the agent's
``<tool_call>`` JSON) and always returns a :class:`ToolResult`: the text the agent
reads next, an ``ok`` flag, a clear error message when not ok, and the latency.
Bad arguments and failing backends are results, never exceptions.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = ["ToolResult", "Tool", "BaseTool", "ToolError", "require_str", "optional_int", "require_str_list"]


@dataclass(frozen=True)
class ToolResult:
    """What a tool call produced.

    Attributes:
        text: what the agent reads (on failure, the error message rendered for the agent).
        ok: False when the call failed (bad arguments, refused URL, timeout, backend down, ...).
        error: a short machine-readable category plus message when not ok, e.g. ``"policy: ..."``.
        latency_s: wall time of the call in seconds.
        meta: details for episode records and tests (final URL, HTTP status, cache hit, page number, ...).
    """

    text: str
    ok: bool = True
    error: str | None = None
    latency_s: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)


class ToolError(Exception):
    """Raised inside a tool's implementation; :class:`BaseTool` turns it into a failed ToolResult.

    ``kind`` is a short category ("arguments", "policy", "timeout", "http", "content", "backend",
    "cache") that ends up as the prefix of ``ToolResult.error``.
    """

    def __init__(self, kind: str, message: str, **meta: Any) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message
        self.meta = meta


@runtime_checkable
class Tool(Protocol):
    """A callable tool: ``tool(arguments) -> ToolResult``.

    ``name`` is what the agent writes in ``<tool_call>``; ``description`` and ``parameters``
    (a JSON schema) are shown to the agent in its system prompt.
    """

    name: str
    description: str
    parameters: dict[str, Any]

    def __call__(self, arguments: Mapping[str, Any]) -> ToolResult: ...


class BaseTool(ABC):
    """Times the call and turns every exception into a failed :class:`ToolResult`.

    Subclasses implement :meth:`run`, which returns the text (or a full ToolResult) and raises
    :class:`ToolError` for expected failures. An unexpected exception is still caught (a tool must
    never crash an episode) and reported as ``"internal: ..."``.
    """

    name: str = ""
    description: str = ""
    parameters: dict[str, Any] = {}

    def __call__(self, arguments: Mapping[str, Any]) -> ToolResult:
        start = time.perf_counter()
        try:
            if not isinstance(arguments, Mapping):
                raise ToolError("arguments", f"{self.name} expects a JSON object of arguments, got {type(arguments).__name__}")
            out = self.run(arguments)
        except ToolError as exc:
            return ToolResult(
                text=f"Error ({self.name}): {exc.kind}: {exc.message}",
                ok=False,
                error=f"{exc.kind}: {exc.message}",
                latency_s=time.perf_counter() - start,
                meta=dict(exc.meta),
            )
        except Exception as exc:  # noqa: BLE001 - a tool never raises into the episode
            return ToolResult(
                text=f"Error ({self.name}): internal: {type(exc).__name__}: {exc}",
                ok=False,
                error=f"internal: {type(exc).__name__}: {exc}",
                latency_s=time.perf_counter() - start,
            )
        latency = time.perf_counter() - start
        if isinstance(out, ToolResult):
            return ToolResult(out.text, out.ok, out.error, latency, out.meta)
        return ToolResult(text=str(out), ok=True, latency_s=latency)

    @abstractmethod
    def run(self, arguments: Mapping[str, Any]) -> str | ToolResult:
        """Do the work; return the agent's text or a ToolResult, raise ToolError on failure."""


def require_str(arguments: Mapping[str, Any], key: str, *, max_len: int = 2000, allow_empty: bool = False) -> str:
    """Return ``arguments[key]`` as a stripped string or raise an "arguments" ToolError."""
    if key not in arguments:
        raise ToolError("arguments", f"missing required argument '{key}'")
    value = arguments[key]
    if not isinstance(value, str):
        raise ToolError("arguments", f"'{key}' must be a string, got {type(value).__name__}")
    value = value.strip()
    if not value and not allow_empty:
        raise ToolError("arguments", f"'{key}' must not be empty")
    if len(value) > max_len:
        raise ToolError("arguments", f"'{key}' is too long ({len(value)} > {max_len} characters)")
    return value


def optional_int(arguments: Mapping[str, Any], key: str, default: int, *, low: int, high: int) -> int:
    """Return an int argument in [low, high], accepting numeric strings; raise on anything else."""
    value = arguments.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool):
        raise ToolError("arguments", f"'{key}' must be an integer")
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value.strip())
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int):
        raise ToolError("arguments", f"'{key}' must be an integer, got {type(value).__name__}")
    if not low <= value <= high:
        raise ToolError("arguments", f"'{key}' must be between {low} and {high}, got {value}")
    return value


def require_str_list(
    arguments: Mapping[str, Any], key: str, *, min_items: int, max_items: int, max_len: int = 500, required: bool = True
) -> list[str] | None:
    """Return a list of non-empty strings (a single string is accepted as a list of one)."""
    if key not in arguments or arguments[key] is None:
        if required:
            raise ToolError("arguments", f"missing required argument '{key}'")
        return None
    value = arguments[key]
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ToolError("arguments", f"'{key}' must be a list of strings")
    items = [v.strip() for v in value if v.strip()]
    if not min_items <= len(items) <= max_items:
        raise ToolError("arguments", f"'{key}' must hold {min_items} to {max_items} non-empty strings, got {len(items)}")
    for v in items:
        if len(v) > max_len:
            raise ToolError("arguments", f"an item of '{key}' is too long ({len(v)} > {max_len} characters)")
    return items
