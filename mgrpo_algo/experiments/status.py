"""``mgrpo status``: where a run stands, from its files and its statistics store.

A decoupled run's roles may live in other processes or on other nodes; each reports its progress to
the run's store after every iteration it applies (``put_health``: the learner's figures at that
iteration; ``mark_done``). This reads it back beside the run folder's own commit points: the loop's
``loop_state.json`` (the last committed iteration), each worker's ``worker.json`` (``last_applied``
and the sub side's queued iterations), read from the run's storage (``placement.storage``: on a cluster a
shared folder or an object store, so the head node sees every worker's). Read-only: nothing is written,
no worker is started.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

__all__ = ["run_status", "format_status"]


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from exc


def run_status(run_dir: str | Path, store: str | None = None, storage: str | None = None) -> dict[str, Any]:
    """The run's progress: ``{"run_dir", "committed", "store", "store_error", "roles": {role: {...}}}``.

    ``store``: the store spec; default the run's (``config.json``'s ``placement.store``, else its own
    ``stats.sqlite``). ``storage``: where the workers' state is; default the run's (``placement.storage``,
    else the run folder). A store that cannot be read leaves ``store_error`` set and the files' figures.
    Raises FileNotFoundError when ``run_dir`` is no run folder.
    """
    from ..distributed.store import open_store
    from ..training.run_folder import RUN_STORE, run_store
    from ..training.storage import RunStorage
    from ..training.worker_state import WorkerState

    run = Path(run_dir)
    config = _read_json(run / "config.json")
    if storage is None:
        storage = ((config or {}).get("placement") or {}).get("storage") or ""
    files = RunStorage(storage or run)
    workers = sorted(role for role in files.names("workers") if files.exists(f"workers/{role}/worker.json"))
    if config is None and not workers:
        raise FileNotFoundError(f"{run} is no run folder (no config.json, no workers/*/worker.json)")
    loop = _read_json(run / "loop_state.json")
    roles: dict[str, dict[str, Any]] = {}
    for role in workers:
        state = WorkerState(files.child(f"workers/{role}"))  # reads worker.json, writes nothing
        roles[role] = {"last_applied": state.last_applied, "pending": sorted(int(i) for i in state.pending)}
    if store is None:
        store = ((config or {}).get("placement") or {}).get("store") or ""
        if not store and (run / RUN_STORE).exists():  # opening a missing SQLite file would create it
            store = run_store(run)
    out: dict[str, Any] = {"run_dir": str(run), "storage": storage or None, "committed": loop["iteration"] if loop else None,
                           "store": store or None, "store_error": None, "roles": roles}
    if not store:
        return out
    try:
        opened = open_store(store)
        try:
            for role in roles:
                done = opened.done_iterations(role)
                health = opened.get_health(role)
                roles[role]["store_done"] = max(done) if done else None
                roles[role]["store_done_count"] = len(done)
                roles[role]["health"] = health
        finally:
            opened.close()
    except Exception as exc:  # an unreachable or broken store: the files' figures still stand
        out["store_error"] = f"{type(exc).__name__}: {exc}"
    return out


def format_status(status: dict[str, Any], *, now: float | None = None) -> str:
    """A small table of :func:`run_status`."""
    now = time.time() if now is None else now
    committed = status["committed"]
    lines = [f"run {status['run_dir']}: loop committed iteration {committed if committed is not None else 'none yet'}"
             + (f"; workers' state in {status['storage']}" if status.get("storage") else ""),
             f"store {status['store'] or 'none'}" + (f" (unreadable: {status['store_error']})" if status["store_error"] else "")]
    lines.append(f"{'role':<8}{'applied':>8}{'pending':>12}{'store done':>12}{'health at':>10}{'age s':>9}  learner figures")
    for role, r in status["roles"].items():
        health = r.get("health") or {}
        figures = ", ".join(f"{k} {v:.4g}" for k, v in sorted(health.get("metrics", {}).items())
                            if k.endswith(("/loss", "/step", "/grad_norm", "/skipped")))
        age = f"{now - float(health['time']):.0f}" if health.get("time") else "-"
        done = r.get("store_done")
        lines.append(f"{role:<8}{r['last_applied']:>8}{','.join(map(str, r['pending'])) or '-':>12}"
                     f"{'-' if done is None else done:>12}{health.get('step', '-'):>10}{age:>9}  {figures or '-'}")
    return "\n".join(lines)
