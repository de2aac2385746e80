"""Argument checks of the agent protocol: a tiny JSON-schema checker for the subset our tools use.

``type`` as one name or a list of names, ``properties``, ``required``, ``additionalProperties: false``,
``items``, ``minItems``/``maxItems``, ``minLength``/``maxLength``, ``minimum``/``maximum``, ``enum``.
Stricter than the tools themselves on purpose: the schema shown in the system prompt is the format
the agent is rewarded for. :func:`signature` writes a tool's call shape for error messages.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["check_arguments", "signature"]

_JSON_TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")


def _is_type(value: Any, name: str) -> bool:
    # bool is an int subclass in Python but not a JSON integer; floats like 2.0 are refused as
    # integers so that a tool never receives a float where its schema promised an int.
    if name == "object":
        return isinstance(value, dict)
    if name == "array":
        return isinstance(value, list)
    if name == "string":
        return isinstance(value, str)
    if name == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if name == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if name == "boolean":
        return isinstance(value, bool)
    return name == "null" and value is None


def _describe(schema: Mapping[str, Any]) -> str:
    """A short human type: ``string``, ``integer or string``, ``array of 1-3 strings``."""
    types = schema.get("type", "any")
    if isinstance(types, list):
        return " or ".join(str(t) for t in types)
    if types == "array":
        item = _describe(schema.get("items", {}))
        lo, hi = schema.get("minItems"), schema.get("maxItems")
        count = f"{lo}-{hi} " if lo is not None and hi is not None else f"at least {lo} " if lo else ""
        count = f"at most {hi} " if lo is None and hi is not None else count
        return f"array of {count}{item}s"
    return str(types)


def check_arguments(value: Any, schema: Mapping[str, Any], where: str = "") -> str | None:
    """Check ``value`` against the small JSON-schema subset our tools use.

    ``where`` is the location for messages ("" for the arguments object itself, then
    ``queries``, ``queries[0]``, ...). ``minLength`` counts characters after stripping whitespace,
    so that ``"  "`` is empty. Returns None when valid, else one readable message about the first
    problem found.

    >>> from mgrpo_tools.schemas import CLICK, SEARCH
    >>> check_arguments({"queries": ["a", "b", "c", "d"]}, SEARCH.parameters)
    "'queries' must hold at most 3 items, got 4"
    >>> check_arguments({"link": 3}, CLICK.parameters) is None
    True
    """
    label = f"'{where}'" if where else "the arguments"
    types = schema.get("type")
    if types is not None:
        allowed = types if isinstance(types, list) else [types]
        if not any(_is_type(value, t) for t in allowed):
            return f"{label} must be {_describe(schema)}, got {_json_type(value)}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{label} must be one of {json.dumps(schema['enum'])}"
    if isinstance(value, str):
        if len(value.strip()) < schema.get("minLength", 0):
            return f"{label} must not be empty" if schema["minLength"] == 1 else f"{label} is too short"
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            return f"{label} is too long ({len(value)} > {schema['maxLength']} characters)"
    if _is_type(value, "number"):
        if "minimum" in schema and value < schema["minimum"]:
            return f"{label} must be >= {schema['minimum']}, got {value}"
        if "maximum" in schema and value > schema["maximum"]:
            return f"{label} must be <= {schema['maximum']}, got {value}"
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            return f"{label} must hold at least {schema['minItems']} items, got {len(value)}"
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            return f"{label} must hold at most {schema['maxItems']} items, got {len(value)}"
        for i, item in enumerate(value):
            problem = check_arguments(item, schema.get("items", {}), f"{where}[{i}]")
            if problem:
                return problem
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for key in schema.get("required", []):
            if key not in value:
                return f"missing required argument '{key}'"
        if schema.get("additionalProperties", True) is False:
            extra = sorted(str(k) for k in value if k not in props)
            if extra:
                return f"unexpected argument '{extra[0]}' (allowed: {', '.join(props) or 'none'})"
        for key, sub in props.items():
            if key in value:
                problem = check_arguments(value[key], sub, f"{where}.{key}" if where else key)
                if problem:
                    return problem
    return None


def _json_type(value: Any) -> str:
    return next((t for t in _JSON_TYPES if _is_type(value, t)), type(value).__name__)


def signature(spec: Any) -> str:
    """A one-line call signature for messages: ``search(queries: array of 1-3 strings, sites?: ...)``."""
    params = getattr(spec, "parameters", None) or {}
    required = set(params.get("required", []))
    args = [
        f"{key}{'' if key in required else '?'}: {_describe(sub)}"
        for key, sub in params.get("properties", {}).items()
    ]
    return f"{spec.name}({', '.join(args)})"
