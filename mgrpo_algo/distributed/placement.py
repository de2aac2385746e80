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

import contextlib
import pickle
import signal
import threading
import traceback
import warnings
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


#: Every placement: its name (``placement.kind`` of a run, ``spawn``'s ``placement``) and the handle class
#: its role servers live behind. A string is "module:class", imported on first use (the processes and Ray
#: backends import this module for RoleHandle, never the reverse: no import cycle). A new placement is one
#: registered RoleHandle subclass (examples/extend/new_placement.py). "in-process", the former name of
#: the local handle in run configs, is accepted with a deprecation warning.
PLACEMENTS: Registry[Any] = Registry("placement", {
    "local": _LocalRole, "processes": "mgrpo_algo.distributed.placement_processes:_ProcessRole",
    "ray": "mgrpo_algo.distributed.placement_ray:_RayRole",
}, aliases={"in-process": "local"})
