"""The one table of agent roles: which env each acts in and how its episode ends.

Every place that needs the list of roles (the protocol, the spaces, the tiny models, the role
workers, the config, seeding, ``mgrpo eval``, preflight, compare) reads :data:`ROLES` from here, so a
new role is one entry. The order is part of the contract: the tiny model of role ``i`` is seeded
with ``model_seed + i`` (``mgrpo_algo.policies.models``), so an entry is appended, never inserted.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ROLE_TABLE", "ROLES", "RoleSpec", "check_role", "env_roles"]


@dataclass(frozen=True)
class RoleSpec:
    """One role: the env it acts in (a name of ``mgrpo_env.rollout.EPISODES``), the tag of the
    action that ends its part (``prompts.FINAL_TAGS`` and the episode core read it), and the offsets
    of its policies' seeds (``mgrpo_algo.core.seeding``)."""

    env: str
    final_tag: str
    sample_seed: int
    """Offset of its training policy's sampling seed: roles of one env draw apart (main and single
    share 0: they never act in one run)."""
    eval_seed: int
    """Offset of its evaluation policy's sampling seed."""


#: Every role, in order (see the module docstring).
ROLE_TABLE: dict[str, RoleSpec] = {
    "main": RoleSpec(env="hierarchy", final_tag="answer", sample_seed=0, eval_seed=0),
    "sub": RoleSpec(env="hierarchy", final_tag="result", sample_seed=1, eval_seed=1),
    "single": RoleSpec(env="single", final_tag="answer", sample_seed=0, eval_seed=2),
}
ROLES: tuple[str, ...] = tuple(ROLE_TABLE)


def check_role(role: str) -> str:
    """``role`` if it is one of :data:`ROLES`, else ValueError listing them."""
    if role not in ROLE_TABLE:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    return role


def env_roles(env: str) -> tuple[str, ...]:
    """The roles that act in ``env`` ("hierarchy": main and sub; "single": single), in table order."""
    return tuple(name for name, spec in ROLE_TABLE.items() if spec.env == env)
