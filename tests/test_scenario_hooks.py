"""A scenario's optional hooks are declared protocols (``mgrpo_scenarios.base``), read with isinstance where they
are used: a scenario without one gets the stated default or a one-line refusal, never an undeclared probe."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import mgrpo_scenarios
from mgrpo_env.core import subtask_expert_score
from mgrpo_env.protocol import DEFAULT_ROLE_TOOLS, role_tools
from mgrpo_env.scripted import OraclePolicy

ROOT = Path(__file__).resolve().parents[1]
HOOKS = ("ChoosesRoleTools", "StylesPrompts", "NeedsBuilding", "NeedsBrowser", "NamesWorldTokens", "GroupsWorldTokens",
         "HasDefaultSplit", "ScriptsOracle", "ShipsOracle", "AnswersSubtasks")
#: What the package may still read off a scenario by name: its name and metadata (the protocol's own) and
#: the options a warm start's cache key and the wiki-hops oracle read when a scenario has them.
READ_BY_NAME = {"name", "metadata", "profile"}


class Bare:
    """The protocol's four methods and nothing else."""

    name = "bare"
    metadata = {"version": "1"}

    def splits(self):
        return ["test"]

    def tasks(self, split):
        return iter([mgrpo_scenarios.Task("t", "q?", "a", split)])

    def open(self):
        raise NotImplementedError

    def verify(self, task, prediction):
        return mgrpo_scenarios.Verdict(prediction == task.answer, float(prediction == task.answer))


def test_a_bare_scenario_has_none_of_the_hooks_and_gets_the_defaults_or_a_one_line_refusal():
    bare = Bare()
    assert isinstance(bare, mgrpo_scenarios.Scenario)
    assert [h for h in HOOKS if isinstance(bare, getattr(mgrpo_scenarios, h))] == []
    assert list(role_tools(bare, "sub")) == list(DEFAULT_ROLE_TOOLS["sub"])  # the stated default
    with pytest.raises(ValueError, match=r"^scenario 'bare' has no oracle_read\(\) and oracle_combine\(\) "
                                         r"\(mgrpo_scenarios.ScriptsOracle\): no oracle policy$"):
        OraclePolicy(bare, "main")
    with pytest.raises(TypeError, match="needs a scenario that answers subtasks"):
        subtask_expert_score(bare)
    bare.role_tools = {"sub": ["search"]}  # declared by having it
    assert isinstance(bare, mgrpo_scenarios.ChoosesRoleTools) and list(role_tools(bare, "sub")) == ["search"]


def test_wiki_hops_declares_its_hooks(small_scenario):
    held = [h for h in HOOKS if isinstance(small_scenario, getattr(mgrpo_scenarios, h))]
    assert held == ["StylesPrompts", "NeedsBuilding", "NeedsBrowser", "NamesWorldTokens", "GroupsWorldTokens",
                    "ScriptsOracle", "ShipsOracle", "AnswersSubtasks"]


def test_the_package_reads_no_undeclared_hook_off_a_scenario():
    probes = []
    for package in ("mgrpo_env", "mgrpo_algo"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
                        and len(node.args) >= 2 and re.fullmatch(r"(self\.)?scenario", ast.unparse(node.args[0]))
                        and isinstance(node.args[1], ast.Constant) and node.args[1].value not in READ_BY_NAME):
                    probes.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.func.id}({node.args[1].value!r})")
    assert probes == []
