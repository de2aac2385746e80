"""One small name -> entry table, the registry behind every "chosen by name" setting of the project.

Advantage estimators, policy losses, aggregations, alignment strategies, store backends, placements
and modes are each a :class:`Registry`. It lives here, in the lowest package (mgrpo_tools imports
nothing of ours), so that the env, the scenarios and the algorithm share one implementation:

- a duplicate name raises ``ValueError`` (a second registration never silently replaces the first);
- an unknown name raises :class:`UnknownName` (a ``KeyError`` and a ``ValueError``) listing the valid
  names, and :meth:`Registry.check` says the same with the config field's dotted path in front, so a
  config fails when it loads, not at first use;
- an entry may be a ``"module:attr"`` string, imported on first :meth:`Registry.get`: a lower module
  can name an implementation that lives above it (the Redis store, the Ray placement) without
  importing it, which keeps the import graph acyclic;
- ``aliases`` map an old name to its current one, with a FutureWarning when used (shown by default:
  the person who wrote the config reads it, not only a developer).

>>> losses = Registry("policy loss")
>>> @losses.register("half")
... def half(x):
...     return x / 2
>>> losses.get("half")(4)
2.0
>>> losses.get("nope")
Traceback (most recent call last):
...
mgrpo_tools.registry.UnknownName: unknown policy loss 'nope'; valid: half
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from pkgutil import resolve_name
from typing import Any, Generic, TypeVar, overload

__all__ = ["Registry", "UnknownName"]

T = TypeVar("T")


class UnknownName(KeyError, ValueError):
    """A name no entry is registered under. A KeyError (a failed lookup) and a ValueError (a bad
    setting), so both the callers that look up and those that validate catch it."""

    def __str__(self) -> str:  # KeyError's own str() would quote the whole message
        return str(self.args[0]) if self.args else ""


class Registry(Generic[T]):
    """Entries of one kind by name (``kind`` names them in errors: "advantage estimator")."""

    def __init__(self, kind: str, entries: dict[str, T | str] | None = None, *,
                 aliases: dict[str, str] | None = None) -> None:
        self.kind = kind
        self._entries: dict[str, T | str] = {}
        self._aliases: dict[str, str] = dict(aliases or {})
        for name, entry in (entries or {}).items():
            self.add(name, entry)

    # -- registering ------------------------------------------------------------------------------

    def add(self, name: str, entry: T | str) -> T | str:
        """Register ``entry`` (an object, or a ``"module:attr"`` string) under ``name``."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.kind} needs a non-empty name, got {name!r}")
        if name in self._entries or name in self._aliases:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = entry
        return entry

    @overload
    def register(self, name: str) -> Callable[[T], T]: ...
    @overload
    def register(self, name: str, entry: T) -> T: ...

    def register(self, name: str, entry: Any = None) -> Any:
        """``register(name, entry)``, or ``@register(name)`` as a decorator; returns the entry."""
        if entry is not None:
            return self.add(name, entry)

        def decorator(obj: T) -> T:
            self.add(name, obj)
            return obj

        return decorator

    def unregister(self, name: str) -> None:
        """Remove ``name`` (tests and examples that register something temporary)."""
        self._entries.pop(name, None)

    # -- looking up -------------------------------------------------------------------------------

    def canonical(self, name: str, field: str | None = None) -> str:
        """``name`` itself, or the current name of an alias (with a FutureWarning); unknown
        names raise :class:`UnknownName` (with ``field``, the config's dotted path, in front)."""
        if name in self._aliases:
            new = self._aliases[name]
            where = f"config field '{field}': " if field else ""
            warnings.warn(f"{where}{self.kind} {name!r} is deprecated; use {new!r} (the same thing)",
                          FutureWarning, stacklevel=3)
            return new
        if isinstance(name, str) and name in self._entries:
            return name
        where = f"config field '{field}': " if field else ""
        raise UnknownName(f"{where}unknown {self.kind} {name!r}; valid: {', '.join(self.names())}")

    def check(self, name: str, field: str) -> str:
        """Validate a config value: its canonical name, or :class:`UnknownName` naming ``field``."""
        return self.canonical(name, field)

    def get(self, name: str) -> T:
        """The entry under ``name`` (a ``"module:attr"`` string is imported now, once)."""
        name = self.canonical(name)
        entry = self._entries[name]
        if isinstance(entry, str):
            entry = self._entries[name] = resolve_name(entry)
        return entry  # type: ignore[return-value]

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def items(self) -> list[tuple[str, T]]:
        """(name, entry) pairs in registration order (string entries imported)."""
        return [(name, self.get(name)) for name in self.names()]

    def names(self) -> tuple[str, ...]:
        """The registered names in registration order (aliases are not listed)."""
        return tuple(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {list(self.names())})"
