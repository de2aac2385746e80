"""Fault injection for crash tests: SIGKILL this process at a named point of an iteration.

``MGRPO_FAULT`` holds kill points separated by ``;``, each a point name and ``key=value`` conditions
separated by ``:``::

    MGRPO_FAULT="after_store_write:role=main:iteration=1;act:role=sub:iteration=2:call=1"

A point fires when the code reaches it with every condition equal (compared as text) to what that
place reports (``role``, ``iteration``, ``call``), by ``os.kill(os.getpid(), SIGKILL)``: nothing is
flushed or closed, as in a power cut or an OOM kill. Each point fires at most once per marker folder:
just before the kill it writes ``.fault-<index>.fired`` there, so the restarted process (same
environment, same folder) goes past it. The spec is read once, when a :class:`FaultPoints` is made
(a role server's or a trainer's start); unset, :meth:`FaultPoints.hit` is one set lookup.

Points: in a role server (:mod:`mgrpo_algo.training.roles`) ``act`` (before sampling; ``call`` counts
the ``act`` calls of the iteration from 0), ``after_store_write`` (main: statistics published, not yet
updated), ``after_update`` (the learner stepped in memory, no checkpoint yet), ``after_checkpoint``
(checkpoint written, the server's state not yet); in the iteration loop
(:mod:`mgrpo_algo.training.trainer`, role ``loop``) ``loop_after_update`` (updated, nothing written)
and ``loop_before_commit`` (metrics and episodes appended, checkpoint and ``loop_state.json`` not yet).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

__all__ = ["FAULT_ENV", "FAULT_POINTS", "FaultPoints", "parse_faults"]

FAULT_ENV = "MGRPO_FAULT"
FAULT_POINTS = frozenset({"act", "after_store_write", "after_update", "after_checkpoint",
                          "loop_after_update", "loop_before_commit"})


def parse_faults(spec: str | None) -> list[tuple[str, dict[str, str]]]:
    """``[(point, {key: value})]`` of a ``MGRPO_FAULT`` spec; an unknown point raises ValueError
    (a typo would otherwise make a crash test pass without crashing)."""
    points = []
    for part in (spec or "").split(";"):
        if not part.strip():
            continue
        name, *conditions = part.strip().split(":")
        if name not in FAULT_POINTS:
            raise ValueError(f"{FAULT_ENV}: unknown kill point {name!r}; known: {', '.join(sorted(FAULT_POINTS))}")
        where = {}
        for condition in conditions:
            key, sep, value = condition.partition("=")
            if not sep or not key:
                raise ValueError(f"{FAULT_ENV}: condition {condition!r} of {name!r} is not key=value")
            where[key.strip()] = value.strip()
        points.append((name, where))
    return points


class FaultPoints:
    """The kill points of one process; ``marker_dir`` remembers which already fired."""

    def __init__(self, spec: str | None, marker_dir: str | os.PathLike) -> None:
        self.points = parse_faults(spec)
        self.names = {name for name, _ in self.points}
        self.marker_dir = Path(marker_dir)

    @classmethod
    def from_env(cls, marker_dir: str | os.PathLike) -> FaultPoints:
        return cls(os.environ.get(FAULT_ENV), marker_dir)

    def hit(self, name: str, **where: object) -> None:
        """Kill this process if a point named ``name`` matches ``where`` and has not fired yet."""
        if name not in self.names:
            return
        for index, (point, conditions) in enumerate(self.points):
            if point != name or any(str(where.get(key)) != value for key, value in conditions.items()):
                continue
            marker = self.marker_dir / f".fault-{index}.fired"
            if marker.exists():
                continue
            self.marker_dir.mkdir(parents=True, exist_ok=True)
            marker.write_text(f"{name} {where}\n")  # written before the kill: the restart goes past
            os.kill(os.getpid(), signal.SIGKILL)
