"""The faults the training soak injects into a running ``mgrpo train`` (``benchmarks/train_soak.py``).

A schedule is ``KIND[:ARG]@K`` items, comma-separated: the fault fires at a random moment of the
iteration after ``K`` iterations are committed (so it lands inside collection or the update, not
between iterations). The kinds:

- ``loop-kill``: SIGKILL of the training loop and everything under it; the soak restarts it with ``--resume``.
- ``worker-kill:ROLE``: SIGKILL of one role worker's process (``placement: processes``); the loop
  restarts it from its checkpoint and logs one line.
- ``redis-restart[:SECONDS]``: the Redis store's server SIGKILLed, down for SECONDS (default 2),
  then started again on the same port from its append-only file; the store retries meanwhile.
- ``chromium-kill``: SIGKILL of every Chromium process under the loop; the browser tool starts a new
  one at its next fetch and logs one line (only where pages are rendered during training: a world
  built with ``prerender: false``).
- ``engine-kill[:ROLE]``: SIGKILL of a served vLLM engine's process group (``served.launch``: the
  server the run launched for ROLE, every role's without ROLE); the run's watchdog restarts it from the
  current weights at the next failed request and logs one line.
- ``disk-full``: the run folder's file system (a tmpfs of its own) filled by a ballast file; the run
  must stop in one line, and the soak frees the space and resumes it with ``--resume``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
from dataclasses import dataclass
from pathlib import Path

import psutil

__all__ = ["Fault", "WorkerProcesses", "fill_disk", "kill_chromium", "kill_engines", "kill_tree", "parse_faults"]

KINDS = ("loop-kill", "worker-kill", "redis-restart", "chromium-kill", "engine-kill", "disk-full")


@dataclass
class Fault:
    kind: str
    arg: str
    after: int  # fire during the iteration after this many are committed

    @property
    def label(self) -> str:
        return f"{self.kind}{':' + self.arg if self.arg else ''}@{self.after}"


def parse_faults(spec: str, roles: tuple[str, ...] = ("main", "sub")) -> list[Fault]:
    """``"worker-kill:sub@100,loop-kill@250"`` -> faults in firing order; a typo is refused in one line."""
    faults = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        what, at, after = item.partition("@")
        kind, _, arg = what.partition(":")
        if not at or not after.isdigit() or kind not in KINDS:
            raise SystemExit(f"train_soak: bad fault {item!r}: expected KIND[:ARG]@ITERATION, KIND one of {', '.join(KINDS)}")
        if kind == "worker-kill" and arg not in roles:
            raise SystemExit(f"train_soak: bad fault {item!r}: worker-kill needs a role, one of {', '.join(roles)}")
        if kind == "engine-kill" and arg and arg not in roles:
            raise SystemExit(f"train_soak: bad fault {item!r}: engine-kill takes a role, one of {', '.join(roles)}")
        faults.append(Fault(kind, arg, int(after)))
    return sorted(faults, key=lambda f: f.after)


def kill_tree(proc: psutil.Process) -> None:
    for victim in [*proc.children(recursive=True), proc]:
        with contextlib.suppress(psutil.Error):
            victim.send_signal(signal.SIGKILL)


def named_descendants(loop: psutil.Process) -> list[tuple[str, psutil.Process]]:
    """The live processes under ``loop`` with their kernel names (a process gone meanwhile is skipped)."""
    out = []
    with contextlib.suppress(psutil.Error):
        for child in loop.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if child.status() != psutil.STATUS_ZOMBIE:
                    out.append((child.name(), child))
    return out


class WorkerProcesses:
    """Each role worker's process under the loop (``placement: processes``), found by the kernel's
    name a role server gives itself (``mgrpo-<role>``, mgrpo_algo/distributed/placement.py)."""

    def __init__(self, loop: psutil.Process, roles: tuple[str, ...]) -> None:
        self.loop, self.names = loop, {f"mgrpo-{role}": role for role in roles}

    def refresh(self) -> dict[str, int]:
        return {self.names[name]: proc.pid for name, proc in named_descendants(self.loop) if name in self.names}

    def kill(self, role: str) -> int | None:
        pid = self.refresh().get(role)
        if pid is not None:
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).send_signal(signal.SIGKILL)
        return pid


def kill_chromium(loop: psutil.Process) -> list[int]:
    """SIGKILL every Chromium process under ``loop``; their pids."""
    victims = [proc for name, proc in named_descendants(loop) if "chrom" in name]
    for proc in victims:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGKILL)
    return [proc.pid for proc in victims]


def kill_engines(loop: psutil.Process, role: str = "") -> list[int]:
    """SIGKILL the process group of each vLLM server under ``loop`` (``role``'s only: the one whose
    command names the role's full-weight folder ``<run>/served/<role>``; a LoRA server serves the start
    model's folder, so name no role for it); the group leaders' pids. The server starts in a session
    of its own, so its engine core goes too."""
    from mgrpo_algo.policies.vllm_server import ENTRY_POINT

    leaders = []
    for _, proc in named_descendants(loop):
        with contextlib.suppress(psutil.Error):
            cmdline = proc.cmdline()
            if ENTRY_POINT not in cmdline or os.getpgid(proc.pid) != proc.pid:
                continue
            if role and not any(arg.rstrip("/").endswith(f"/served/{role}") for arg in cmdline):
                continue
            leaders.append(proc.pid)
    for pid in leaders:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    return leaders


def fill_disk(folder: Path, name: str = "ballast") -> tuple[Path, int]:
    """Fill ``folder``'s file system with one file until the kernel says ENOSPC; returns (file, bytes)."""
    ballast = folder / name
    written = 0
    chunk = b"\0" * (1 << 20)
    with ballast.open("wb") as fh:
        try:
            while True:
                fh.write(chunk)
                fh.flush()
                written += len(chunk)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
    return ballast, written
