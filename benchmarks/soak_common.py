"""What the soaks sample and how they judge it: a process tree's memory, files, threads and children,
glibc's heap, the growth after warm-up (a least-squares slope) and a plot of the samples.

Shared by ``fault_soak.py`` (episodes through a hostile web) and ``train_soak.py`` (training
iterations). Linux only (``/proc`` through psutil; ``mallinfo2`` from glibc when present).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

__all__ = ["malloc_mb", "process_sample", "tree_sample", "growth", "plot_samples"]


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def _libc() -> Any:
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        return libc
    return None


_LIBC = _libc()


def malloc_mb() -> dict[str, float]:
    """glibc's heap of this process in MB, all arenas: ``heap`` (from sbrk/arenas), ``in_use``,
    ``free`` (held by the allocator, not returned: fragmentation shows here) and ``mmapped``;
    {} without glibc's ``mallinfo2``."""
    if _LIBC is None:
        return {}
    info = _LIBC.mallinfo2()
    mb = 2**20
    return {"heap": info.arena / mb, "in_use": info.uordblks / mb, "free": info.fordblks / mb,
            "mmapped": info.hblkhd / mb}


def process_sample(proc: psutil.Process) -> dict[str, Any]:
    """RSS (MB), open file descriptors and threads of one process (None for what cannot be read)."""
    out: dict[str, Any] = {"pid": proc.pid}
    for key, read in (("rss_mb", lambda: proc.memory_info().rss / 2**20), ("fds", proc.num_fds),
                      ("threads", proc.num_threads)):
        try:
            out[key] = read()
        except psutil.Error:
            out[key] = None
    return out


def tree_sample(root: psutil.Process | None = None, *, apart: Sequence[int] = ()) -> dict[str, Any]:
    """This process (or ``root``) and its descendants: the root's own figures, the descendants' summed
    RSS and their count, and per-name sums (``chromium``, ``python`` ...). Descendants in ``apart``
    (and their own children) are summed under ``apart`` instead (a helper server that is not what
    is measured)."""
    root = root or psutil.Process()
    out = process_sample(root)
    out["python_threads"] = threading.active_count() if root.pid == psutil.Process().pid else None
    children = root.children(recursive=True)
    skip: set[int] = set()
    for pid in apart:
        with contextlib.suppress(psutil.Error):
            skip.add(pid)
            skip.update(c.pid for c in psutil.Process(pid).children(recursive=True))
    kids, rest, by_name = 0.0, 0.0, {}
    for child in children:
        with contextlib.suppress(psutil.Error):
            rss = child.memory_info().rss / 2**20
            if child.pid in skip:
                rest += rss
                continue
            kids += rss
            name = child.name().split("-")[0]
            by_name[name] = by_name.get(name, 0.0) + rss
    out["children"] = len([c for c in children if c.pid not in skip])
    out["children_rss_mb"] = kids
    out["children_by_name_mb"] = by_name
    out["apart_rss_mb"] = rest
    return out


def growth(xs: Sequence[float], ys: Sequence[float], warmup: float) -> dict[str, Any]:
    """Growth of ``ys`` after ``x >= warmup``: first and last values, their difference in % of the
    first, and the least-squares slope per 1,000 x with its projection over 10,000 x (in % of the
    first value). Empty when fewer than 3 points are past the warm-up."""
    pts = [(x, y) for x, y in zip(xs, ys, strict=True) if x >= warmup and y is not None]
    if len(pts) < 3:
        return {}
    n = len(pts)
    mx = sum(x for x, _ in pts) / n
    my = sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    slope = sum((x - mx) * (y - my) for x, y in pts) / sxx if sxx else 0.0
    first, last = pts[0][1], pts[-1][1]
    return {
        "from_x": pts[0][0], "to_x": pts[-1][0], "points": n, "first": first, "last": last,
        "max": max(y for _, y in pts), "min": min(y for _, y in pts),
        "growth_pct": 100.0 * (last - first) / first if first else None,
        "slope_per_1000": 1000.0 * slope,
        "projected_pct_per_10000": 100.0 * 10_000 * slope / first if first else None,
    }


def plot_samples(path: Path, xs: Sequence[float], series: dict[str, Sequence[float | None]], *,
                 xlabel: str, title: str, warmup: float | None = None) -> Path | None:
    """One PNG panel with a line per series (MB); None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, ys in series.items():
        pts = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label)
    if warmup is not None:
        ax.axvline(warmup, color="grey", linestyle=":", label="end of warm-up")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("MB")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
