"""Checking a configuration value: against its dataclass field's type, and a name against its registry.

YAML and ``--set`` give ints, floats, bools, strings, lists and mappings; :func:`coerce` accepts a
value of the field's type, converts it where that loses nothing, and otherwise raises ``ValueError``
naming the field and the type it expects.

A field that holds a name of something registered (a mode, an estimator, a loss, a placement, a store
spec) is declared with :func:`named`; :func:`check_names` checks every such field with its dotted
path when the config loads (``config.load_config``) and when a section is built by hand (its
``__post_init__``), so ``--set main_estimator=nope`` fails at once, naming the field and the valid
names. The registry is given as a ``"module:attr"`` string, resolved then: the registries of the
placements and the store backends live in ``mgrpo_algo.distributed``, above this layer.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from dataclasses import field, fields
from pkgutil import resolve_name
from typing import Any

from mgrpo_tools.registry import Registry

__all__ = ["check", "check_names", "check_own_names", "coerce", "named"]


def check(ok: bool, name: str, message: str) -> None:
    """ValueError ``config field 'name' message`` unless ``ok``."""
    if not ok:
        raise ValueError(f"config field '{name}' {message}")


def named(default: str, registry: str) -> Any:
    """A dataclass field holding a name in ``registry``, a ``"module:attr"`` string naming a
    :class:`~mgrpo_tools.registry.Registry` or a function ``check(value, field)`` that raises."""
    return field(default=default, metadata={"names": registry})


def check_names(cls: type, values: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``values`` (a section's fields by name) with every :func:`named` field checked against its
    registry and replaced by its canonical name (a deprecated alias by the current one); an unknown
    name raises ValueError naming ``where + field`` and the valid names."""
    out = dict(values)
    for f in fields(cls):
        ref = f.metadata.get("names")
        if ref is None or f.name not in values:
            continue
        target = resolve_name(ref)
        if isinstance(target, Registry):
            value = values[f.name]
            if not isinstance(value, str):
                raise ValueError(f"config field '{where}{f.name}' must be a name (str), got {value!r}")
            out[f.name] = target.check(value, where + f.name)
        else:
            target(values[f.name], where + f.name)
    return out


def check_own_names(obj: Any, where: str) -> None:
    """:func:`check_names` on a built dataclass, in place (for ``__post_init__``)."""
    values = {f.name: getattr(obj, f.name) for f in fields(obj) if "names" in f.metadata}
    for name, value in check_names(type(obj), values, where).items():
        if value != values[name]:
            object.__setattr__(obj, name, value)


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
