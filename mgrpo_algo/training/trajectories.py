"""The token trajectories a role worker sampled: their one owner.

The worker that generated a turn keeps its exact token ids (prompt, completion, log-probabilities,
what :class:`~mgrpo_env.rollout.PolicyResponse.extra` carries) and the turn's anchor state
(:func:`mgrpo_algo.core.scoring.anchor_state`, the step credit's key), by iteration and by
``"<episode>/<agent>"``: the key the loop's episode records carry (``EpisodeRecord.trajectory_key``:
the iteration and the record's index). The loop's records keep text and rewards, never token ids, so
``episodes.jsonl`` is the same under every placement. Nothing is stripped from a record and rebuilt:
each request's token history is read from here, and the training sequences are built from here.

On disk, under the worker's folder: ``buffers/<t>.json`` (written atomically by :meth:`commit`: an
iteration collected and not yet applied survives a restart), moved to ``trajectories/<t>.json`` once
applied when the run keeps its token ids (``keep_token_ids``), else deleted.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

__all__ = ["Trajectories", "drop_json_after", "trajectory_key", "write_json"]


def trajectory_key(episode: int, agent: str) -> str:
    """The key of one agent's trajectory in an iteration: ``"<record index>/<agent>"``."""
    return f"{episode}/{agent}"


class Trajectories:
    """One worker's sampled turns by iteration (see the module docstring).

    Args:
        folder: the worker's folder (``workers/<role>``).
        keep: keep each applied iteration's trajectories (``trajectories/<t>.json``) instead of deleting them.
    """

    def __init__(self, folder: Path, *, keep: bool = False) -> None:
        self.buffers_dir = folder / "buffers"
        self.kept_dir = folder / "trajectories"
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
        write_json(self.buffers_dir / f"{iteration}.json", data)
        return len(buffer["turns"])

    def load(self, iteration: int) -> dict[str, Any]:
        """``iteration``'s trajectories (``{"turns": {key: extras}, "states": {key: anchor states}}``),
        from memory or from its committed buffer."""
        if iteration in self._open:
            return self._open[iteration]
        path = self.buffers_dir / f"{iteration}.json"
        if not path.exists():
            raise RuntimeError(f"no committed rollouts for iteration {iteration} under {self.buffers_dir}")
        self._open[iteration] = json.loads(path.read_text())
        return self._open[iteration]

    def discard(self, iteration: int) -> None:
        """Forget an iteration's rollouts (the loop collects it again after a failure)."""
        self._open.pop(iteration, None)
        (self.buffers_dir / f"{iteration}.json").unlink(missing_ok=True)

    def retire(self, iteration: int) -> None:
        """``iteration`` is applied: its trajectories leave the buffer (kept under ``trajectories/``
        with ``keep``, else deleted). Idempotent: a replayed tail finds nothing left to move."""
        self._open.pop(iteration, None)
        path = self.buffers_dir / f"{iteration}.json"
        if self.keep and path.exists():
            self.kept_dir.mkdir(parents=True, exist_ok=True)
            os.replace(path, self.kept_dir / path.name)
        path.unlink(missing_ok=True)

    def drop_after(self, iteration: int) -> None:
        """A rollback to ``iteration``: every later iteration's trajectories go."""
        drop_json_after(self.buffers_dir, iteration)
        drop_json_after(self.kept_dir, iteration)
        for it in [i for i in self._open if i > iteration]:
            del self._open[it]


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as JSON at ``path`` atomically (a temporary file renamed over it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def drop_json_after(folder: Path, iteration: int) -> None:
    """Delete ``folder/<t>.json`` for every iteration t after ``iteration``."""
    for path in folder.glob("*.json") if folder.exists() else []:
        if int(path.stem) > iteration:
            path.unlink()
