"""The one table of training modes: which roles a mode runs, which of them learn, and its env.

``TrainConfig.mode``, the trainer, the role workers, preflight, ``mgrpo compare`` (its ``--modes``
and which start models a mode needs), the report's differences and the CLI all read :data:`MODES`.
A new mode is one :meth:`~mgrpo_tools.registry.Registry.register` call (``MODES.register("name",
ModeSpec(...))``) made before the config loads; nothing else changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mgrpo_env.roles import ROLE_TABLE
from mgrpo_tools.registry import Registry

__all__ = ["MODES", "ModeSpec", "mode_names"]


@dataclass(frozen=True)
class ModeSpec:
    """One training mode: the roles it runs, the roles whose learner updates, and the env its
    episodes run in (a name in ``mgrpo_env.episode_core.KINDS``). Every mode's env gets the same
    ``RewardConfig`` (the single agent's uses its main weights)."""

    roles: tuple[str, ...]
    trained: tuple[str, ...]
    env: str = "hierarchy"
    compare_to: str = ""
    """The mode the report compares this one against after training ("" for none): the paper's
    order mgrpo > frozen-sub > single-agent is two such pairs."""
    shares: tuple[tuple[str, str], ...] = ()
    """``(role, owner)`` pairs: ``role`` is played by ``owner``'s model, worker and learner (one LLM
    for both, and one update over both roles' sequences an iteration): the shared-model baseline's
    ``(("sub", "main"),)``. Its start is the owner's start model."""
    start: tuple[tuple[str, str], ...] = ()
    """``(role, model folder)`` pairs: this mode's own start model for a role with a worker (a shared
    role starts from its owner's), in place of the config's ``<role>.model``, so that one comparison
    can start each mode from its own fair start: the shared-model baseline from one model cloned from
    both roles' demonstrations (``mgrpo warm-start --shared``) while M-GRPO keeps its per-role models.
    ``mgrpo compare`` pins it (its start is evaluated on its own) and ``mgrpo train`` starts from it
    (both through ``training.trainer.mode_model_paths``)."""

    def __post_init__(self) -> None:
        unknown = [r for r in self.roles if r not in ROLE_TABLE]
        if unknown or not set(self.trained) <= set(self.roles):
            raise ValueError(f"a mode's roles must be of {tuple(ROLE_TABLE)} and its trained roles among them; "
                             f"got roles {self.roles}, trained {self.trained}")
        wrong = [r for r in self.roles if ROLE_TABLE[r].env != self.env]
        if wrong:
            raise ValueError(f"roles {wrong} do not act in the {self.env!r} env")
        shared = dict(self.shares)
        for role, owner in self.shares:
            if role == owner or role not in self.roles or owner not in self.roles or owner in shared:
                raise ValueError(f"a shared role and its owner must be two of the mode's roles {self.roles}, the owner "
                                 f"sharing no other's model; got {role!r} played by {owner!r}")
            if (role in self.trained) != (owner in self.trained):
                raise ValueError(f"{role!r} is played by {owner!r}'s model: both learn or neither does")
        starts = [role for role, _ in self.start]
        if len(set(starts)) != len(starts) or not set(starts) <= set(self.workers) or not all(p for _, p in self.start):
            raise ValueError(f"a mode's start names a model folder once per role with a worker of its own "
                             f"{self.workers}; got {self.start}")

    def owner(self, role: str) -> str:
        """The role whose model and worker play ``role`` (itself unless shared)."""
        return dict(self.shares).get(role, role)

    @property
    def workers(self) -> tuple[str, ...]:
        """The roles that have a worker of their own (the others are played by an owner's)."""
        return tuple(r for r in self.roles if self.owner(r) == r)

    @property
    def start_key(self) -> tuple[Any, ...]:
        """Modes with the same key start from the same models (``mgrpo compare`` evaluates that start
        once): the env's roles, each role played by the same model, from the same folders."""
        return (self.env, self.shares, self.start) if self.start else (self.env, self.shares)

    @property
    def single(self) -> bool:
        """One agent holding every tool, no hierarchy (no called side, no alignment): the mode's env says so,
        not which roles it names (main with a registered reader and no sub-agent is a hierarchy)."""
        return self.env == "single"


#: Every mode, in the order ``mgrpo compare`` runs and reports them.
MODES: Registry[ModeSpec] = Registry("mode", {
    "mgrpo": ModeSpec(("main", "sub"), ("main", "sub"), compare_to="frozen-sub"),
    "frozen-sub": ModeSpec(("main", "sub"), ("main",), compare_to="single-agent"),
    "single-agent": ModeSpec(("single",), ("single",), env="single"),
})


def mode_names() -> tuple[str, ...]:
    """The registered modes, in order (a mode registered at run time included)."""
    return MODES.names()
