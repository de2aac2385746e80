"""A full disk, told apart from other failures, so a run stops in one line and resumes when space returns.

A write that fails for lack of space does not always say so: Python's own writes raise ``OSError``
with ``errno.ENOSPC`` (or ``EDQUOT`` past a quota), SQLite raises "database or disk is full", torch's
checkpoint writer raises a ``RuntimeError`` ("unexpected pos ...") with no errno at all, and a role
worker in another process sends back only the type's name and the message. So a failure counts as a
full disk when the error chain says so, or when a folder the run writes has (almost) no space left
right after it (the failed writer's partial file, if removed, frees little; 1 MiB is far below any
write a run makes and far above a file system's reserved rounding).

Nothing is lost when it happens: every file a run commits is written whole (a temporary file, then a
rename) or appended and cut back to the last committed iteration on ``--resume``, so the run
resumes from its last committed iteration once space is freed.
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Iterable
from pathlib import Path

__all__ = ["FULL_BELOW_BYTES", "disk_full_line", "free_bytes"]

#: A file system with less free space than this counts as full.
FULL_BELOW_BYTES = 1 << 20

_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
_MESSAGES = ("no space left on device", "disk quota exceeded", "database or disk is full")


def free_bytes(folder: str | Path) -> int | None:
    """Free bytes on the file system of ``folder`` (its nearest existing parent); None if unknown."""
    path = Path(folder).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def _says_full(exc: BaseException) -> bool:
    seen: set[int] = set()
    stack = [exc]
    while stack:
        current = stack.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _ERRNOS:
            return True
        if any(marker in str(current).lower() for marker in _MESSAGES):
            return True
        stack += [current.__cause__, current.__context__]
    return False


def disk_full_line(exc: BaseException, folders: Iterable[str | Path]) -> str | None:
    """One line when ``exc`` came from a full disk (the error says so, or one of ``folders``, those the
    run writes, has less than :data:`FULL_BELOW_BYTES` free); None for any other failure."""
    free = {Path(f): free_bytes(f) for f in folders if f and "://" not in str(f)}
    full = [(folder, left) for folder, left in free.items() if left is not None and left < FULL_BELOW_BYTES]
    if not full and not _says_full(exc):
        return None
    where, left = full[0] if full else next(iter(free.items()), (Path("."), None))
    shown = f"{left / 2**20:.1f} MiB free" if left is not None else "free space unknown"
    # a role worker's RemoteError: the remote type and message, without the remote traceback
    what = f"{getattr(exc, 'type_name', type(exc).__name__)}: {getattr(exc, 'message', str(exc))}"
    return f"the disk of {where} is full ({shown}; {' '.join(what.split())[:200]})"
