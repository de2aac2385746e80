"""A role is one registered spec: a verifier the main agent calls by a tool of its own, stepped by hand
through the AEC env (the episode core starts it, prompts it, limits it and pays it by its spec), and
the run config's role table (``roles:``) beside the built-in sections. The trained third role is
``examples/extend/new_role.py`` (tests/test_extend_examples.py)."""

from __future__ import annotations

import json

import pytest

import mgrpo_env
from mgrpo_algo.core.config import RoleConfig, TrainConfig, load_config
from mgrpo_env.protocol import ToolSpec
from mgrpo_env.roles import ROLE_TABLE, RoleSpec, register_role, unregister_role

VERIFY = ToolSpec("verify", "Have a verifier check a draft answer against the pages; its verdict comes back.",
                  {"type": "object", "properties": {"task": {"type": "string", "minLength": 1},
                                                    "context": {"type": "string"}},
                   "required": ["task"], "additionalProperties": False})


def _paid(format_ok, main_correct, expert, weights, *, format_gate=False):
    """The verifier's pay: 0.25 for a well-formed verdict, plus 0.5 when the main agent was right."""
    return (0.25 + 0.5 * main_correct) if format_ok else 0.0


@pytest.fixture()
def verifier():
    register_role("verifier", RoleSpec(
        env="hierarchy", final_tag="result", sample_seed=3, eval_seed=4, intro="You are the team's verifier.",
        compact_intro="Verifier.", final_text="<result>your verdict</result>", tools=("visit",),
        called_by="verify", call_tool=VERIFY, max_turns=2, reward=_paid))
    yield "verifier"
    unregister_role("verifier")


def call(name: str, **arguments) -> str:
    return f"<think>step</think><tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def test_a_registered_role_is_called_by_its_tool_prompted_limited_and_paid_by_its_spec(verifier, small_scenario,
                                                                                       small_world):
    env = mgrpo_env.env(scenario=small_scenario, world=small_world, seed=0, split="stage2/test", max_delegations=2)
    try:
        assert "verifier_0" in env.possible_agents and "verifier_1" in env.possible_agents
        task = next(t for t in small_scenario.tasks("stage2/test") if t.kind == "chain")
        env.reset(seed=1, options={"task": task})
        main_prompt = env.unwrapped.trajectory("main_0").messages[0]["content"]
        assert '"name": "verify"' in main_prompt and '"name": "delegate"' in main_prompt  # the root holds its call tool
        env.step(call("verify", task=f"Is {task.answer!r} right?", context="draft"))
        assert env.agent_selection == "verifier_0"  # the tool started an agent of the role
        verifier_traj = env.unwrapped.trajectory("verifier_0")
        assert verifier_traj.role == "verifier" and verifier_traj.messages[0]["content"].startswith("You are the team's verifier.")
        assert env.observe("verifier_0")["text"] == f"Subtask: Is {task.answer!r} right?\nContext: draft"
        env.step(call("search", queries=["x"]))  # not its tool: a format error, one of its 2 turns
        assert env.unwrapped.last_turn("verifier_0").error_kind == "unknown_tool"
        env.step("<think>ok</think><answer>yes</answer>")  # the wrong final tag: its spec says <result>; 2nd turn
        assert env.agent_selection == "main_0"  # its own turn limit (2), not max_sub_turns, ended it
        assert "stopped at its limit of 2 turns" in env.observe("main_0")["text"]
        env.step(call("verify", task="again?"))
        env.step("<think>ok</think><result>correct</result>")
        assert env.observe("main_0")["text"] == "<tool_response>\ncorrect\n</tool_response>"
        env.step(f"<think>done</think><answer>{task.answer}</answer>")
        record = env.unwrapped.record
        assert record.correct and [s.agent for s in record.subs] == ["verifier_0", "verifier_1"]
        assert env.rewards["verifier_0"] == 0.0 and env.rewards["verifier_1"] == 0.75  # its spec's reward, paid
    finally:
        env.close()
    assert "verifier" not in ROLE_TABLE or verifier  # unregistered by the fixture after this test


