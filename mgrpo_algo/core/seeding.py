"""Seeds of a run, one formula each, shared by every placement so that they sample alike.

Everything random in an iteration is keyed by (seed, iteration), never by how many draws came
before: a resumed run, a restarted role server and a run on another placement draw what the
uninterrupted in-process run drew.
"""

from __future__ import annotations

import numpy as np

__all__ = ["policy_seed", "iteration_rngs", "eval_seed", "episode_seed"]

#: Sampling-seed offset of each role's policy (main and single 0, sub 1): the roles draw apart.
_ROLE_SEED = {"main": 0, "single": 0, "sub": 1}


def policy_seed(seed: int, role: str, iteration: int) -> int:
    """The sampling seed of a role's policy built before ``iteration`` (a resumed server starts
    at its next iteration)."""
    return seed + _ROLE_SEED[role] + 1000 * iteration


#: Sampling-seed offset of each role's evaluation policy (main 0, sub 1, single 2).
_EVAL_ROLE_SEED = {"main": 0, "sub": 1, "single": 2}


def eval_seed(seed: int, role: str) -> int:
    """The sampling seed of a role's evaluation policy in an evaluation seeded ``seed``."""
    return seed + _EVAL_ROLE_SEED[role]


def episode_seed(seed: int, iteration: int) -> int:
    """The reset seed of an iteration's first episode (episode i resets with this + i)."""
    return seed + iteration * 10_000


def iteration_rngs(seed: int, iteration: int) -> tuple[np.random.Generator, np.random.Generator]:
    """(task sampling, alignment) generators of one iteration, keyed by (seed, iteration)."""
    return np.random.default_rng([seed, iteration, 0]), np.random.default_rng([seed, iteration, 1])
