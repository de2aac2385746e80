"""The typed messages of the mgrpo OpenEnv server (:mod:`mgrpo_env.openenv_server`) and its client
(:mod:`mgrpo_env.openenv_client`): openenv-core's ``Action`` / ``Observation`` / ``State`` models.

One action is one turn of one agent: who acts (``main_0``, ``sub_<n>``, ``single_0``) and its text,
as the in-process envs take it (docs/design.md, agent protocol). The server refuses an action whose
agent is not the one selected: the AEC order is the server's, never the client's guess.

Needs the ``openenv`` extra (``pip install 'mgrpo[openenv]'``). Never imports torch.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from pydantic import Field


def _import_openenv_core() -> None:
    """Import openenv-core without its optional Gradio web UI (``/web``, off unless
    ENABLE_WEB_INTERFACE is set; this server never turns it on): importing Gradio is two thirds of
    importing openenv-core (8 of 12 s measured), paid by every server and client process. openenv-core
    imports the UI under ``except ModuleNotFoundError``; a None entry in sys.modules makes that import
    fail at once, and is removed afterwards so that a later ``import gradio`` works as usual."""
    if "openenv.core.env_server" in sys.modules or "gradio" in sys.modules:
        return
    sys.modules["gradio"] = None  # type: ignore[assignment]
    try:
        import openenv.core.env_server  # noqa: F401
    finally:
        if sys.modules.get("gradio", 0) is None:
            del sys.modules["gradio"]


_import_openenv_core()

# openenv-core's names that the server and the client use, imported here once (after the line above)
from openenv.core.client_types import StepResult  # noqa: E402
from openenv.core.env_client import EnvClient  # noqa: E402
from openenv.core.env_server.http_server import HTTPEnvServer  # noqa: E402
from openenv.core.env_server.interfaces import Environment  # noqa: E402
from openenv.core.env_server.types import (  # noqa: E402
    Action,
    ConcurrencyConfig,
    EnvironmentMetadata,
    Observation,
    State,
)

__all__ = ["AgentAction", "AgentObservation", "EpisodeState", "SINGLE_AGENT", "PUBLIC_TASK_FIELDS", "public_task",
           "Environment", "EnvClient", "HTTPEnvServer", "ConcurrencyConfig", "EnvironmentMetadata", "StepResult"]

#: The single-agent env's one agent, as its episode records name it.
SINGLE_AGENT = "single_0"

#: The task's fields a client may read while the episode runs: what the main agent is asked and the
#: task's labels. The rest (``answer``, ``aliases``, ``hops``, ``metadata``: GAIA's holds the
#: annotators' solution steps) are the reward's references, kept on the server until the end.
PUBLIC_TASK_FIELDS = ("id", "question", "split", "kind")


def public_task(task: Mapping[str, Any]) -> dict[str, Any]:
    """``task`` (``Task.to_dict()``) without the reward's references: :data:`PUBLIC_TASK_FIELDS` only."""
    return {name: task[name] for name in PUBLIC_TASK_FIELDS if name in task}


class AgentAction(Action):
    """One turn: the acting agent and its text (``<think>...</think>`` then a tool call, an answer or a
    result). Malformed text is not refused: it is a format failure the agent reads, as in process."""

    agent: str = Field(min_length=1, description="the acting agent: main_0, sub_<n> or single_0")
    text: str = Field(description="the agent's text for this turn")


class AgentObservation(Observation):
    """What the env says after a reset or a step.

    ``reward`` is the main agent's (the single agent's) reward, paid at the end, 0 before; ``rewards``
    holds every agent's as PettingZoo pays them. ``done`` is ``terminated or truncated``.
    """

    agent: str | None = Field(default=None, description="the agent to act next; None once the episode ended")
    text: str = Field(default="", description="that agent's observation (the question, a subtask or a tool response)")
    messages: list[dict[str, str]] = Field(default_factory=list,
                                           description="that agent's whole chat, system prompt first (for a chat template)")
    agents: list[str] = Field(default_factory=list, description="the episode's agents so far, in the order they started")
    rewards: dict[str, float] = Field(default_factory=dict, description="each agent's reward (paid at the end)")
    reward_components: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="each agent's reward parts at the end (format_ok, correct, expert, ...)")
    terminated: bool = Field(default=False, description="the episode ended with an answer")
    truncated: bool = Field(default=False, description="the episode ended at a turn limit")
    record: dict[str, Any] | None = Field(default=None,
                                          description="the EpisodeRecord (EpisodeRecord.to_dict()) once the episode ended")


class EpisodeState(State):
    """The session's episode: which env, which task, who acts (``state()``).

    ``task`` while the episode runs is what the agents may see (:func:`public_task`: its id, question,
    split and kind); once the episode is over it is the whole task (``Task.to_dict()``: the gold
    answer, aliases, hops and metadata), as the final record's is. A server started with
    ``--reveal-answers`` (evaluation tools, scripted oracles) shows the whole task throughout;
    ``answers_shown`` says which one a client got."""

    env: str = Field(default="", description="'hierarchy' or 'single'")
    scenario: str = Field(default="", description="the scenario's name")
    split: str = Field(default="", description="the split tasks are drawn from")
    task: dict[str, Any] | None = Field(
        default=None, description="the current task: id, question, split, kind while the episode runs; "
                                  "the whole Task.to_dict() (answer, aliases, hops, metadata) once it is over "
                                  "or on a server started with --reveal-answers")
    answers_shown: bool = Field(default=False, description="task holds the gold answer, aliases, hops and metadata")
    agent: str | None = Field(default=None, description="the agent to act next; None when there is no episode or it ended")
    done: bool = Field(default=False, description="the current episode ended")
