"""The Ray placement of role servers: each role a Ray actor with its own resources.

See :mod:`mgrpo_algo.distributed.placement` for the handle contract; this module is imported only when
``placement="ray"`` is used.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

__all__ = ["_RayRole"]

from .placement import RemoteError, RoleCallTimeout, RoleHandle, RoleServerDied, _invoke, _unwrap


class _RayRoleActor:
    """The Ray actor: builds the object; errors come back as replies, never as Ray task errors."""

    def __init__(self, factory: Callable[..., Any], kwargs: dict[str, Any]) -> None:
        self._reply = _invoke(factory, "__call__", (), kwargs)
        self._obj = self._reply[1] if self._reply[0] == "ok" else None

    def ready(self) -> tuple:
        return ("ok", os.getpid()) if self._reply[0] == "ok" else self._reply

    def call(self, method: str, args: tuple, kwargs: dict) -> tuple:
        return _invoke(self._obj, method, args, kwargs)


_RAY_ACTOR = None


def _ray():
    """The ``ray`` module, initialised (see the module docstring for the address)."""
    global _RAY_ACTOR
    import ray

    if not ray.is_initialized():
        address = os.environ.get("MGRPO_RAY_ADDRESS") or os.environ.get("RAY_ADDRESS")
        if address:
            ray.init(address=address)
        else:
            ray.init(include_dashboard=False)
    if _RAY_ACTOR is None:
        _RAY_ACTOR = ray.remote(_RayRoleActor)
    return ray


class _RayRole(RoleHandle):
    placement = "ray"

    def __init__(self, factory, kwargs, **kw) -> None:
        super().__init__(factory, kwargs, **kw)
        self._actor, self._pid, self._dead = None, None, True

    @property
    def pid(self) -> int | None:
        return self._pid

    def _start(self) -> None:
        ray = _ray()
        from ray.exceptions import GetTimeoutError, RayActorError

        options = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus, **self.ray_options}
        if self.env:
            runtime_env = dict(options.get("runtime_env") or {})
            runtime_env["env_vars"] = {**runtime_env.get("env_vars", {}), **self.env}
            options["runtime_env"] = runtime_env
        self._actor = _RAY_ACTOR.options(**options).remote(self.factory, self.kwargs)
        self._dead = False
        try:
            reply = ray.get(self._actor.ready.remote(), timeout=self.start_timeout_s)
        except GetTimeoutError:
            self._kill()
            raise RoleCallTimeout(
                f"role server {self.name!r} did not start within {self.start_timeout_s} s; the cluster may "
                f"lack its resources (num_cpus={self.num_cpus}, num_gpus={self.num_gpus}, "
                f"ray_options={self.ray_options}); "
                f"available: {ray.available_resources()}") from None
        except RayActorError as exc:
            self._kill()
            raise RoleServerDied(self.name, None, f"during start: {exc}") from exc
        if reply[0] == "err":
            self._kill()
        self._pid = _unwrap(self.name, "__init__", reply)

    def _call(self, method, args, kwargs, timeout_s):
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

        if self._dead or not ray.is_initialized():
            raise RoleServerDied(self.name, None, "actor killed" if self._dead else "Ray was shut down")
        try:
            reply = ray.get(self._actor.call.remote(method, args, kwargs), timeout=timeout_s)
        except GetTimeoutError:
            raise RoleCallTimeout(f"role server {self.name!r}: {method}() took over {timeout_s} s") from None
        except RayActorError as exc:
            self._dead = True
            raise RoleServerDied(self.name, None, type(exc).__name__) from exc
        except RayTaskError as exc:  # e.g. the result did not serialise
            cause = exc.cause if isinstance(exc.cause, BaseException) else None
            name = type(cause).__name__ if cause is not None else type(exc).__name__
            raise RemoteError(self.name, method, name, str(cause or exc), exc.traceback_str) from cause
        return _unwrap(self.name, method, reply)

    def _alive(self) -> bool:
        import ray

        if self._dead or self._actor is None or not ray.is_initialized():
            return False
        try:  # the GCS's view; a busy actor is alive (a ping would queue behind its call)
            from ray._private.state import actors

            return actors(actor_id=self._actor._actor_id.hex())["State"] not in ("DEAD",)
        except Exception:
            return True

    def _kill(self) -> None:
        import ray

        actor, self._dead = self._actor, True
        if actor is not None and ray.is_initialized():
            ray.kill(actor, no_restart=True)

    def _close(self, timeout_s):
        import ray

        reply = None
        if not self._dead and ray.is_initialized():
            try:
                reply = ray.get(self._actor.call.remote("close", (), {}), timeout=timeout_s)
                # a graceful exit (atexit hooks run; GPU memory released) after the queued close
                ray.wait([self._actor.__ray_terminate__.remote()], timeout=min(timeout_s, 10.0))
            except Exception:
                reply = None
        self._kill()
        return reply


# -- overhead measurement ---------------------------------------------------------------------------
