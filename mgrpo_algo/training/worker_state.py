"""A role worker's commit point: ``worker.json`` and its per-iteration checkpoints.

``worker.json`` holds ``last_applied`` (the newest iteration this worker applied), that iteration's
metrics (a replay returns them) and ``pending`` (the sub side's queued iterations: facts and scoring,
waiting for the main statistics). Each applied iteration is checkpointed under
``checkpoints/iter-<t>``, whose ``learner.json`` carries ``last_applied`` too: the atomic rename of
the checkpoint commits the iteration, ``worker.json`` may lag behind it by one kill
(:meth:`WorkerState.adopt`). The loop's commit prunes older checkpoints (:meth:`WorkerState.prune`);
a resumed run rolls back to the loop's last committed iteration (:meth:`WorkerState.rollback`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from .trajectories import write_json

__all__ = ["WorkerState"]


class WorkerState:
    """``worker.json`` and ``checkpoints/iter-<t>`` of one worker folder (see the module docstring)."""

    def __init__(self, folder: Path) -> None:
        self.dir = folder
        self.file = folder / "worker.json"
        self.data: dict[str, Any] = {"last_applied": -1, "metrics": {}}
        if self.file.exists():
            try:
                self.data = json.loads(self.file.read_text())
            except ValueError as exc:  # written atomically, so only a hand edit or a foreign file gets here
                raise ValueError(f"{self.file}: not a worker state ({exc})") from exc

    @property
    def last_applied(self) -> int:
        return int(self.data["last_applied"])

    @property
    def pending(self) -> dict[str, Any]:
        """The queued iterations by ``str(iteration)``."""
        return self.data.setdefault("pending", {})

    def metrics_of(self, iteration: int) -> dict[str, Any]:
        """The metrics kept for ``iteration`` (only the last applied one's are kept)."""
        return dict(self.data["metrics"].get(str(iteration), {}))

    def applied(self, iteration: int, metrics: dict[str, Any]) -> None:
        """``iteration`` is applied (saved with the next :meth:`save`): no longer pending."""
        self.data["last_applied"] = iteration
        self.data["metrics"] = {str(iteration): metrics}
        self.pending.pop(str(iteration), None)

    def save(self) -> None:
        write_json(self.file, self.data)

    # -- checkpoints ------------------------------------------------------------------------------

    def checkpoint_dir(self, iteration: int) -> Path:
        return self.dir / "checkpoints" / f"iter-{iteration}"

    def checkpoints(self) -> list[Path]:
        """The per-iteration checkpoints, oldest first."""
        root = self.dir / "checkpoints"
        found = [p for p in root.glob("iter-*") if p.is_dir()] if root.exists() else []
        return sorted(found, key=_iteration_of)

    def newest(self) -> Path | None:
        """The newest complete checkpoint (a kill inside a save leaves the previous one aside: recovered first)."""
        from ..learning.learner import RoleLearner

        found = self.checkpoints()
        if not found:
            return None
        RoleLearner.recover(found[-1])
        return found[-1] if (found[-1] / "learner.json").exists() else None

    def adopt(self, folder: Path) -> None:
        """Take ``last_applied`` from a checkpoint when ``worker.json`` lags behind it (a kill between them)."""
        extra = json.loads((folder / "learner.json").read_text()).get("extra") or {}
        if extra.get("last_applied", -1) > self.last_applied:
            self.data["last_applied"] = extra["last_applied"]
            self.data["metrics"] = extra.get("metrics", {})
            for it in [i for i in self.pending if int(i) <= extra["last_applied"]]:
                del self.pending[it]

    def rollback(self, iteration: int, learner: Any, role: str) -> None:
        """Back to the state after ``iteration``: later checkpoints and queued iterations dropped, the
        learner resumed in place from the newest checkpoint at or before it (frozen: no learner)."""
        for folder in [p for p in self.checkpoints() if _iteration_of(p) > iteration]:
            shutil.rmtree(folder)
        for it in [i for i in self.pending if int(i) > iteration]:
            del self.pending[it]
        if self.last_applied > iteration:
            keep = self.checkpoints()
            if learner is not None:
                if not keep:
                    raise ValueError(f"{role} worker: no checkpoint at or before iteration {iteration} "
                                     f"under {self.dir / 'checkpoints'}")
                learner.resume(keep[-1])  # in place: the policy shares the model object
                last = int(json.loads((keep[-1] / "learner.json").read_text())["extra"]["last_applied"])
            else:
                last = iteration
            self.data["last_applied"] = last
            self.data["metrics"] = {}

    def prune(self, iteration: int) -> None:
        """The loop committed ``iteration``: checkpoints older than the newest at or before it can go."""
        upto = [p for p in self.checkpoints() if _iteration_of(p) <= iteration]
        for folder in upto[:-1]:
            shutil.rmtree(folder, ignore_errors=True)


def _iteration_of(folder: Path) -> int:
    return int(folder.name.split("-", 1)[1])
