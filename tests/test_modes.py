"""Modes are one table (roles, trained roles, env); both envs take a RewardConfig; one collect loop."""

from __future__ import annotations

import pytest

from mgrpo_algo.core.config import MODES
from mgrpo_env.core import RewardConfig
from mgrpo_env.episode_core import KINDS
from mgrpo_env.rollout import collect
from mgrpo_env.scripted import OraclePolicy


def test_every_mode_is_one_entry_of_the_table():
    assert MODES.names() == ("mgrpo", "frozen-sub", "single-agent")  # compare's order
    for name, mode in MODES.items():
        assert mode.env in KINDS, name
        assert set(mode.trained) <= set(mode.roles) == set(KINDS[mode.env].roles), name
    assert MODES["single-agent"].single and not MODES["frozen-sub"].single


def test_the_single_agent_env_pays_with_its_reward_config(small_scenario, small_world):
    tasks = list(small_scenario.tasks("stage2/test"))[:4]
    rewards = RewardConfig(main_weights=(0.5, 0.25))
    records = collect(small_scenario, tasks, 1, {"single": OraclePolicy(small_scenario, "single")}, world=small_world,
                      env_kwargs={"max_turns": 24, "rewards": rewards}, env="single")
    assert any(r.correct for r in records)
    for r in records:
        assert r.rewards["single_0"] == pytest.approx((0.5 + 0.25 * r.correct) if r.main.format_ok else 0.0)


def test_one_collect_loop_checks_the_roles_of_its_env(small_scenario, small_world):
    tasks = list(small_scenario.tasks("stage2/test"))[:1]
    with pytest.raises(ValueError, match=r"needs the single env's root role 'single'; got \['main', 'sub'\]"):
        collect(small_scenario, tasks, 1, {"main": None, "sub": None}, world=small_world, env="single")
    with pytest.raises(ValueError, match=r"needs the hierarchy env's root role 'main'; got \['single'\]"):
        collect(small_scenario, tasks, 1, {"single": None}, world=small_world)


def test_single_agent_runs_on_a_role_worker_placement(small_scenario, tmp_path):
    """Every mode on every placement: the single agent's worker on a local handle, no store needed."""
    from mgrpo_algo.core.config import load_config
    from mgrpo_algo.training.trainer import Trainer

    cfg = load_config(None, [
        "mode=single-agent", f"out_dir={tmp_path / 'run'}", f"models_dir={tmp_path / 'models'}", "warm_start.epochs=0",
        f"scenario_kwargs={{num_entities: 300, data_dir: {small_scenario.data_dir}}}", "questions_per_iteration=2",
        "group_size=2", "stages=[{split: stage1/train, iterations: 1}]", "placement={kind: local}",
        "model_sizes={single: {hidden_size: 32, num_layers: 1, num_heads: 2, num_kv_heads: 1}}",
        "single.generation.max_new_tokens=8", "limits={max_main_turns: 2, max_sub_turns: 1, max_delegations: 1}",
    ])
    with Trainer(cfg) as trainer:
        history = trainer.run()
        assert set(trainer.handles) == {"single"} and trainer.workers["single"].store is None
    assert history[0]["single/samples"] == 4
    assert (tmp_path / "run" / "final" / "single" / "config.json").exists()


def test_a_tool_schema_lives_once_and_a_scenario_declares_each_roles_tools(small_scenario, small_world):
    """The prompt and the argument check read the tools package's own objects; a scenario that holds
    back ``click`` from its sub-agents gets a prompt without it and a refused call."""
    from mgrpo_env.aec import MGRPOEnv
    from mgrpo_env.protocol import SEARCH, parse_action, role_tools
    from mgrpo_tools.search import SearchTool
    from mgrpo_tools.visit import ClickTool

    assert SEARCH.parameters is SearchTool.parameters and SEARCH.description is SearchTool.description
    assert list(role_tools(small_scenario, "sub")) == ["search", "visit", "click"]

    class NoClick:
        role_tools = {"sub": ("search", "visit")}

        def __getattr__(self, name):
            return getattr(small_scenario, name)

    scenario = NoClick()
    env = MGRPOEnv(scenario, "stage2/test", world=small_world)
    assert ClickTool.description not in env.core.prompts["sub"] and SearchTool.description in env.core.prompts["sub"]
    assert not parse_action('<tool_call>{"name": "click", "arguments": {"link": 1}}</tool_call>', role="sub",
                            allowed_tools=env.core.tools_of["sub"]).ok
    with pytest.raises(ValueError, match="role 'sub': unknown tool 'teleport'; valid: .*search"):
        role_tools(type("Bad", (), {"role_tools": {"sub": ("teleport",)}})(), "sub")


def test_a_shared_role_must_be_played_by_another_role_of_the_mode():
    from mgrpo_algo.core.modes import ModeSpec

    shared = ModeSpec(("main", "sub"), ("main", "sub"), shares=(("sub", "main"),))
    assert shared.owner("sub") == "main" and shared.owner("main") == "main" and shared.workers == ("main",)
    assert shared.start_key != MODES["mgrpo"].start_key == MODES["frozen-sub"].start_key
    for bad in ((("sub", "sub"),), (("sub", "single"),), (("sub", "main"), ("main", "sub"))):
        with pytest.raises(ValueError, match="a shared role and its owner"):
            ModeSpec(("main", "sub"), ("main", "sub"), shares=bad)
    with pytest.raises(ValueError, match="both learn or neither"):
        ModeSpec(("main", "sub"), ("main",), shares=(("sub", "main"),))


