"""The client of the mgrpo OpenEnv server (:mod:`mgrpo_env.openenv_server`): openenv-core's
``EnvClient`` with the mgrpo action, observation and state types.

    from mgrpo_env.openenv_client import MGRPOEnvClient
    from mgrpo_env.openenv_types import AgentAction

    with MGRPOEnvClient("http://127.0.0.1:8000").sync() as env:
        result = env.reset(seed=0)
        while not result.done:
            obs = result.observation          # obs.agent acts next, obs.text is what it reads
            result = env.step(AgentAction(agent=obs.agent, text=my_policy(obs)))
        record = result.observation.record   # the EpisodeRecord as a dict

Each ``reset`` opens a fresh server session (one session per episode), so an episode never shares
server state with another. Failures are typed: :class:`EnvServerError` when the server refuses a
message (its code and text: a malformed action, an agent that may not act now, a step after the
end), :class:`EnvConnectionLost` when the connection drops (a server restart): the episode is lost,
and the next ``reset`` connects again.

Needs the ``openenv`` extra. Never imports torch.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from websockets.exceptions import ConnectionClosed

from .openenv_types import (  # openenv-core's classes, imported there without its web UI
    AgentAction,
    AgentObservation,
    EnvClient,
    EpisodeState,
    StepResult,
)

__all__ = ["MGRPOEnvClient", "EnvServerError", "EnvConnectionLost"]


class EnvServerError(RuntimeError):
    """The server refused a message: ``code`` is openenv-core's (VALIDATION_ERROR for an action that
    is not the schema, EXECUTION_ERROR for one the env refused, CAPACITY_REACHED, ...)."""

    def __init__(self, message: str, code: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(f"the env server refused the message ({code}): {message}")
        self.code = code
        self.server_message = message
        self.details = details or {}


class EnvConnectionLost(ConnectionError):
    """The connection to the server dropped (it stopped or restarted, or the network failed): the
    session and its episode are gone; ``reset()`` connects again and starts a new one."""


class MGRPOEnvClient(EnvClient[AgentAction, AgentObservation, EpisodeState]):
    """openenv-core's async WebSocket client for the mgrpo env server (``.sync()`` for a blocking one).
    Keywords other than those below go to openenv-core's ``EnvClient``.

    Args:
        base_url: the server (``http://127.0.0.1:8000`` or ``ws://...``).
        message_timeout_s: the longest wait for one reply (a step runs tools: a browser render can
            take seconds on a loaded machine).
        connect_timeout_s: the longest wait for the WebSocket handshake. openenv-core's 10 s default
            timed out 91 of 683 handshakes of 16 clients on a host at a load average of 17-25
            (docs/guides/openenv.md); a refused or absent server still fails at once.
    """

    def __init__(self, base_url: str, *, message_timeout_s: float = 120.0, connect_timeout_s: float = 60.0,
                 **kwargs: Any) -> None:
        super().__init__(base_url, message_timeout_s=message_timeout_s, connect_timeout_s=connect_timeout_s, **kwargs)
        self._episodes_in_session = 0

    async def reset(self, **kwargs: Any) -> StepResult[AgentObservation]:
        """Start an episode on a fresh session: ``seed``, ``episode_id``, ``task_id`` as the env takes them."""
        if self._episodes_in_session:
            await self.disconnect()  # the previous episode's session ends with it
            self._episodes_in_session = 0
        result = await super().reset(**kwargs)
        self._episodes_in_session += 1
        return result

    async def disconnect(self) -> None:
        await super().disconnect()
        self._episodes_in_session = 0

    async def _send_and_receive(self, message: dict[str, Any]) -> dict[str, Any]:
        try:
            await self._send(message)
            response = await self._receive()
        except (ConnectionClosed, OSError, asyncio.TimeoutError) as exc:
            # The socket is useless now; forget it so that the next reset() connects afresh.
            ws, self._ws = self._ws, None
            self._episodes_in_session = 0
            if ws is not None:
                with contextlib.suppress(Exception):  # it is broken already; closing is best effort
                    await ws.close()
            what = "did not answer in time" if isinstance(exc, asyncio.TimeoutError) else f"closed the connection ({exc})"
            raise EnvConnectionLost(f"the env server at {self._ws_url} {what}: this session's episode is lost; "
                                    "reset() connects again and starts a new one") from exc
        if response.get("type") == "error":
            data = response.get("data", {})
            message_text = str(data.get("message", "unknown error"))
            if data.get("errors"):
                message_text += f": {data['errors']}"
            raise EnvServerError(message_text, str(data.get("code", "UNKNOWN")), data)
        return response

    def _step_payload(self, action: AgentAction) -> dict[str, Any]:
        return action.model_dump(exclude={"metadata"}) if isinstance(action, AgentAction) else dict(action)

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[AgentObservation]:
        observation = AgentObservation(**payload.get("observation", {}), done=payload.get("done", False),
                                       reward=payload.get("reward"))
        return StepResult(observation=observation, reward=payload.get("reward"), done=payload.get("done", False))

    def _parse_state(self, payload: dict[str, Any]) -> EpisodeState:
        return EpisodeState(**payload)
