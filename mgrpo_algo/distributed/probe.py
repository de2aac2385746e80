"""A probe for placements: a tiny role server that every placement and every Ray node can import.

:func:`mgrpo_algo.distributed.placement.spawn` pickles its factory by reference, so a probe must live in
an installed module, not in a script or in ``tests/`` (a Ray worker gets neither the driver's
``sys.path`` nor its ``__main__``). :class:`EchoServer` checks that a placement or a cluster serves
calls, state, errors, timeouts and environment variables; :func:`measure_overhead` times its calls
(``python -m mgrpo_algo.distributed.probe``).
"""

from __future__ import annotations

import os
import time
from typing import Any

from .placement import PLACEMENTS, spawn

__all__ = ["EchoServer", "measure_overhead"]


class EchoServer:
    """A probe role server: importable on every node like the real one, with a little state.

    A counter with state; ``fail`` raises; ``sleep`` blocks; ``close`` writes ``closed`` to
    ``marker_path`` (if given) so a test can see it ran in the server. ``fail_on_start`` raises in the
    constructor, ``exit_on_start`` ends the process there with that exit code.
    """

    def __init__(self, start: int = 0, marker_path: str | None = None, fail_on_start: bool = False,
                 exit_on_start: int | None = None) -> None:
        if fail_on_start:
            raise RuntimeError("asked to fail on start")
        if exit_on_start is not None:
            os._exit(exit_on_start)
        self.count, self.marker_path = start, marker_path

    def incr(self, by: int = 1) -> int:
        self.count += by
        return self.count

    def get(self) -> int:
        return self.count

    def echo(self, *args: Any, **kwargs: Any) -> tuple:
        return args, kwargs

    def noop(self) -> None:
        return None

    def fail(self, message: str) -> None:
        raise ValueError(f"toy failure: {message}")

    def sleep(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    def getenv(self, key: str) -> str | None:
        return os.environ.get(key)

    def getpid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        if self.marker_path:
            with open(self.marker_path, "a") as fh:
                fh.write(f"closed {os.getpid()}\n")


def measure_overhead(placement: str, n: int = 200, payload_bytes: int = 1_000_000) -> dict[str, float]:
    """Median round trip (ms) of a no-op call and of an ``echo`` of ``payload_bytes`` bytes."""
    payload = os.urandom(payload_bytes)
    with spawn(EchoServer, {}, placement=placement, name=f"bench-{placement}", num_cpus=0) as handle:
        out = {}
        for key, args, reps in (("noop_ms", (), n), ("echo_payload_ms", (payload,), max(n // 10, 5))):
            method = "echo" if args else "noop"
            handle.call(method, *args)  # warm-up
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                handle.call(method, *args)
                times.append((time.perf_counter() - t0) * 1e3)
            out[key] = sorted(times)[len(times) // 2]
    return out


if __name__ == "__main__":
    from mgrpo_algo.distributed.probe import (
        measure_overhead as _measure,  # the importable module, not __main__
    )

    for _placement in PLACEMENTS:
        print(_placement, {k: round(v, 3) for k, v in _measure(_placement).items()}, flush=True)
