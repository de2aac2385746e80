"""The scenarios, on the project's one :class:`~mgrpo_tools.registry.Registry`: built-ins and plug-ins
from the ``mgrpo.scenarios`` entry points, and ``register()`` at run time.

A third-party package adds a scenario by declaring, in its pyproject::

    [project.entry-points."mgrpo.scenarios"]
    my-scenario = "my_package.module:MyScenario"

where ``MyScenario(**kwargs)`` builds an object following :class:`mgrpo_scenarios.Scenario`.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from mgrpo_tools.registry import Registry, UnknownName

from .base import AnswersSubtasks, Scenario

__all__ = ["SCENARIOS", "register", "get", "names", "answers_subtasks", "ENTRY_POINT_GROUP"]

ENTRY_POINT_GROUP = "mgrpo.scenarios"

#: Every scenario factory by name (the entry points are added on first look-up).
SCENARIOS: Registry[Callable[..., Scenario]] = Registry("scenario")

#: Plug-ins whose entry point failed to load: name -> the error (a broken plug-in must not hide the others).
_broken: dict[str, str] = {}


def register(name: str, factory: Callable[..., Scenario], *, overwrite: bool = False) -> None:
    """Register ``factory`` under ``name``. A duplicate name raises unless ``overwrite`` (registering
    the same factory twice is allowed)."""
    if name in SCENARIOS and (overwrite or SCENARIOS.get(name) is factory):
        SCENARIOS.unregister(name)
    SCENARIOS.add(name, factory)


def _load_entry_points() -> None:
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in SCENARIOS:
            continue
        try:
            SCENARIOS.add(ep.name, ep.load())
        except Exception as exc:  # a broken plug-in must not hide the others
            _broken[ep.name] = f"{type(exc).__name__}: {exc}"


def names() -> list[str]:
    """Names of every available scenario, sorted."""
    _load_entry_points()
    return sorted(SCENARIOS.names())


def get(name: str, **kwargs: Any) -> Scenario:
    """Build the scenario registered as ``name`` with ``kwargs``.

    Raises:
        UnknownName (a KeyError): unknown name; the message lists the valid ones (and any plug-in that
            failed to load).
    """
    _load_entry_points()
    if name not in SCENARIOS:
        hint = f"; plug-ins that failed to load: {_broken}" if _broken else ""
        raise UnknownName(f"unknown scenario {name!r}; available: {', '.join(names()) or 'none'}{hint}")
    return SCENARIOS.get(name)(**kwargs)


def answers_subtasks(name: str) -> bool | None:
    """Whether the scenario registered as ``name`` answers subtasks (``subtask_answer(task, subtask)``,
    what ``expert_reference: subtask`` scores against), read off its class without building it. None
    when that cannot be told without building it (an unknown name, a factory that is not a class)."""
    _load_entry_points()
    factory = SCENARIOS.get(name) if name in SCENARIOS else None
    if not isinstance(factory, type):
        return None
    return issubclass(factory, AnswersSubtasks)
