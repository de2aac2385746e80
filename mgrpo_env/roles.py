"""The one table of agent roles: each role's spec, read by everything that acts on a role.

A role is one :class:`RoleSpec`: the env it acts in, its prompt and final tag, its default tools,
the main-agent tool that calls it and its turn budget, its reward, and the offsets of its seeds. The
episode core (who calls whom, each agent's tools and limit, the pay), the prompts, the action
spaces, the protocol's tool sets, the role workers (a called role scores and aligns its own side by
its reward, ``mgrpo_algo.training.roles``), the config's role table and seeding read it from here,
so a new role is one :func:`register_role` call and no package edit
(``examples/extend/new_role.py``). :data:`ROLES` lists the built-in roles; their order is part of
the contract: the tiny model of role ``i`` is seeded with ``model_seed + i``
(``mgrpo_algo.policies.models``), so an entry is appended, never inserted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from mgrpo_tools.registry import Registry

from .rewards import paid_sub_reward

__all__ = ["ROLE_TABLE", "ROLES", "RoleSpec", "called_roles", "check_role", "env_roles", "register_role",
           "unregister_role"]


@dataclass(frozen=True)
class RoleSpec:
    """One role (see the module docstring)."""

    env: str
    """The env it acts in (a name of ``mgrpo_env.episode_core.KINDS``)."""
    final_tag: str
    """The tag of the action that ends its part (``prompts.FINAL_TAGS``, the parser and the episode core)."""
    sample_seed: int
    """Offset of its training policy's sampling seed: roles of one env draw apart (main and single
    share 0: they never act in one run)."""
    eval_seed: int
    """Offset of its evaluation policy's sampling seed."""
    intro: str = ""
    """The first paragraph of its full system prompt (``prompts.system_prompt``)."""
    compact_intro: str = ""
    """Its compact prompt's opening words."""
    final_text: str = ""
    """The final action as its full prompt shows it (``<tag>what to write</tag>``)."""
    tools: tuple[str, ...] = ()
    """Its default tool names (``protocol.DEFAULT_ROLE_TOOLS``; a scenario or the run may choose others)."""
    called_by: str = ""
    """The root agent's tool that starts an agent of this role ("delegate" for the sub-agents; "": it is
    not called). Its arguments are ``task`` and optional ``context``; the agent's report comes back as
    the tool response. A called role is paid R_S (``reward``) and its worker scores and aligns its own
    side from the main statistics."""
    call_tool: Any = None
    """The spec the root agent is shown for ``called_by`` (a ``protocol.ToolSpec``), when that tool is
    not one of the protocol's own (``delegate`` is)."""
    takes: Callable[[int, Mapping[str, Any]], bool] | None = None
    """Which calls of ``called_by`` start this role, when several roles share the tool: ``takes(n,
    arguments)`` for the episode's n-th call (from 0). A role with a rule is asked before the one
    without, which takes the rest."""
    max_turns: int | None = None
    """Its turn budget as a called agent (None: ``Limits.max_sub_turns``)."""
    reward: Callable[..., float] = paid_sub_reward
    """A called role's pay: ``reward(format_ok, main_correct, expert, weights, format_gate=)``, paid by
    the env and recomputed by the role's worker from the store's statistics (the same function)."""
    start_model: Callable[[Mapping[str, str], str], str] | None = None
    """How a registered role brings its own start model when the run config names none
    (``roles.<name>.model`` empty): ``start_model(built, folder) -> path``, ``built`` the start models of the
    built-in roles the run uses (role -> folder, built and warm-started as usual), ``folder`` one of its own
    under ``models_dir`` to write into. None: the config must name its model. The built-in roles' tiny
    models are built by the trainer (``mgrpo_algo.policies.models``)."""


#: Every role, in order (see the module docstring): a :class:`~mgrpo_tools.registry.Registry` like the
#: project's other name tables (an unknown role is refused naming the valid ones).
ROLE_TABLE: Registry[RoleSpec] = Registry("role", {
    "main": RoleSpec(
        env="hierarchy", final_tag="answer", sample_seed=0, eval_seed=0,
        intro=("You are the main agent of a research team. Plan, delegate subtasks to sub-agents with the "
               "delegate tool, combine their reports, and give the final answer."),
        compact_intro="Main agent.", final_text="<answer>the final answer, short</answer>",
        tools=("delegate", "reason")),
    "sub": RoleSpec(
        env="hierarchy", final_tag="result", sample_seed=1, eval_seed=1,
        intro=("You are a sub-agent of a research team. Carry out the subtask you were given with the web "
               "tools, then report what you found to the main agent."),
        compact_intro="Sub-agent.", final_text="<result>your report: the facts found, with their sources</result>",
        tools=("search", "visit", "click"), called_by="delegate"),
    "single": RoleSpec(
        env="single", final_tag="answer", sample_seed=0, eval_seed=2,
        intro="You are a research agent. Answer the question with the web tools.",
        compact_intro="Research agent.", final_text="<answer>the final answer, short</answer>",
        tools=("search", "visit", "click")),
})


#: The built-in roles, in order (a registered role is in :data:`ROLE_TABLE` only).
ROLES: tuple[str, ...] = tuple(ROLE_TABLE)


def check_role(role: str) -> str:
    """``role`` if it is a role of :data:`ROLE_TABLE`, else ValueError listing them."""
    if role not in ROLE_TABLE:
        raise ValueError(f"role must be one of {tuple(ROLE_TABLE)}, got {role!r}")
    return role


def env_roles(env: str) -> tuple[str, ...]:
    """The roles that act in ``env`` ("hierarchy": main, sub and any registered; "single": single), in table order."""
    return tuple(name for name, spec in ROLE_TABLE.items() if spec.env == env)


def called_roles(roles: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The roles among ``roles`` that a root agent calls (their ``called_by`` is set), in order."""
    return tuple(role for role in roles if ROLE_TABLE[role].called_by)


def register_role(name: str, spec: RoleSpec) -> RoleSpec:
    """Add a role (before the config loads and the envs are built). Its name must be new, its env one
    with a root agent, and, called by a tool that is not the protocol's own, its ``call_tool`` given.
    The role's model, generation and learner come from the run config's ``roles:`` table
    (``mgrpo_algo.core.config``); a training mode lists it among its roles."""
    if name in ROLE_TABLE or not name.isidentifier():
        raise ValueError(f"a new role needs a new identifier name; got {name!r} (roles: {tuple(ROLE_TABLE)})")
    if spec.final_tag not in ("answer", "result"):  # the protocol's two final actions (``protocol.parse_action``)
        raise ValueError(f"role {name!r}: final_tag must be 'answer' or 'result', got {spec.final_tag!r}")
    if spec.called_by and spec.called_by != "delegate" and getattr(spec.call_tool, "name", None) != spec.called_by:
        raise ValueError(f"role {name!r} is called by {spec.called_by!r}: give its call_tool (a ToolSpec of that name)")
    ROLE_TABLE.add(name, spec)
    return spec


def unregister_role(name: str) -> None:
    """Remove a role :func:`register_role` added (tests and examples); the built-in roles stay."""
    if name in ROLES:
        raise ValueError(f"{name!r} is a built-in role")
    ROLE_TABLE.unregister(name)
