"""Scenario registry: built-ins, ``register()`` at run time, and the ``mgrpo.scenarios`` entry points.

A third-party package adds a scenario by declaring, in its pyproject::

    [project.entry-points."mgrpo.scenarios"]
    my-scenario = "my_package.module:MyScenario"

where ``MyScenario(**kwargs)`` builds an object following :class:`mgrpo_scenarios.Scenario`.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from .base import Scenario

__all__ = ["register", "get", "names", "ENTRY_POINT_GROUP"]

ENTRY_POINT_GROUP = "mgrpo.scenarios"

_factories: dict[str, Callable[..., Scenario]] = {}


def register(name: str, factory: Callable[..., Scenario], *, overwrite: bool = False) -> None:
    """Register ``factory`` under ``name``. A duplicate name raises unless ``overwrite``."""
    if not name or not isinstance(name, str):
        raise ValueError("a scenario name must be a non-empty string")
    if name in _factories and not overwrite and _factories[name] is not factory:
        raise ValueError(f"scenario {name!r} is already registered")
    _factories[name] = factory


def _load_entry_points() -> None:
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in _factories:
            continue
        try:
            _factories[ep.name] = ep.load()
        except Exception as exc:  # a broken plug-in must not hide the others
            _broken[ep.name] = f"{type(exc).__name__}: {exc}"


_broken: dict[str, str] = {}


def names() -> list[str]:
    """Names of every available scenario, sorted."""
    _load_entry_points()
    return sorted(_factories)


def get(name: str, **kwargs: Any) -> Scenario:
    """Build the scenario registered as ``name`` with ``kwargs``.

    Raises:
        KeyError: unknown name; the message lists the valid ones (and any plug-in that failed to load).
    """
    _load_entry_points()
    if name not in _factories:
        hint = f"; plug-ins that failed to load: {_broken}" if _broken else ""
        raise KeyError(f"unknown scenario {name!r}; available: {', '.join(sorted(_factories)) or 'none'}{hint}")
    return _factories[name](**kwargs)
