"""Placement of role servers: the same class in the controller's process, in its own process, or on Ray.

In the decoupled pipeline each role (main agent, sub-agent) runs on its own server: an object that holds
the role's policy and learner. The controller builds it with :func:`spawn` and talks to it through a
:class:`RoleHandle`, whatever the placement::

    with spawn(RoleWorker, {"role": "main", ...}, placement="processes", name="mgrpo-main") as main:
        status = main.call("status")                          # synchronous
        fut_m = main.submit("update", t, main_batch)   # concurrent.futures.Future
        fut_s = sub.submit("update", t, sub_batch)     # ... two roles at once
        metrics = {**fut_m.result(), **fut_s.result()}

- "local": the object lives in the controller's process; arguments and results are passed by
  reference (no copy); ``pid`` is None; resources are ignored.
- "processes": one ``spawn``-ed child per role, arguments and results pickled over a
  ``multiprocessing.Pipe``; ``pid`` is the child's; resources are ignored.
- "ray": one Ray actor per role reserving ``num_cpus`` / ``num_gpus`` (plus ``ray_options``), so roles
  land on different machines of a cluster; ``pid`` is the worker's, on its node.

Round trip measured on a 2-core CPU box (``python -m mgrpo_algo.distributed.placement``, median): a no-op call
costs ~1 us local, 0.04-0.07 ms processes, 0.8-0.9 ms Ray; a 1 MB bytes argument echoed back (1 MB each
way) 2.6-2.9 ms processes, 6-7 ms Ray: negligible next to a generation or an update.

Semantics, identical in all placements unless noted:

- Calls to one handle run one at a time, in order (a lock per handle; a Ray actor runs its tasks in
  order), so the object need not be thread-safe; calls to different handles run in parallel.
  ``submit`` runs the call on the handle's own one-thread pool. Only public methods can be called
  (a name starting with ``_`` raises ValueError). ``timeout_s`` is reserved by ``call``.
- An exception raised by the object becomes :class:`RemoteError` (``type_name``, ``message``,
  ``remote_traceback``); its ``__cause__`` is the original exception when it could be sent back
  (always in "local"). The handle stays usable. An exception in the constructor is raised by ``spawn``
  (method ``"__init__"``).
- A server that is gone (SIGKILL, crash, OOM kill, ``kill()``, ``close()``) raises
  :class:`RoleServerDied` (``name``, ``exitcode``: ``-9`` for SIGKILL, None on Ray and "local")
  promptly, also for a call already in flight: the processes placement waits on the pipe and the
  process sentinel together, it never polls blindly or hangs.
- ``call(..., timeout_s=t)`` raises :class:`RoleCallTimeout` (a TimeoutError) after t seconds. The call
  is not cancelled (as with ``ray.get(timeout=)``): the server finishes it, later calls queue behind it
  and its late reply is discarded. Use ``restart()`` to get rid of a hung server. "local" ignores
  ``timeout_s`` (a direct call cannot be interrupted).
- ``kill()`` is the fault injector: SIGKILL for "processes", ``ray.kill`` for "ray"; "local" marks the
  handle dead (the object is dropped without ``close()``; a call in flight still finishes).
- ``restart()`` starts a fresh instance from the same factory and kwargs (the old one, if still there,
  is killed first: restart is the fault path, call ``close()`` first for a graceful one). Restoring
  state (e.g. from a checkpoint) is the object's own job in its constructor.
- ``close()`` calls the object's ``close()`` if it has one, then ends the process / actor (killing it
  if it does not end within ``timeout_s``) and re-raises a failure of the object's ``close()`` as
  RemoteError. Calls queued by ``submit`` and not yet started are cancelled. Idempotent; a closed
  handle can be ``restart()``-ed. Processes still open at interpreter exit are closed (5 s each).
- ``env``: environment variables for the server, set in the child before the factory is unpickled and
  called ("processes"), through ``runtime_env={"env_vars": ...}`` ("ray"); "local" cannot set them
  without changing the controller's own environment, so it warns and ignores them.

Ray: if Ray is not initialised, ``spawn`` calls ``ray.init(address=...)`` with ``MGRPO_RAY_ADDRESS`` (or
Ray's own ``RAY_ADDRESS``) when set, else ``ray.init(include_dashboard=False)``, which starts a local
cluster with the detected resources; call ``ray.init`` yourself for anything else. The factory must be
importable on every node (install the project there). A role that needs more than ``num_cpus`` and
``num_gpus`` (custom resources, a placement group, node affinity) passes ``ray_options``, merged into
``.options()``. A request the cluster cannot satisfy shows as a start timeout naming the resources.

The factory must be an importable top-level class or function (it is pickled by reference);
:mod:`mgrpo_algo.distributed.probe` has a small one to check a placement or a cluster and to measure
its call overhead (``python -m mgrpo_algo.distributed.probe``).
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
import threading
import time
import traceback
import warnings
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from mgrpo_tools.registry import Registry

__all__ = ["PLACEMENTS", "RemoteError", "RoleCallTimeout", "RoleHandle", "RoleServerDied", "spawn"]

_CLOSE_TIMEOUT_S = 30.0


class RemoteError(RuntimeError):
    """The role server's object raised ``type_name`` (``"ValueError"``, ``"torch.OutOfMemoryError"``)."""

    def __init__(self, name: str, method: str, type_name: str, message: str, remote_traceback: str) -> None:
        super().__init__(f"role server {name!r}: {method}() raised {type_name}: {message}\n\n"
                         f"Remote traceback:\n{remote_traceback}")
        self.name, self.method, self.type_name = name, method, type_name
        self.message, self.remote_traceback = message, remote_traceback

    def __reduce__(self):
        return type(self), (self.name, self.method, self.type_name, self.message, self.remote_traceback)


