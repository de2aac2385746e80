"""A role worker's commit point: ``worker.json`` and its per-iteration checkpoints.

``worker.json`` holds ``last_applied`` (the newest iteration this worker applied), that iteration's
metrics (a replay returns them) and ``pending`` (the sub side's queued iterations: facts and scoring,
waiting for the main statistics). Each applied iteration is checkpointed under
``checkpoints/iter-<t>``, whose ``learner.json`` carries ``last_applied`` too: the atomic rename of
the checkpoint commits the iteration, ``worker.json`` may lag behind it by one kill
(:meth:`WorkerState.adopt`). The loop's commit prunes older checkpoints (:meth:`WorkerState.prune`);
a resumed run rolls back to the loop's last committed iteration (:meth:`WorkerState.rollback`).
All of it lives on the run's storage (:mod:`mgrpo_algo.training.storage`: the run folder, a shared file
system or an object store), so a worker restarted on another node finds it.
"""

from __future__ import annotations

from pathlib import Path, PurePath, PurePosixPath
from typing import Any

from .storage import RunStorage

__all__ = ["WorkerState"]


class WorkerState:
    """``worker.json`` and ``checkpoints/iter-<t>`` of one worker folder (see the module docstring):
    a path, or a folder of the run's storage."""

    def __init__(self, folder: Path | RunStorage) -> None:
        self.files = folder if isinstance(folder, RunStorage) else RunStorage(folder)
        self.data: dict[str, Any] = {"last_applied": -1, "metrics": {}}
        try:
            saved = self.files.read_json("worker.json")
        except ValueError as exc:  # written atomically, so only a hand edit or a foreign file gets here
            raise ValueError(f"{self.files.path('worker.json')}: not a worker state ({exc})") from exc
        if saved is not None:
            self.data = saved

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
        self.files.write_json("worker.json", self.data)

    # -- checkpoints ------------------------------------------------------------------------------

    def checkpoint_dir(self, iteration: int) -> Path:
        """The local folder of ``iteration``'s checkpoint (a local storage only; else see :meth:`save_checkpoint`)."""
        if self.files.local is None:
            raise ValueError(f"{self.files.url} is not a local folder")
        return self.files.local / _checkpoint_rel(iteration)

    def save_checkpoint(self, iteration: int, learner: Any, extra: dict[str, Any]) -> None:
        """``learner``'s checkpoint of ``iteration`` (its ``learner.json`` carrying ``extra``), committed atomically."""
        self.files.save_folder(_checkpoint_rel(iteration), lambda folder: learner.save(folder, extra=extra))

    def checkpoints(self) -> list[PurePath]:
        """The per-iteration checkpoints, oldest first (local paths, or the storage's paths)."""
        names = [n for n in self.files.names("checkpoints") if n.startswith("iter-")]
        found = [n for n in names if self.files.is_folder(f"checkpoints/{n}")]
        if self.files.local is not None:
            return sorted((self.files.local / "checkpoints" / n for n in found), key=_iteration_of)
        return sorted((PurePosixPath(self.files.path(f"checkpoints/{n}")) for n in found), key=_iteration_of)

    def newest(self) -> PurePath | None:
        """The newest complete checkpoint (a kill inside a save leaves the previous one aside, an upload
        cut before its commit marker is not one: recovered first)."""
        from ..learning.learner import RoleLearner

        self.files.discard_incomplete("checkpoints")
        found = self.checkpoints()
        if not found:
            return None
        if self.files.local is None:
            return found[-1]
        RoleLearner.recover(found[-1])
        return found[-1] if (found[-1] / "learner.json").exists() else None

    def local_checkpoint(self, folder: PurePath) -> Path:
        """A checkpoint of :meth:`checkpoints` as a local folder to load (downloaded from a remote storage)."""
        return self.files.local_folder(f"checkpoints/{folder.name}")

    def _meta(self, folder: PurePath) -> dict[str, Any]:
        return self.files.read_json(f"checkpoints/{folder.name}/learner.json") or {}

    def adopt(self, folder: PurePath) -> None:
        """Take ``last_applied`` from a checkpoint when ``worker.json`` lags behind it (a kill between them)."""
        extra = self._meta(folder).get("extra") or {}
        if extra.get("last_applied", -1) > self.last_applied:
            self.data["last_applied"] = extra["last_applied"]
            self.data["metrics"] = extra.get("metrics", {})
            for it in [i for i in self.pending if int(i) <= extra["last_applied"]]:
                del self.pending[it]

    def rollback(self, iteration: int, learner: Any, role: str) -> None:
        """Back to the state after ``iteration``: later checkpoints and queued iterations dropped, the
        learner resumed in place from the newest checkpoint at or before it (frozen: no learner)."""
        for folder in [p for p in self.checkpoints() if _iteration_of(p) > iteration]:
            self.files.remove(f"checkpoints/{folder.name}")
        for it in [i for i in self.pending if int(i) > iteration]:
            del self.pending[it]
        if self.last_applied > iteration:
            keep = self.checkpoints()
            if learner is not None:
                if not keep:
                    raise ValueError(f"{role} worker: no checkpoint at or before iteration {iteration} "
                                     f"under {self.files.path('checkpoints')}")
                learner.resume(self.local_checkpoint(keep[-1]))  # in place: the policy shares the model object
                last = int(self._meta(keep[-1])["extra"]["last_applied"])
            else:
                last = iteration
            self.data["last_applied"] = last
            self.data["metrics"] = {}

    def prune(self, iteration: int) -> None:
        """The loop committed ``iteration``: checkpoints older than the newest at or before it can go."""
        upto = [p for p in self.checkpoints() if _iteration_of(p) <= iteration]
        for folder in upto[:-1]:
            self.files.remove(f"checkpoints/{folder.name}")


def _checkpoint_rel(iteration: int) -> str:
    return f"checkpoints/iter-{iteration}"


def _iteration_of(folder: PurePath) -> int:
    return int(folder.name.split("-", 1)[1])
