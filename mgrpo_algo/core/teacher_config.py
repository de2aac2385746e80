"""The warm start's second stage: imitate an imperfect teacher (``warm_start.teacher``).

Kept apart from ``config.py`` only to keep files short; it is part of the one config tree
(``TrainConfig.warm_start.teacher``) and is loaded and checked like every other section.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["MistakeConfig", "TeacherConfig", "ROLES_OF_WARM_START"]

ROLES_OF_WARM_START = ("main", "sub", "single")


@dataclass
class MistakeConfig:
    """The rate of one mistake kind of :class:`mgrpo_env.teacher.ImperfectTeacher` (its docstring
    describes each kind). A question-kind override wins over a role override, which wins over ``rate``."""

    rate: float = 0.0
    """Probability of the mistake at each decision of its kind (0 = the oracle's decision)."""
    roles: dict[str, float] = field(default_factory=dict)
    """Per-role rates (``{single: 0.2}``); roles that cannot make this kind ignore it."""
    question_kinds: dict[str, float] = field(default_factory=dict)
    """Per question-kind rates (``{comparison: 0.0}``: an early guess on a two-candidate comparison is
    right half the time, a mistake the correctness reward pays and RL would amplify)."""

    def __post_init__(self) -> None:
        values = {"rate": self.rate, **{f"roles.{k}": v for k, v in self.roles.items()},
                  **{f"question_kinds.{k}": v for k, v in self.question_kinds.items()}}
        for name, value in values.items():
            if not 0.0 <= float(value) <= 1.0:
                raise ValueError(f"config field 'warm_start.teacher.<mistake>.{name}' must be in [0, 1], got {value!r}")
        bad = sorted(set(self.roles) - set(ROLES_OF_WARM_START))
        if bad:
            raise ValueError(f"config field 'warm_start.teacher.<mistake>.roles' takes main/sub/single, got {bad}")

    @property
    def enabled(self) -> bool:
        return any(v > 0 for v in (self.rate, *self.roles.values(), *self.question_kinds.values()))


@dataclass
class TeacherConfig:
    """Second warm-start stage: fine-tune the oracle-cloned start on an imperfect teacher's
    demonstrations (every episode kept, right or wrong), so the start makes decision mistakes that
    recur across questions, as starts cloned from real, weaker agents do. Off when every rate is 0.

    Why: a clone of a perfect oracle is left with a tiny model's idiosyncratic copy errors, which RL
    does not transfer to held-out questions; systematic decision mistakes it does remove
    (docs/results/demo.md; ``../shared/research/imperfect_teacher/REPORT.md`` measured +9.7 and +8.9 points)."""

    answer_early: MistakeConfig = field(default_factory=MistakeConfig)
    """Main (and single) agent answers with a guess where it should start the next hop."""
    report_without_visit: MistakeConfig = field(default_factory=MistakeConfig)
    """Sub-agent (and single agent) takes a search hit's title as the result without visiting."""
    visit_wrong_hit: MistakeConfig = field(default_factory=MistakeConfig)
    """Sub-agent (and single agent) visits a search hit other than the entity's and reads it."""
    draws: int = 3
    """Independent draws of the mistakes per training task: the same kind of state is shown with and
    without the mistake, so the clone learns the rate, not a per-question choice."""
    role_epochs: dict[str, float] = field(default_factory=lambda: {"main": 3.0, "sub": 2.0})
    """Epochs over the teacher's demonstrations per role. The single agent's are set by
    ``single_matches_hierarchy`` unless it is false (then its entry here, default 0)."""
    single_matches_hierarchy: bool = True
    """Give the single agent the optimiser steps of the main and sub roles together, over both
    stages (oracle + teacher; same ``batch_tokens``, so the same padded tokens): a fair baseline."""
    lr: float = 1e-3
    """AdamW learning rate of the fine-tune (the oracle stage used 3e-3 from scratch)."""
    warmup_steps: int = 20
    """Linear warmup steps."""
    min_lr_ratio: float = 0.1
    """Cosine decay to ``lr * min_lr_ratio``."""
    torch_threads: int = 1
    """CPU threads of the fine-tune (part of its key: float sums, and so the bits, depend on it). One
    thread, because two threads on a shared 2-core machine slowed the single agent's stage ~20x."""

    def __post_init__(self) -> None:
        if self.torch_threads < 1:
            raise ValueError(f"config field 'warm_start.teacher.torch_threads' must be >= 1, got {self.torch_threads}")
        if self.draws < 1:
            raise ValueError(f"config field 'warm_start.teacher.draws' must be >= 1, got {self.draws}")
        bad = {r: e for r, e in self.role_epochs.items() if r not in ROLES_OF_WARM_START or not e >= 0}
        if bad:
            raise ValueError(f"config field 'warm_start.teacher.role_epochs' takes main/sub/single with epochs >= 0, got {bad}")
        if self.lr <= 0 or self.warmup_steps < 0 or not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError("config fields 'warm_start.teacher.lr' > 0, 'warmup_steps' >= 0, 'min_lr_ratio' in [0, 1]")

    @property
    def mistakes(self) -> dict[str, MistakeConfig]:
        return {"answer_early": self.answer_early, "report_without_visit": self.report_without_visit,
                "visit_wrong_hit": self.visit_wrong_hit}

    @property
    def enabled(self) -> bool:
        return any(m.enabled for m in self.mistakes.values())

    def rates(self) -> dict[str, Any]:
        """The teacher's rates as :class:`mgrpo_env.teacher.MistakeRate` objects (enabled kinds only)."""
        from mgrpo_env.teacher import MistakeRate

        return {kind: MistakeRate(m.rate, dict(m.roles), dict(m.question_kinds))
                for kind, m in self.mistakes.items() if m.enabled}