class RoleServerDied(RuntimeError):
    """The role server ``name`` is gone; ``exitcode`` is the process's (``-9``: SIGKILL) or None."""

    def __init__(self, name: str, exitcode: int | None = None, detail: str = "") -> None:
        how = f"exit code {exitcode}" if exitcode is not None else "no exit code"
        if exitcode is not None and exitcode < 0:
            with contextlib.suppress(ValueError):
                how += f", {signal.Signals(-exitcode).name}"
        super().__init__(f"role server {name!r} died ({how})" + (f": {detail}" if detail else ""))
        self.name, self.exitcode, self.detail = name, exitcode, detail

    def __reduce__(self):
        return type(self), (self.name, self.exitcode, self.detail)


class RoleCallTimeout(TimeoutError):
    """A call (or the server's start) took longer than its timeout; the server may still be running."""


def spawn(
    factory: type | Callable[..., Any],
    kwargs: Mapping[str, Any],
    *,
    placement: str,
    name: str,
    num_cpus: float = 1,
    num_gpus: float = 0,
    env: Mapping[str, str] | None = None,
    start_timeout_s: float = 120,
    ray_options: Mapping[str, Any] | None = None,
) -> RoleHandle:
    """Build ``factory(**kwargs)`` in ``placement`` and return its handle once it is up.

    Args:
        factory: an importable top-level class or function returning the role server object.
        kwargs: its keyword arguments (pickled for "processes" and "ray").
        placement: a name in ``PLACEMENTS``.
        name: the role's name, in errors and process titles (e.g. "mgrpo-main").
        num_cpus, num_gpus: resources reserved for the actor ("ray" only; fractions allowed).
        env: environment variables for the server (see the module docstring).
        start_timeout_s: how long the constructor may take (it may load a model); RoleCallTimeout after.
        ray_options: extra ``.options()`` for the Ray actor (resources, scheduling_strategy, ...).
    """
    cls = PLACEMENTS.get(placement)  # an unknown name raises, listing the valid ones
    if not callable(factory):
        raise TypeError(f"factory must be a class or function, got {factory!r}")
    if num_cpus < 0 or num_gpus < 0 or not start_timeout_s > 0:
        raise ValueError(f"need num_cpus >= 0, num_gpus >= 0, start_timeout_s > 0; got {num_cpus}, "
                         f"{num_gpus}, {start_timeout_s}")
    handle = cls(factory, dict(kwargs), name=name, num_cpus=num_cpus, num_gpus=num_gpus, env=dict(env or {}),
                 start_timeout_s=start_timeout_s, ray_options=dict(ray_options or {}))
    handle._start()
    return handle


