"""A run folder is used by one run: a second ``mgrpo train`` into it is refused, not mixed in.

Appending a new run to a used folder interleaved its ``metrics.jsonl`` and ``episodes.jsonl``
(iterations 0, 1, 2, 3, 0, ...), deleted its checkpoints and reset ``loop_state.json``. Now the
second run must say what it wants: ``--resume`` (continue after the last committed iteration) or
``--overwrite`` (remove the old run's files, listed in :data:`RUN_FILES`, and start afresh).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from .preflight import PreflightError

__all__ = ["RUN_FILES", "RUN_STORE", "run_store", "used_run_files", "check_fresh_run_folder", "clear_run_folder"]

#: A run's own statistics store, in its ``out_dir``, when ``placement.store`` names none.
RUN_STORE = "stats.sqlite"

#: What a training run writes in its ``out_dir`` (files and folders).
RUN_FILES = ("loop_state.json", "metrics.jsonl", "episodes.jsonl", "config.json", "checkpoints", "final", "tb",
             "adapters", RUN_STORE, "workers", "eval_before.jsonl", "eval_after.jsonl", "view.html")


def run_store(out_dir: str | Path, store: str = "") -> str:
    """The store spec a run in ``out_dir`` uses: ``store`` (``placement.store``), else its own SQLite file."""
    return store or f"sqlite:{Path(out_dir) / RUN_STORE}"


def used_run_files(out_dir: str | Path) -> list[str]:
    """The :data:`RUN_FILES` present in ``out_dir`` (empty: a fresh or absent folder)."""
    out = Path(out_dir)
    if not out.is_dir():
        return []
    return [name for name in RUN_FILES if (out / name).exists()]


def check_fresh_run_folder(out_dir: str | Path, *, resume: bool, overwrite: bool, storage: str = "") -> None:
    """Refuse a folder that holds another run's results unless ``resume`` or ``overwrite`` says what to do;
    the same for a declared run storage (``placement.storage``) that holds another run's workers."""
    if resume and overwrite:
        raise PreflightError("--resume and --overwrite exclude each other")
    # a config.json alone is written before the first iteration: a run refused or killed before it started
    used = [name for name in used_run_files(out_dir) if name != "config.json"]
    if used and not (resume or overwrite):
        raise PreflightError(f"output folder {str(out_dir)!r} holds a previous run ({', '.join(used)}); "
                             "continue it with --resume, start afresh with --overwrite, or choose another "
                             "--set out_dir=...")
    if storage and not (resume or overwrite):
        from .storage import RunStorage, StorageUnreachable

        try:
            workers = RunStorage(storage).names("workers")
        except StorageUnreachable:
            workers = []  # the storage's own check says it better
        if workers:
            raise PreflightError(f"run storage {storage!r} holds a previous run's workers ({', '.join(sorted(workers))}); "
                                 "continue it with --resume, start afresh with --overwrite (they are removed), or "
                                 "choose another --set placement.storage=...")


def clear_run_folder(out_dir: str | Path) -> list[str]:
    """Remove the :data:`RUN_FILES` of ``out_dir`` (nothing else in it); return what was removed."""
    out = Path(out_dir)
    removed = used_run_files(out)
    for name in removed:
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    for extra in out.glob(f"{RUN_STORE}-*") if out.is_dir() else []:  # SQLite's -wal / -shm beside the store
        extra.unlink()
    return removed
