"""mgrpo_env: the M-GRPO environment.

* :func:`env` - the PettingZoo AEC hierarchy (``main_0``, ``sub_0`` ... ``sub_{N-1}``);
* :func:`single_agent_env` - the single-agent Gymnasium env (the GRPO baseline), also
  ``gymnasium.make("mgrpo/WikiHops-v0", **kwargs)`` (registered on import);
* :mod:`mgrpo_env.wiki_hops_v0` - the AEC env on ``wiki-hops`` the PettingZoo way
  (``wiki_hops_v0.env()``, ``wiki_hops_v0.raw_env()``);
* :mod:`mgrpo_env.protocol` - parsing of the agents' text actions;
* :mod:`mgrpo_env.align` - trajectory alignment; :mod:`mgrpo_env.rewards` - the reward formulas;
* :mod:`mgrpo_env.episode` - episode records (JSONL); :mod:`mgrpo_env.rollout` - batched collection.

Never imports torch.
"""

import gymnasium

from . import align, protocol, rewards
from .aec import MGRPOEnv, env, raw_env
from .core import Limits, RewardConfig
from .episode import AgentTrajectory, EpisodeRecord, ToolCall, Turn, read_jsonl, write_jsonl
from .single import SingleAgentEnv, single_agent_env

#: Gymnasium id of the single-agent env on the ``wiki-hops`` scenario (namespace/Name-vVersion);
#: the version is bumped with the env's "Version history" (and the scenario's own version).
GYMNASIUM_ID = "mgrpo/WikiHops-v0"

if GYMNASIUM_ID not in gymnasium.registry:  # importing twice (or reloading) must not warn
    gymnasium.register(id=GYMNASIUM_ID, entry_point="mgrpo_env.single:SingleAgentEnv", kwargs={"scenario": "wiki-hops"})

__all__ = [
    "GYMNASIUM_ID",
    "env",
    "raw_env",
    "MGRPOEnv",
    "single_agent_env",
    "SingleAgentEnv",
    "Limits",
    "RewardConfig",
    "EpisodeRecord",
    "AgentTrajectory",
    "Turn",
    "ToolCall",
    "read_jsonl",
    "write_jsonl",
    "align",
    "protocol",
    "rewards",
]
