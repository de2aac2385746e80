"""Failures outside a run's own code, each as one line for the command line: what stopped the run and what
to wait for before rerunning (a full disk, a served engine that stayed down, a storage out of reach).
Anything else is a bug, and its traceback is shown."""

from __future__ import annotations

from collections.abc import Sequence

from .disk_full import disk_full_line

__all__ = ["stop_line", "served_engine_failure", "storage_failure"]


def stop_line(exc: BaseException, folders: Sequence[str]) -> tuple[str, str] | None:
    """(one line for what stopped a run, what to wait for before rerunning) when ``exc`` is a failure
    outside the run's own code: a full disk under ``folders``, a served engine, an unreachable
    storage; None for anything else (a bug: its traceback is shown)."""
    for line_of, what in ((lambda: disk_full_line(exc, folders), "space is freed"),
                          (lambda: served_engine_failure(exc), "the server answers"),
                          (lambda: storage_failure(exc), "it can be reached")):
        line = line_of()
        if line is not None:
            return line, what
    return None


_ENGINE_ERRORS = ("PolicyError", "WeightSyncError", "VLLMServerError")


def served_engine_failure(exc: BaseException) -> str | None:
    """One line for a served engine that stayed down past ``served.wait_s`` (also when the role worker
    raised it in another process: a RemoteError names the type); None for any other error."""
    type_name = getattr(exc, "type_name", type(exc).__name__)
    if type_name.rsplit(".", 1)[-1] not in _ENGINE_ERRORS:
        return None
    message = getattr(exc, "message", str(exc))
    return f"the served engine failed ({type_name.rsplit('.', 1)[-1]}): {' '.join(message.split())[:300]}"


def storage_failure(exc: BaseException) -> str | None:
    """One line for a run storage (``placement.storage``) that cannot be read or written, raised here or
    by a role worker on another node (a RemoteError names the type); None for any other error."""
    while exc is not None:
        type_name = getattr(exc, "type_name", type(exc).__name__)
        if type_name.rsplit(".", 1)[-1] == "StorageUnreachable":
            return " ".join(getattr(exc, "message", str(exc)).split())[:400]
        exc = exc.__cause__
    return None
