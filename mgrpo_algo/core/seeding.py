"""Seeds of a run, one formula each, shared by every placement so that they sample alike.

Everything random in an iteration is keyed by (seed, iteration), never by how many draws came
before: a resumed run, a restarted role server and a run on another placement draw what the
uninterrupted in-process run drew. On CPU the numbers also depend on torch's thread count, which
:func:`torch_threads` sets for a block.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from mgrpo_env.roles import ROLE_TABLE

__all__ = ["policy_seed", "iteration_rngs", "eval_seed", "episode_seed", "torch_threads"]


def policy_seed(seed: int, role: str, iteration: int) -> int:
    """The sampling seed of a role's policy built before ``iteration`` (a resumed server starts
    at its next iteration); the role's offset is in the role table (``mgrpo_env.roles``)."""
    return seed + ROLE_TABLE[role].sample_seed + 1000 * iteration


def eval_seed(seed: int, role: str) -> int:
    """The sampling seed of a role's evaluation policy in an evaluation seeded ``seed``."""
    return seed + ROLE_TABLE[role].eval_seed


def episode_seed(seed: int, iteration: int) -> int:
    """The reset seed of an iteration's first episode (episode i resets with this + i)."""
    return seed + iteration * 10_000


def iteration_rngs(seed: int, iteration: int) -> tuple[np.random.Generator, np.random.Generator]:
    """(task sampling, alignment) generators of one iteration, keyed by (seed, iteration)."""
    return np.random.default_rng([seed, iteration, 0]), np.random.default_rng([seed, iteration, 1])


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """torch's CPU threads set to ``threads`` (at least 1) inside the block, restored after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(max(1, int(threads)))
    try:
        yield
    finally:
        torch.set_num_threads(before)