def test_the_config_holds_a_table_of_roles_beside_the_builtin_sections(verifier, tmp_path):
    config = load_config(None, ["roles={verifier: {model: some/folder, learner: {lr: 0.5}}}", "main.learner.lr=0.25"])
    assert config.role("verifier").model == "some/folder" and config.role("verifier").learner.lr == 0.5
    assert config.role("main") is config.main and config.main.learner.lr == 0.25
    with pytest.raises(ValueError, match="roles.verifier.learner.nope"):
        load_config(None, ["roles={verifier: {learner: {nope: 1}}}"])
    assert load_config(None, ["roles={sub: {model: x}}"]).sub.model == "x"  # a built-in role's entry is its section
    with pytest.raises(ValueError, match="registered roles other than"):  # built by hand, the table holds no built-in
        TrainConfig(roles={"sub": RoleConfig(model="x")})
    with pytest.raises(ValueError, match="roles.reader"):
        load_config(None, []).role("reader")


def test_a_role_needs_a_new_name_and_its_call_tool():
    with pytest.raises(ValueError, match="new identifier"):
        register_role("sub", ROLE_TABLE["sub"])
    with pytest.raises(ValueError, match="call_tool"):
        register_role("checker", RoleSpec(env="hierarchy", final_tag="result", sample_seed=3, eval_seed=4,
                                          called_by="check"))
    assert "checker" not in ROLE_TABLE


def test_a_main_agent_tool_is_one_registration(small_scenario, small_world):
    """``register_tool(..., roles=("main",))``: the main agent is shown the tool, may name it in a run's
    ``tools``, and the episode runs it (a world tool stays the sub-agents')."""
    from mgrpo_env.protocol import check_tool_names, register_tool, unregister_tool
    from mgrpo_tools.base import BaseTool, require_str

    class CountWords(BaseTool):
        name = "count_words"
        description = "Count the words of a text."
        parameters = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"],
                      "additionalProperties": False}

        def run(self, arguments):
            return str(len(require_str(arguments, "text").split()))

    register_tool(ToolSpec(CountWords.name, CountWords.description, CountWords.parameters), lambda world: CountWords(),
                  roles=("main",))
    try:
        check_tool_names("main", ["delegate", "count_words"], where="tools.main")
        with pytest.raises(ValueError, match="world tools are the sub-agents'"):
            check_tool_names("main", ["delegate", "search"], where="tools.main")
        env = mgrpo_env.env(scenario=small_scenario, world=small_world, seed=0, split="stage2/test")
        try:
            env.reset(seed=1)
            assert '"name": "count_words"' in env.unwrapped.trajectory("main_0").messages[0]["content"]
            env.step(call("count_words", text="one two three"))
            assert env.agent_selection == "main_0"
            assert env.observe("main_0")["text"] == "<tool_response>\n3\n</tool_response>"
            assert env.unwrapped.last_turn("main_0").tool_call.ok
        finally:
            env.close()
    finally:
        unregister_tool("count_words")


def test_a_role_sharing_the_delegate_tool_takes_the_calls_its_rule_picks(small_scenario, small_world):
    # takes(n, arguments): n counts the tool's earlier calls in the episode; the role without a rule
    # (the sub-agents) takes the others
    register_role("checker", RoleSpec(
        env="hierarchy", final_tag="result", sample_seed=5, eval_seed=6, intro="You check.", compact_intro="Checker.",
        final_text="<result>x</result>", tools=("visit",), called_by="delegate",
        takes=lambda n, arguments: n == 2 or arguments.get("context") == "check"))
    env = mgrpo_env.env(scenario=small_scenario, world=small_world, seed=0, split="stage2/test", max_delegations=4,
                        max_main_turns=6)
    try:
        env.reset(seed=1)
        roles = []
        for context in ("check", "other", "other", None):
            env.step(call("delegate", task="t", **({"context": context} if context else {})))
            roles.append(env.unwrapped.trajectory(env.agent_selection).role)
            env.step("<think>ok</think><result>r</result>")
        assert roles == ["checker", "sub", "checker", "sub"]
    finally:
        env.close()
        unregister_role("checker")


