"""Push a learner's new weights into a served vLLM engine after each update, over vLLM's documented HTTP API.

Two paths, both documented by vLLM:

1. **LoRA adapters at run time** (:meth:`WeightSync.sync_lora`), from
   https://docs.vllm.ai/en/latest/features/lora/ ("Dynamically serving LoRA Adapters"). Start the
   server with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve BASE --enable-lora
   --max-lora-rank R`` (``--max-loras`` >= number of roles served). After an update the learner
   writes its adapter (``RoleLearner.save_adapter(dir)``), then::

       POST /v1/unload_lora_adapter  {"lora_name": NAME}                      (if loaded before)
       POST /v1/load_lora_adapter    {"lora_name": NAME, "lora_path": DIR}

   vLLM refuses to load a name that is already loaded, hence unload first; a fresh load gets a new
   internal id, so the new weights are read from disk. Rollouts then ask for the adapter by name:
   ``OpenAICompatiblePolicy(base_url, model=NAME, ...)``. Several roles (main, sub) are several
   adapters on one served base model. ``DIR`` must be readable by the server process (same machine or
   shared file system).

2. **Full weights** (:meth:`WeightSync.sync_full`), from
   https://docs.vllm.ai/en/latest/features/sleep_mode/ ("Online Serving", "RLHF weight updates").
   Start the server from the directory the learner writes to, in development mode:
   ``VLLM_SERVER_DEV_MODE=1 vllm serve MODEL_DIR --enable-sleep-mode``. After an update the learner
   overwrites ``MODEL_DIR`` (``save_pretrained``, safetensors; for a LoRA role
   ``mgrpo_algo.learning.lora.merged_state_dict``), then, as the docs' level-2 example::

       POST /sleep?level=2                 discard weights and KV cache (frees the GPU memory)
       POST /wake_up?tags=weights          reallocate the weights only
       POST /collective_rpc  {"method": "reload_weights"}   every worker reloads MODEL_DIR in place
       POST /wake_up?tags=kv_cache         reallocate the KV cache

   ``sleep=False`` skips the sleep / wake-up calls (the reload then runs with the KV cache in place;
   cached prefixes computed with the old weights are dropped with ``POST /reset_prefix_cache``, a
   development endpoint too). The development endpoints must not be exposed to users.

Requests are never sent while a rollout is in flight: in M-GRPO the update of a role and its next
collection alternate, so the trainer syncs between them.

Errors: connection errors, timeouts and HTTP 408/429/5xx are retried ``max_retries`` times with
exponential backoff; other statuses fail at once. Either way :class:`WeightSyncError` says which call
failed, its status and the start of the body, and (for a 404 on a route) how to start the server so
that the route exists.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

__all__ = ["WeightSync", "WeightSyncError", "server_root"]

_RETRY_STATUS = {408, 429, 500, 502, 503, 504}
_LORA_HINT = (
    "start vLLM with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and --enable-lora "
    "(https://docs.vllm.ai/en/latest/features/lora/)"
)
_DEV_HINT = (
    "start vLLM with VLLM_SERVER_DEV_MODE=1 and --enable-sleep-mode "
    "(https://docs.vllm.ai/en/latest/features/sleep_mode/)"
)


class WeightSyncError(RuntimeError):
    """A weight-sync call to the serving engine failed (unreachable, HTTP error, missing endpoint)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def server_root(base_url: str) -> str:
    """``http://h:8000``, ``http://h:8000/v1`` or ``.../v1/completions`` -> ``http://h:8000``."""
    url = base_url.rstrip("/")
    for suffix in ("/completions", "/v1"):
        if url.endswith(suffix):
            url = url[: -len(suffix)]
    return url