@pytest.fixture
def shared_mode():
    from mgrpo_algo.core.modes import MODES, ModeSpec

    MODES.register("shared-test", ModeSpec(("main", "sub"), ("main", "sub"), shares=(("sub", "main"),)))
    yield "shared-test"
    MODES.unregister("shared-test")


def test_a_shared_role_acts_and_learns_through_its_owners_model(small_scenario, tmp_path, shared_mode):
    """One worker (main's) plays the sub-agents too: their turns come from the main model, one learner
    update a step runs over both roles' sequences, the sub side is scored as in M-GRPO, and the
    exported sub model is the main model."""
    from pathlib import Path

    import torch
    from transformers import AutoModelForCausalLM

    from mgrpo_algo.core.config import load_config
    from mgrpo_algo.training.trainer import Trainer

    start = Path(__file__).resolve().parents[1] / "configs" / "oracle-warm-start"
    settings = [
        f"out_dir={tmp_path / 'run'}", f"main.model={start / 'main'}", f"sub.model={start / 'sub'}",
        f"scenario_kwargs={{num_entities: 300, seed: 0, profile: tiny, data_dir: {tmp_path / 'data'}}}",
        "questions_per_iteration=2", "group_size=2", "stages=[{split: stage2/train, iterations: 1}]",
        "limits={max_main_turns: 3, max_sub_turns: 2, max_delegations: 1}", "checkpoint=false",
    ]
    with pytest.raises(ValueError, match="no sub learner to lag"):
        Trainer(load_config(None, [*settings, f"mode={shared_mode}", "placement={kind: local, staleness: 1}"]))
    with Trainer(load_config(None, [*settings, f"mode={shared_mode}"])) as trainer:
        assert set(trainer.handles) == {"main"} and trainer.roles.clients["sub"] is trainer.roles.clients["main"]
        assert trainer.model_paths["sub"] == str(start / "main")
        history = trainer.run()
    metrics = history[0]
    records = [__import__("json").loads(line) for line in (tmp_path / "run" / "episodes.jsonl").open()]
    subs = sum(len(r["subs"]) for r in records)
    assert subs > 0  # the oracle clone's main agent delegates: the main model then plays the sub-agents
    assert metrics["main/optimizer_steps"] == 1 and "sub/optimizer_steps" not in metrics  # one learner
    assert metrics["main/samples"] > len(records)  # the main rollouts and the sub trajectories in one update
    assert "sub/reward_mean" in metrics  # the sub side scored as in M-GRPO
    assert sorted(p.name for p in (tmp_path / "run" / "workers").iterdir()) == ["main"]
    final = tmp_path / "run" / "final"
    main_model = AutoModelForCausalLM.from_pretrained(final / "main")
    sub_model = AutoModelForCausalLM.from_pretrained(final / "sub")
    for a, b in zip(main_model.parameters(), sub_model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_mode_may_name_its_own_start_for_a_role_with_a_worker():
    from mgrpo_algo.core.modes import ModeSpec

    plain = ModeSpec(("main", "sub"), ("main", "sub"), shares=(("sub", "main"),))
    fair = ModeSpec(("main", "sub"), ("main", "sub"), shares=(("sub", "main"),), start=(("main", "/starts/shared"),))
    # its own start is evaluated apart from a mode that starts from the config's models
    assert fair.start_key != plain.start_key == ("hierarchy", (("sub", "main"),))
    assert MODES["mgrpo"].start_key == ("hierarchy", ())  # modes without a start: the key as before
    for bad in ((("sub", "/x"),), (("main", "/x"), ("main", "/y")), (("main", ""),), (("single", "/x"),)):
        with pytest.raises(ValueError, match="a mode's start names a model folder once per role with a worker"):
            ModeSpec(("main", "sub"), ("main", "sub"), shares=(("sub", "main"),), start=bad)


def test_mgrpo_train_starts_a_mode_from_its_own_start(small_scenario, tmp_path):
    """``ModeSpec.start`` holds for ``mgrpo train`` as for ``mgrpo compare`` (one function picks the
    models): the mode's own folder replaces the config's ``main.model``, and the shared role gets it too."""
    from pathlib import Path

    from mgrpo_algo.core.config import load_config
    from mgrpo_algo.core.modes import MODES, ModeSpec
    from mgrpo_algo.training.trainer import Trainer, mode_model_paths

    root = Path(__file__).resolve().parents[1] / "configs"
    fair = root / "shared-warm-start" / "main"
    MODES.register("shared-start-test", ModeSpec(("main", "sub"), ("main", "sub"), shares=(("sub", "main"),),
                                                 start=(("main", str(fair)),)))
    try:
        config = load_config(None, [
            "mode=shared-start-test", f"main.model={root / 'oracle-warm-start' / 'main'}",
            f"sub.model={root / 'oracle-warm-start' / 'sub'}", f"out_dir={tmp_path / 'run'}",
            f"scenario_kwargs={{num_entities: 300, seed: 0, profile: tiny, data_dir: {small_scenario.data_dir}}}"])
        with Trainer(config) as trainer:
            assert trainer.model_paths == {"main": str(fair), "sub": str(fair)}
        assert mode_model_paths(config, trainer.scenario, "mgrpo")["main"] == str(root / "oracle-warm-start" / "main")
    finally:
        MODES.unregister("shared-start-test")
