"""The M-GRPO hierarchy on the ``wiki-hops`` world, as a PettingZoo environment module.

PettingZoo's convention (``from pettingzoo.classic import rps_v2; env = rps_v2.env()``)::

    from mgrpo_env import wiki_hops_v0

    env = wiki_hops_v0.env(split="stage2/test", scenario_kwargs={"num_entities": 300})
    env.reset(seed=0)
    for agent in env.agent_iter():
        ...

* :func:`env` - the environment wrapped in PettingZoo's order-enforcing wrapper (use this);
* :func:`raw_env` - the bare :class:`mgrpo_env.aec.MGRPOEnv`.

Every keyword of :class:`~mgrpo_env.aec.MGRPOEnv` is accepted (``split``, ``seed``,
``scenario_kwargs``, ``world``, ``tasks``, the :class:`~mgrpo_env.core.Limits` fields, ``rewards``,
``render_mode``); the scenario is always ``wiki-hops``. The description, spaces, rewards and episode
end are documented in :mod:`mgrpo_env.aec`.

Version history:
    v0: first release (``wiki-hops`` scenario version 1).
"""

from __future__ import annotations

from typing import Any

from .aec import MGRPOEnv
from .aec import env as _wrapped_env

__all__ = ["env", "raw_env", "SCENARIO"]

SCENARIO = "wiki-hops"


def _refuse_scenario(kwargs: dict[str, Any]) -> None:
    if "scenario" in kwargs:
        raise TypeError(f"wiki_hops_v0 always runs the {SCENARIO!r} scenario; use mgrpo_env.env(scenario=...) for another")


def raw_env(**kwargs: Any) -> MGRPOEnv:
    """The bare AEC environment on ``wiki-hops`` (no wrapper)."""
    _refuse_scenario(kwargs)
    return MGRPOEnv(SCENARIO, **kwargs)


def env(**kwargs: Any) -> Any:
    """The AEC environment on ``wiki-hops`` in PettingZoo's order-enforcing wrapper."""
    _refuse_scenario(kwargs)
    return _wrapped_env(SCENARIO, **kwargs)