def test_a_role_alone_on_its_tool_takes_every_call_and_no_taker_is_a_tool_error(small_scenario, small_world):
    """``takes`` shares a tool between roles: an episode that plays one role on the tool (a mode without the
    sub-agents) starts it for every call; when every role on it has a rule and none takes a call, the call
    is refused as a tool error (the main agent goes on), not a crash."""
    from mgrpo_env.episode_core import Episode

    odd = dict(env="hierarchy", final_tag="result", intro="You read.", compact_intro="Reader.",
               final_text="<result>x</result>", tools=("visit",), called_by="delegate")
    register_role("odd_reader", RoleSpec(sample_seed=7, eval_seed=8, takes=lambda n, arguments: n % 2 == 1, **odd))
    register_role("third_reader", RoleSpec(sample_seed=9, eval_seed=10, takes=lambda n, arguments: n == 2, **odd))
    try:
        alone = Episode("hierarchy", small_scenario, "stage2/test", world=small_world, seed=0, max_delegations=3,
                        roles=("main", "odd_reader"))
        alone.reset(seed=1)
        for n in range(2):
            alone.act(call("delegate", task=f"t{n}"))
            assert alone.selected.name == f"odd_reader_{n}"  # call 0 too, which its rule would leave to another
            alone.act("<think>ok</think><result>r</result>")
        both = Episode("hierarchy", small_scenario, "stage2/test", world=small_world, seed=0, max_delegations=3,
                       roles=("main", "odd_reader", "third_reader"))
        both.reset(seed=1)
        both.act(call("delegate", task="t0"))  # call 0: neither rule takes it
        main = both.selected
        assert main.name == "main_0" and main.traj.turns[-1].tool_call.ok is False
        assert main.traj.turns[-1].tool_call.error == ("no agent of this team takes this delegate call (call 1); "
                                                       "give other arguments or answer now.")
        both.act(call("delegate", task="t1"))  # the refused call is not counted: call 0 again, refused again
        assert both.selected.name == "main_0"
    finally:
        unregister_role("odd_reader")
        unregister_role("third_reader")


def test_a_collection_needs_the_root_role_only(small_scenario, small_world):
    from mgrpo_env.rollout import collect

    task = next(iter(small_scenario.tasks("stage2/test")))
    with pytest.raises(ValueError, match="root role 'main'"):
        collect(small_scenario, [task], 1, {"sub": lambda requests: []}, world=small_world)
    with pytest.raises(ValueError, match="root role 'single'"):
        collect(small_scenario, [task], 1, {"main": lambda requests: []}, world=small_world, env="single")