class WeightSync:
    """Weight updates for one served vLLM engine (the same ``base_url`` as the rollout policy).

    Args:
        base_url: the server (``http://127.0.0.1:8000`` or ``.../v1``).
        api_key: sent as ``Authorization: Bearer``; default ``$OPENAI_API_KEY`` (none if unset).
        timeout_s: per HTTP request (a full reload of a large model can take a minute).
        max_retries: retries after the first attempt for transient failures.
        backoff_s: first retry delay (doubles each retry, capped at 10 s).
        trust_env: let httpx read proxy settings from the environment.
        transport: an ``httpx`` transport (tests).
        wait_s: keep retrying transient failures for this long (a restarting server).
        engine: the server's supervisor (``ensure_up(problem)``), asked after a connection error or a
            timeout (a launched server that died or hung is restarted from the folder the new weights
            were just written to: the restart is the reload).

    Attributes:
        loaded: adapter name -> path of the adapters this object loaded (``sync_lora``).
        syncs: number of successful syncs (either path).
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 300.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        trust_env: bool = True,
        transport: httpx.BaseTransport | None = None,
        wait_s: float = 0.0,
        engine: Any = None,
    ) -> None:
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.root = server_root(base_url)
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._client = httpx.Client(timeout=timeout_s, headers=headers, transport=transport, trust_env=trust_env)
        self.loaded: dict[str, str] = {}
        self.syncs = 0
        self.wait_s = float(wait_s)
        self.engine = engine

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> WeightSync:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- LoRA ----------------------------------------------------------------------------------

    def sync_lora(self, adapter_dir: str | os.PathLike, name: str) -> str:
        """Serve the adapter in ``adapter_dir`` under ``name`` (replacing a previous one of that name).

        Returns ``name``: the ``model`` field for the rollout policy. ``adapter_dir`` must hold
        ``adapter_config.json`` (checked here, so a wrong path fails before any request).
        """
        path = Path(adapter_dir).resolve()
        if not (path / "adapter_config.json").is_file():
            raise WeightSyncError(f"{path} is not a LoRA adapter directory (no adapter_config.json)")
        self.unload_lora(name, missing_ok=True)
        self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)}, hint=_LORA_HINT)
        self.loaded[name] = str(path)
        self.syncs += 1
        return name

    def unload_lora(self, name: str, *, missing_ok: bool = False) -> bool:
        """Unload adapter ``name``. With ``missing_ok``, a server that does not know the name (HTTP
        400/404 with an error body, vLLM's answer) is not an error; returns whether it was unloaded.
        A 404 for the route itself (runtime LoRA updating disabled) always raises."""
        try:
            self._post("/v1/unload_lora_adapter", {"lora_name": name}, hint=_LORA_HINT)
        except WeightSyncError as exc:
            if missing_ok and exc.status in (400, 404) and not _route_missing(exc):
                self.loaded.pop(name, None)
                return False
            raise
        self.loaded.pop(name, None)
        return True

    # -- full weights --------------------------------------------------------------------------

    def sync_full(self, *, sleep: bool = True) -> None:
        """Make the server reload its model directory from disk (write the new weights there first).

        ``sleep=True``: the documented level-2 sequence (sleep, wake weights, ``reload_weights``,
        wake KV cache), lowest peak GPU memory. ``sleep=False``: ``reload_weights`` then
        ``reset_prefix_cache``. Both need ``VLLM_SERVER_DEV_MODE=1`` (and ``--enable-sleep-mode``
        for ``sleep=True``). If a step after ``/sleep`` fails the engine may be left asleep: the
        error says so; :meth:`wake_up` brings it back.
        """
        if sleep:
            self._post("/sleep", None, params={"level": "2"}, hint=_DEV_HINT)
            try:
                self._post("/wake_up", None, params={"tags": "weights"}, hint=_DEV_HINT)
                self.reload_weights()
                self._post("/wake_up", None, params={"tags": "kv_cache"}, hint=_DEV_HINT)
            except WeightSyncError as exc:
                raise WeightSyncError(
                    f"{exc} - the engine may still be asleep (call wake_up() or restart it)", exc.status
                ) from exc
        else:
            self.reload_weights()
            self._post("/reset_prefix_cache", None, hint=_DEV_HINT)
        self.syncs += 1

    def reload_weights(self) -> Any:
        """``POST /collective_rpc {"method": "reload_weights"}``: each worker reloads the served model
        path in place. Returns the parsed reply (None for an empty body)."""
        return self._post("/collective_rpc", {"method": "reload_weights"}, hint=_DEV_HINT)

    def wake_up(self) -> None:
        """``POST /wake_up`` (all tags)."""
        self._post("/wake_up", None, hint=_DEV_HINT)

    def is_sleeping(self) -> bool:
        """``GET /is_sleeping`` -> ``{"is_sleeping": bool}``."""
        reply = self._request("GET", "/is_sleeping", None, None, _DEV_HINT)
        return bool(reply["is_sleeping"])

    # -- HTTP ----------------------------------------------------------------------------------

    def _post(self, route: str, body: Mapping[str, Any] | None, *, params: Mapping[str, str] | None = None,
              hint: str = "") -> Any:
        return self._request("POST", route, body, params, hint)

    def _request(self, method: str, route: str, body: Mapping[str, Any] | None,
                 params: Mapping[str, str] | None, hint: str) -> Any:
        url = self.root + route
        shown = url + ("?" + "&".join(f"{k}={v}" for k, v in params.items()) if params else "")
        problem, status = "", None
        start, attempt = time.monotonic(), 0
        while attempt <= self.max_retries or time.monotonic() - start < self.wait_s:
            if attempt:
                time.sleep(min(10.0, self.backoff_s * 2 ** (attempt - 1)))
            attempt += 1
            try:
                reply = self._client.request(
                    method, url, params=params, content=None if body is None else json.dumps(body)
                )
            except httpx.HTTPError as exc:
                problem, status = f"{method} {shown}: {type(exc).__name__}: {exc}", None
                if self.engine is not None:
                    self.engine.ensure_up(problem)
                continue
            if reply.status_code == 200:
                try:
                    return reply.json() if reply.content else None
                except ValueError:
                    return reply.text  # vLLM answers the LoRA endpoints with plain text
            status = reply.status_code
            problem = f"{method} {shown}: HTTP {status}: {reply.text[:300]}"
            if status in _RETRY_STATUS:
                continue
            if status == 404 and _body_is_route_missing(reply.text) and hint:
                problem += f" (endpoint missing: {hint})"
            raise WeightSyncError(problem, status)
        raise WeightSyncError(f"{problem} (after {attempt} attempts)", status)


def _body_is_route_missing(text: str) -> bool:
    """FastAPI's reply for an unknown route is exactly ``{"detail": "Not Found"}``."""
    try:
        return json.loads(text) == {"detail": "Not Found"}
    except ValueError:
        return False


def _route_missing(exc: WeightSyncError) -> bool:
    return "endpoint missing" in str(exc)
