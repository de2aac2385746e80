"""Checking a configuration value against its dataclass field's type (used by ``config.load_config``).

YAML and ``--set`` give ints, floats, bools, strings, lists and mappings; :func:`coerce` accepts a
value of the field's type, converts it where that loses nothing, and otherwise raises ``ValueError``
naming the field and the type it expects.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from typing import Any

__all__ = ["coerce"]


def _type_name(hint: Any) -> str:
    """``int``, ``float or None``, ``list[str]``: a field's type as the error message names it."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join("None" if a is type(None) else _type_name(a) for a in typing.get_args(hint))
    return getattr(hint, "__name__", None) if isinstance(hint, type) else str(hint).replace("typing.", "")


def coerce(hint: Any, value: Any, name: str) -> Any:
    """``value`` (from YAML or ``--set``) checked against the field's type ``hint`` and converted where
    that is lossless: an int or a numeric string (YAML reads ``1e-4`` as a string) for a float field,
    a list for a tuple field. Anything else raises ValueError naming the field and the expected type,
    so ``--set group_size=abc`` fails here rather than as a comparison deep in ``__post_init__``."""

    def bad() -> ValueError:
        return ValueError(f"config field '{name}' must be {_type_name(hint)}, got {value!r} ({type(value).__name__})")

    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for arg in (a for a in args if a is not type(None)):
            try:
                return coerce(arg, value, name)
            except ValueError:
                continue
        raise bad()
    if hint in (bool, str):
        if not isinstance(value, hint):
            raise bad()
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad()
        return value
    if hint is float:
        if isinstance(value, bool):
            raise bad()
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                raise bad() from None
        raise bad()
    if origin is tuple:
        if isinstance(value, str):  # e.g. lora_targets: one name; the dataclass makes it a 1-tuple
            return value
        if not isinstance(value, (list, tuple)):
            raise bad()
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(coerce(args[0], v, f"{name}[{i}]") for i, v in enumerate(value))
        if args and len(args) != len(value):
            raise ValueError(f"config field '{name}' needs {len(args)} values, got {len(value)}: {value!r}")
        return tuple(coerce(a, v, f"{name}[{i}]") for i, (a, v) in enumerate(zip(args or [Any] * len(value), value, strict=True)))
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise bad()
        return [coerce(args[0], v, f"{name}[{i}]") for i, v in enumerate(value)] if args else list(value)
    if origin is dict or hint is dict:
        if not isinstance(value, Mapping):
            raise bad()
        return dict(value)
    return value
