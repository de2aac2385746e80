"""The "processes" placement: one ``spawn``-ed child per role server, calls pickled over a ``multiprocessing.Pipe``.

See :mod:`mgrpo_algo.distributed.placement` for the handle contract (what every placement does alike);
this module is imported on the first role placed in "processes" (:data:`~mgrpo_algo.distributed.placement.PLACEMENTS`).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import time
import weakref
from typing import Any

from .placement import (
    RoleCallTimeout,
    RoleHandle,
    RoleServerDied,
    _error_reply,
    _invoke,
    _unwrap,
)

__all__: list[str] = []


def _serve(conn: multiprocessing.connection.Connection, blob: bytes, env: dict[str, str]) -> None:
    """Child process main: build the object, then answer ``(request_id, kind, ...)`` until close/EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the controller's to handle
    os.environ.update(env)  # before the factory's module is imported
    _name_this_process(multiprocessing.current_process().name.removeprefix("mgrpo-role:"))
    try:
        factory, kwargs = pickle.loads(blob)
        obj = factory(**kwargs)
    except Exception as exc:
        _send(conn, (0, _error_reply(exc)))
        return
    if not _send(conn, (0, ("ok", os.getpid()))):
        return
    while True:
        try:
            req_id, kind, *rest = conn.recv()
        except (EOFError, OSError):  # the controller is gone: close like an orderly stop
            _invoke(obj, "close", (), {})
            return
        if kind == "close":
            _send(conn, (req_id, _invoke(obj, "close", (), {})))
            return
        if not _send(conn, (req_id, _invoke(obj, *rest))):
            return


def _name_this_process(name: str) -> None:
    """The kernel's name of this process (``/proc/PID/comm``; what ``ps -o comm``, ``top`` and
    ``pkill`` show): the role server's name, e.g. ``mgrpo-main``, instead of ``python``, so an operator
    can tell the role servers apart (their command lines are all multiprocessing's). Linux only;
    the kernel keeps 15 bytes."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)  # 15: PR_SET_NAME


def _send(conn: multiprocessing.connection.Connection, message: tuple) -> bool:
    try:
        conn.send(message)  # pickles fully before writing: an unpicklable result never half-writes
    except (BrokenPipeError, EOFError, ConnectionError):
        return False
    except Exception as exc:
        return _send(conn, (message[0], _error_reply(exc)))
    return True


class _ProcessRole(RoleHandle):
    placement = "processes"
    _live: weakref.WeakSet = weakref.WeakSet()  # closed at interpreter exit

    def __init__(self, factory, kwargs, **kw) -> None:
        super().__init__(factory, kwargs, **kw)
        try:
            self._blob = pickle.dumps((factory, kwargs))
        except Exception as exc:
            raise TypeError(f"role {self.name!r}: the factory (an importable top-level class or function) "
                            f"and its kwargs must pickle: {exc}") from exc
        self._proc = self._conn = None
        self._next_id, self._broken = 1, False

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def _start(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        conn, child_conn = ctx.Pipe()
        proc = ctx.Process(target=_serve, args=(child_conn, self._blob, self.env),
                           name=f"mgrpo-role:{self.name}")
        proc.start()
        child_conn.close()  # the child's end lives only in the child: its death is EOF here
        if self._conn is not None:  # a restart: the old child is dead and no call waits on its pipe
            self._conn.close()
        self._proc, self._conn, self._next_id, self._broken = proc, conn, 1, False
        _ProcessRole._live.add(self)
        try:
            reply = self._wait(0, time.monotonic() + self.start_timeout_s, "start")
        except BaseException:
            self._kill()
            raise
        if reply[0] == "err":
            self._kill()
        _unwrap(self.name, "__init__", reply)

    def _call(self, method, args, kwargs, timeout_s):
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        if not self._lock.acquire(timeout=-1 if timeout_s is None else max(timeout_s, 0)):
            raise RoleCallTimeout(f"role server {self.name!r}: {method}() queued {timeout_s} s behind a call")
        try:
            req_id = self._request("call", method, args, kwargs)
            reply = self._wait(req_id, deadline, method)
        finally:
            self._lock.release()
        return _unwrap(self.name, method, reply)

    def _request(self, kind: str, *payload: Any) -> int:
        if self._proc is None or self._broken or not self._proc.is_alive():
            raise self._died()
        req_id, self._next_id = self._next_id, self._next_id + 1
        try:
            self._conn.send((req_id, kind, *payload))  # an unpicklable argument raises here, nothing sent
        except (BrokenPipeError, EOFError, ConnectionError) as exc:
            raise self._died() from exc
        return req_id

    def _wait(self, req_id: int, deadline: float | None, what: str) -> tuple:
        """The reply to ``req_id``, waking on the reply, the child's exit or the deadline."""
        conn, proc = self._conn, self._proc
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise RoleCallTimeout(f"role server {self.name!r}: {what} took longer than its timeout")
            try:
                ready = multiprocessing.connection.wait([conn, proc.sentinel], timeout=remaining)
            except (OSError, ValueError) as exc:  # closed under us by close() after its timeout
                raise self._died() from exc
            if conn in ready:
                try:
                    got_id, reply = conn.recv()
                except (EOFError, OSError) as exc:
                    raise self._died() from exc
                except BaseException:  # a torn read: the channel is out of sync, the server unusable
                    self._kill()
                    raise
                if got_id == req_id:
                    return reply
                # else: the late reply of a call that timed out; keep waiting for ours
            elif ready:  # the child exited and its pipe end is still open elsewhere (a grandchild)
                raise self._died()

    def _died(self) -> RoleServerDied:
        self._broken = True
        proc = self._proc
        if proc is None:
            return RoleServerDied(self.name, None, "not running")
        proc.join(timeout=1.0)
        if proc.exitcode is None:  # pipe broken but still running: it is no use any more
            proc.kill()
            proc.join(timeout=5.0)
        return RoleServerDied(self.name, proc.exitcode)

    def _alive(self) -> bool:
        return self._proc is not None and not self._broken and self._proc.is_alive()

    def _kill(self) -> None:
        proc, self._broken = self._proc, True
        if proc is not None:
            if proc.exitcode is None:
                proc.kill()
            proc.join(timeout=5.0)

    def _close(self, timeout_s):
        proc, reply = self._proc, None
        if proc is None:
            return None
        deadline = time.monotonic() + timeout_s
        if self._lock.acquire(timeout=timeout_s):
            try:
                if self._alive():
                    reply = self._wait(self._request("close"), deadline, "close")
                    proc.join(timeout=max(deadline - time.monotonic(), 0.1))
            except (RoleServerDied, RoleCallTimeout):
                pass
            finally:
                self._lock.release()
        self._kill()
        self._conn.close()
        _ProcessRole._live.discard(self)
        return reply


@atexit.register
def _close_processes_at_exit() -> None:
    # Runs before multiprocessing's own exit hook (registered earlier, atexit is LIFO), which would
    # otherwise join children still waiting for requests.
    for handle in list(_ProcessRole._live):
        with contextlib.suppress(Exception):
            handle.close(timeout_s=5.0)
