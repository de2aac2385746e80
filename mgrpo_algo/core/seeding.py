"""Seeds of a run, one formula each, shared by every placement so that they sample alike.

Everything random in an iteration is keyed by (seed, iteration), never by how many draws came
before: a resumed run, a restarted role server and a run on another placement draw what the
uninterrupted in-process run drew.
"""

from __future__ import annotations

import numpy as np

__all__ = ["policy_seed", "iteration_rngs"]

#: Sampling-seed offset of each role's policy (main and single 0, sub 1): the roles draw apart.
_ROLE_SEED = {"main": 0, "single": 0, "sub": 1}


def policy_seed(seed: int, role: str, iteration: int) -> int:
    """The sampling seed of a role's policy built before ``iteration`` (a resumed server starts
    at its next iteration)."""
    return seed + _ROLE_SEED[role] + 1000 * iteration


def iteration_rngs(seed: int, iteration: int) -> tuple[np.random.Generator, np.random.Generator]:
    """(task sampling, alignment) generators of one iteration, keyed by (seed, iteration)."""
    return np.random.default_rng([seed, iteration, 0]), np.random.default_rng([seed, iteration, 1])
