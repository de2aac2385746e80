"""mgrpo_env: the M-GRPO environment.

* :func:`env` - the PettingZoo AEC hierarchy (``main_0``, ``sub_0`` ... ``sub_{N-1}``);
* :func:`single_agent_env` - the single-agent Gymnasium env (the GRPO baseline);
* :mod:`mgrpo_env.protocol` - parsing of the agents' text actions;
* :mod:`mgrpo_env.align` - trajectory alignment; :mod:`mgrpo_env.rewards` - the reward formulas;
* :mod:`mgrpo_env.episode` - episode records (JSONL); :mod:`mgrpo_env.rollout` - batched collection.

Never imports torch.
"""

from . import align, protocol, rewards
from .aec import MGRPOEnv, env, raw_env
from .core import Limits, RewardConfig
from .episode import AgentTrajectory, EpisodeRecord, ToolCall, Turn, read_jsonl, write_jsonl
from .single import SingleAgentEnv, single_agent_env

__all__ = [
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
