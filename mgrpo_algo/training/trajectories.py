"""The token trajectories a role worker sampled: their one owner.

The worker that generated a turn keeps its exact token ids (prompt, completion, log-probabilities,
what :class:`~mgrpo_env.rollout.PolicyResponse.extra` carries) and the turn's anchor state
(:func:`mgrpo_algo.core.scoring.anchor_state`, the step credit's key), by iteration and by
``"<episode>/<agent>"``: the key the loop's episode records carry (``EpisodeRecord.trajectory_key``:
the iteration and the record's index). The loop's records keep text and rewards, never token ids, so
``episodes.jsonl`` is the same under every placement. Nothing is stripped from a record and rebuilt:
each request's token history is read from here, and the training sequences are built from here.

On the run's storage (:mod:`mgrpo_algo.training.storage`), under the worker's folder: ``buffers/<t>.json``
(written atomically by :meth:`commit`: an iteration collected and not yet applied survives a restart, on
this node or another), moved to ``trajectories/<t>.json`` once applied when the run keeps its token ids
(``keep_token_ids``), else deleted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .storage import RunStorage, drop_json_after, write_json

__all__ = ["Trajectories", "drop_json_after", "trajectory_key", "write_json"]


def trajectory_key(episode: int, agent: str) -> str:
    """The key of one agent's trajectory in an iteration: ``"<record index>/<agent>"``."""
    return f"{episode}/{agent}"


class Trajectories:
    """One worker's sampled turns by iteration (see the module docstring).

    Args:
        folder: the worker's folder (``workers/<role>``): a path, or a folder of the run's storage.
        keep: keep each applied iteration's trajectories (``trajectories/<t>.json``) instead of deleting them.
    """

    def __init__(self, folder: Path | RunStorage, *, keep: bool = False) -> None:
        self.files = folder if isinstance(folder, RunStorage) else RunStorage(folder)
        self.keep = keep
        self._open: dict[int, dict[str, Any]] = {}

    def history(self, iteration: int, episode: int, agent: str) -> list[dict[str, Any]]:
        """The token extras of the agent's earlier turns in ``iteration``, oldest first."""
        turns = self._open.get(iteration, {}).get("turns", {})
        return turns.get(trajectory_key(episode, agent), [])

    def add(self, iteration: int, episode: int, agent: str, extra: dict[str, Any], state: str) -> None:
        """One sampled turn: its token extras and its anchor state."""
        buffer = self._open.setdefault(iteration, {"turns": {}, "states": {}})
        key = trajectory_key(episode, agent)
        buffer["turns"].setdefault(key, []).append(extra)
        buffer["states"].setdefault(key, []).append(state)

    def commit(self, iteration: int) -> int:
        """Write ``iteration``'s trajectories to ``buffers/<t>.json`` (atomic); returns how many."""
        from mgrpo_env.episode import compact_token_extras

        buffer = self._open.get(iteration, {"turns": {}, "states": {}})
        # each turn's new prompt ids only (linear in turns); trajectory_sequence reads the compact form as is
        data = {"turns": {key: compact_token_extras(turns) for key, turns in buffer["turns"].items()},
                "states": buffer["states"]}
        self.files.write_json(f"buffers/{iteration}.json", data)
        return len(buffer["turns"])

    def load(self, iteration: int) -> dict[str, Any]:
        """``iteration``'s trajectories (``{"turns": {key: extras}, "states": {key: anchor states}}``),
        from memory or from its committed buffer."""
        if iteration in self._open:
            return self._open[iteration]
        data = self.files.read_json(f"buffers/{iteration}.json")
        if data is None:
            raise RuntimeError(f"no committed rollouts for iteration {iteration} under {self.files.path('buffers')}")
        self._open[iteration] = data
        return data

    def discard(self, iteration: int) -> None:
        """Forget an iteration's rollouts (the loop collects it again after a failure)."""
        self._open.pop(iteration, None)
        self.files.remove(f"buffers/{iteration}.json")

    def retire(self, iteration: int) -> None:
        """``iteration`` is applied: its trajectories leave the buffer (kept under ``trajectories/``
        with ``keep``, else deleted). Idempotent: a replayed tail finds nothing left to move."""
        self._open.pop(iteration, None)
        buffer = f"buffers/{iteration}.json"
        if self.keep and self.files.exists(buffer):
            self.files.move(buffer, f"trajectories/{iteration}.json")
        self.files.remove(buffer)

    def drop_after(self, iteration: int) -> None:
        """A rollback to ``iteration``: every later iteration's trajectories go."""
        self.files.drop_json_after("buffers", iteration)
        self.files.drop_json_after("trajectories", iteration)
        for it in [i for i in self._open if i > iteration]:
            del self._open[it]