def test_a_registered_called_role_scores_by_its_own_section_and_says_what_it_takes_from_the_sub_agents():
    import warnings

    from mgrpo_algo.training.trainer import reward_config

    register_role("scorer", RoleSpec(env="hierarchy", final_tag="result", sample_seed=11, eval_seed=12, intro="S.",
                                     compact_intro="S.", final_text="<result>x</result>", tools=("visit",),
                                     called_by="delegate", takes=lambda n, arguments: n == 1))
    try:
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            own = load_config(None, ["roles={scorer: {called: {weights: [0.2, 0.3, 0.5], format_gate: true, "
                                     "estimator: grpo, outcome_groups: subtask}}}"])
            assert not [w for w in said if "roles.scorer.called" in str(w.message)]
            partly = load_config(None, ["roles={scorer: {called: {weights: [0.2, 0.3, 0.5]}}}", "sub_format_gate=true"])
        [line] = [str(w.message) for w in said if "roles.scorer.called" in str(w.message)]
        assert line == ("config field 'roles.scorer.called': format_gate, estimator, outcome_groups not set: role "
                        "'scorer' scores its side with the sub-agents' (format_gate True, estimator "
                        "'grpo_pooled_masked', outcome_groups 'query')")
        assert own.called_side("scorer") == ((0.2, 0.3, 0.5), True, "grpo", "subtask")
        assert partly.called_side("scorer") == ((0.2, 0.3, 0.5), True, "grpo_pooled_masked", "query")
        assert own.called_side("sub") == ((0.1, 0.4, 0.5), False, "grpo_pooled_masked", "query")
        # the env pays each called role with its own weights and gate
        rewards = reward_config(own, None)
        assert rewards.called_weights("scorer") == ((0.2, 0.3, 0.5), True)
        assert rewards.called_weights("sub") == ((0.1, 0.4, 0.5), False)
        # its worker scores its side with them (the CalledScoring the loop sends it)
        from types import SimpleNamespace

        from mgrpo_algo.training.workers import RoleWorkers

        scoring = RoleWorkers._sub_scoring(SimpleNamespace(config=own), 3, "scorer")
        assert (scoring.role, scoring.sub_weights, scoring.sub_format_gate, scoring.estimator, scoring.outcome_groups) == (
            "scorer", (0.2, 0.3, 0.5), True, "grpo", "subtask")
        scoring = RoleWorkers._sub_scoring(SimpleNamespace(config=own), 3, "sub")
        assert (scoring.sub_weights, scoring.sub_format_gate, scoring.estimator) == ((0.1, 0.4, 0.5), False,
                                                                                   "grpo_pooled_masked")
        with pytest.raises(ValueError, match="config field 'sub.called' is for a registered called role"):
            load_config(None, ["sub.called.weights=[0.1, 0.4, 0.5]"])
        with pytest.raises(ValueError, match="unknown advantage estimator 'nope'"):
            load_config(None, ["roles={scorer: {called: {estimator: nope}}}"])
    finally:
        unregister_role("scorer")


def test_a_registered_role_without_a_model_needs_one_it_brings_itself(tmp_path, small_scenario):
    from mgrpo_algo.training.trainer import role_model_paths

    oracle = "configs/oracle-warm-start"
    spec = dict(env="hierarchy", final_tag="result", sample_seed=13, eval_seed=14, intro="B.", compact_intro="B.",
                final_text="<result>x</result>", tools=("visit",), called_by="delegate")
    register_role("bare_role", RoleSpec(**spec))
    register_role("brings_role", RoleSpec(**spec, start_model=lambda built, folder: f"{built['sub']}#{folder}"))
    try:
        config = load_config(None, [f"main.model={oracle}/main", f"sub.model={oracle}/sub", f"models_dir={tmp_path}",
                                    "roles={bare_role: {}, brings_role: {}}"])
        with pytest.raises(ValueError, match=r"^config field 'roles.bare_role.model' is needed: .*RoleSpec.start_model"):
            role_model_paths(config, small_scenario, ["main", "bare_role"])
        paths = role_model_paths(config, small_scenario, ["main", "brings_role"])
        assert paths == {"main": f"{oracle}/main", "brings_role": f"{oracle}/sub#{tmp_path / 'roles' / 'brings_role'}"}
    finally:
        unregister_role("bare_role")
        unregister_role("brings_role")


def test_the_built_in_roles_may_be_given_in_the_one_role_table():
    table = load_config(None, ["roles={main: {learner: {lr: 2.0e-5}}, sub: {generation: {max_new_tokens: 77}}}"])
    sections = load_config(None, ["main.learner.lr=2.0e-5", "sub.generation.max_new_tokens=77"])
    assert table == sections and table.roles == {}
    assert table.role("main").learner.lr == 2.0e-5 and table.role("sub").generation.max_new_tokens == 77
    with pytest.raises(ValueError, match="config field 'roles.main': role 'main' is also given as the section 'main'"):
        load_config(None, ["roles={main: {learner: {lr: 1.0e-5}}}", "main.learner.lr=2.0e-5"])
