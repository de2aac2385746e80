"""mgrpo_scenarios: plug-in scenarios (tasks + the world the agents act in) and verifiers.

``mgrpo_scenarios.get(name, **kwargs)`` builds a scenario, ``mgrpo_scenarios.names()`` lists them.
The built-in ``wiki-hops`` is an offline fictional encyclopedia served on loopback.
"""

from .base import (
    AnswersSubtasks,
    AttributesDelegations,
    ChoosesRoleTools,
    DelegationMatch,
    GroupsWorldTokens,
    HasDefaultSplit,
    Hop,
    NamesWorldTokens,
    NeedsBrowser,
    NeedsBuilding,
    Scenario,
    ScriptsOracle,
    ShipsOracle,
    StylesPrompts,
    Task,
    Verdict,
    World,
    split_parts,
    split_tasks,
)
from .registry import ENTRY_POINT_GROUP, SCENARIOS, answers_subtasks, get, names, register

__all__ = ["Hop", "Task", "Verdict", "World", "Scenario", "DelegationMatch", "AttributesDelegations", "split_parts",
           "split_tasks", "get", "names", "register", "answers_subtasks", "SCENARIOS", "ENTRY_POINT_GROUP",
           "ChoosesRoleTools", "StylesPrompts", "NeedsBuilding", "NeedsBrowser", "NamesWorldTokens", "GroupsWorldTokens",
           "HasDefaultSplit", "ScriptsOracle", "ShipsOracle", "AnswersSubtasks"]