class RoleHandle(ABC):
    """The controller's handle on one role server; see the module docstring for the semantics."""

    placement = ""

    def __init__(self, factory, kwargs, *, name, num_cpus, num_gpus, env, start_timeout_s, ray_options):
        self.factory, self.kwargs, self.name = factory, kwargs, name
        self.num_cpus, self.num_gpus, self.env = num_cpus, num_gpus, env
        self.start_timeout_s, self.ray_options = start_timeout_s, ray_options
        self._lock = threading.Lock()  # one call at a time
        self._life = threading.Lock()  # one start / restart / close at a time
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False

    # -- public API -------------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The server's process id (on its own node for "ray"); None for "local"."""
        return None

    def call(self, method: str, *args: Any, timeout_s: float | None = None, **kwargs: Any) -> Any:
        """``object.method(*args, **kwargs)`` on the server; waits for the result."""
        if not isinstance(method, str) or not method or method.startswith("_"):
            raise ValueError(f"only public methods can be called on a role server, got {method!r}")
        if self._closed:
            raise RoleServerDied(self.name, None, "the handle was closed")
        return self._call(method, args, kwargs, timeout_s)

    def submit(self, method: str, *args: Any, **kwargs: Any) -> Future:
        """``call`` on the handle's own thread (FIFO); the Future raises what ``call`` would."""
        if self._pool is None:
            with self._life:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"role-{self.name}")
        return self._pool.submit(self.call, method, *args, **kwargs)

    def alive(self) -> bool:
        """True while the server can take calls."""
        return not self._closed and self._alive()

    def kill(self) -> None:
        """Kill the server without a graceful close (fault injection); later calls raise RoleServerDied."""
        self._kill()

    def restart(self) -> None:
        """Replace the server by a fresh instance from the same factory and kwargs (old one killed)."""
        with self._life:
            self._kill()
            with self._lock:
                self._start()
            self._closed = False

    def close(self, timeout_s: float = _CLOSE_TIMEOUT_S) -> None:
        """Call the object's ``close()`` if it has one, then end the server; idempotent."""
        with self._life:
            if self._closed:
                return
            self._closed = True
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = None
            reply = self._close(timeout_s)
        if reply is not None:
            _unwrap(self.name, "close", reply)

    def __enter__(self) -> RoleHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("alive" if self._alive() else "dead")
        return f"<RoleHandle {self.name!r} placement={self.placement} pid={self.pid} {state}>"

    # -- backend hooks ----------------------------------------------------------------------------

    @abstractmethod
    def _start(self) -> None:
        ...

    @abstractmethod
    def _call(self, method: str, args: tuple, kwargs: dict, timeout_s: float | None) -> Any:
        ...

    @abstractmethod
    def _alive(self) -> bool:
        ...

    @abstractmethod
    def _kill(self) -> None:
        ...

    @abstractmethod
    def _close(self, timeout_s: float) -> tuple | None:
        """End the server; return the reply of the object's close() (None if it could not be asked)."""


# -- what runs next to the object (child process, Ray actor, or in-process) --------------------------


def _error_reply(exc: BaseException, pickled: bool = True) -> tuple:
    cls = type(exc)
    type_name = cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    blob = None
    with contextlib.suppress(Exception):
        blob = pickle.dumps(exc) if pickled else None
    tb = "".join(traceback.format_exception(cls, exc, exc.__traceback__))
    return ("err", type_name, str(exc), tb, blob)


def _invoke(obj: Any, method: str, args: tuple, kwargs: dict) -> tuple:
    """Run one call; ``("ok", result)`` or ``("err", type_name, message, traceback, pickled exc)``."""
    try:
        if method == "close" and not hasattr(obj, "close"):
            return ("ok", None)
        return ("ok", getattr(obj, method)(*args, **kwargs))
    except Exception as exc:
        return _error_reply(exc)


def _unwrap(name: str, method: str, reply: tuple) -> Any:
    if reply[0] == "ok":
        return reply[1]
    _, type_name, message, tb, blob = reply
    cause = None
    if blob is not None:
        try:
            cause = pickle.loads(blob)
        except Exception:
            cause = None
    raise RemoteError(name, method, type_name, message, tb) from cause


# -- local ------------------------------------------------------------------------------------------


class _LocalRole(RoleHandle):
    placement = "local"

    def _start(self) -> None:
        if self.env:
            warnings.warn(f"role {self.name!r}: env is ignored in the 'local' placement (the object shares "
                          "the controller's environment)", stacklevel=3)
        self._obj, self._dead = None, True
        try:
            self._obj = self.factory(**self.kwargs)
        except Exception as exc:
            raise self._error("__init__", exc) from exc
        self._dead = False

    def _error(self, method: str, exc: Exception) -> RemoteError:
        """The RemoteError whose cause is the original exception (not a pickled copy)."""
        _, type_name, message, tb, _ = _error_reply(exc, pickled=False)
        return RemoteError(self.name, method, type_name, message, tb)

    def _call(self, method, args, kwargs, timeout_s):
        with self._lock:
            if self._dead:
                raise RoleServerDied(self.name, None, "killed")
            try:
                return getattr(self._obj, method)(*args, **kwargs)
            except Exception as exc:
                raise self._error(method, exc) from exc

    def _alive(self) -> bool:
        return not self._dead

    def _kill(self) -> None:
        self._obj, self._dead = None, True

    def _close(self, timeout_s):
        if self._dead:
            return None
        with self._lock:
            reply = _invoke(self._obj, "close", (), {})
            self._obj, self._dead = None, True
        return reply


# -- processes --------------------------------------------------------------------------------------


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


#: Every placement: its name (``placement.kind`` of a run, ``spawn``'s ``placement``) and the handle class
#: its role servers live behind. A string is "module:class", imported on first use (the Ray backend
#: imports this module for RoleHandle, never the reverse: no import cycle). A new placement is one
#: registered RoleHandle subclass (examples/extend/new_placement.py). "in-process", the former name of
#: the local handle in run configs, is accepted with a deprecation warning.
PLACEMENTS: Registry[Any] = Registry("placement", {
    "local": _LocalRole, "processes": _ProcessRole, "ray": "mgrpo_algo.distributed.placement_ray:_RayRole",
}, aliases={"in-process": "local"})
