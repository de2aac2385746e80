"""One Registry behind every name a config holds: a duplicate raises, an unknown name lists the valid
ones, and every named field of a config is checked when the config loads, with its dotted path."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import pytest
import torch
from test_learner import batch, model_dir  # noqa: F401  (the tiny model fixture)

from mgrpo_algo.core.advantages import ESTIMATORS, register_estimator
from mgrpo_algo.core.config import LearnerConfig, load_config
from mgrpo_algo.core.losses import POLICY_LOSSES, clipped_pg_loss, register_policy_loss
from mgrpo_algo.learning.learner import RoleLearner
from mgrpo_tools.registry import Registry, UnknownName


def test_registry_refuses_duplicates_and_lists_valid_names_in_order():
    reg: Registry[int] = Registry("widget")
    assert reg.register("b", 2) == 2
    reg.register("a")(1)
    with pytest.raises(ValueError, match="widget 'a' is already registered"):
        reg.register("a", 3)
    assert reg.get("a") == 1 and reg["b"] == 2  # the first registration stands
    with pytest.raises(UnknownName, match=r"^unknown widget 'c'; valid: b, a$") as info:
        reg.get("c")
    assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)
    with pytest.raises(ValueError, match=r"^config field 'x.y': unknown widget 'c'; valid: b, a$"):
        reg.check("c", "x.y")
    reg.unregister("b")
    assert reg.names() == ("a",) and list(reg) == ["a"] and "b" not in reg and len(reg) == 1


def test_registry_imports_a_string_entry_once_and_maps_an_alias_with_a_warning():
    reg: Registry[object] = Registry("thing", {"path": "pathlib:Path"}, aliases={"old": "path"})
    import pathlib

    assert reg.get("path") is pathlib.Path
    assert reg._entries["path"] is pathlib.Path  # resolved once, kept
    with pytest.warns(FutureWarning, match=r"config field 'f': thing 'old' is deprecated; use 'path'"):
        assert reg.check("old", "f") == "path"
    with pytest.raises(ValueError, match="already registered"):
        reg.register("old", 1)  # an alias is taken too
    assert reg.names() == ("path",)


@pytest.mark.parametrize(("override", "field", "valid"), [
    ("main_estimator=nope", "main_estimator", "grpo, grpo_pooled_masked"),
    ("sub_estimator=nope", "sub_estimator", "grpo, grpo_pooled_masked"),
    ("mode=nope", "mode", "mgrpo, frozen-sub, single-agent"),
    ("align_strategy=nope", "align_strategy", "duplicate, duplicate_balanced, mask"),
    ("main.learner.policy_loss=nope", "main.learner.policy_loss", "clipped"),
    ("single.learner.aggregation=nope", "single.learner.aggregation", "seq-mean-token-mean, token-mean"),
    ("placement.kind=nope", "placement.kind", "local, processes, ray"),
    ("placement.store=nope://h", "placement.store", "schemes: sqlite, redis, rediss"),
    ("sub.learner.loss_options={tau: 1}", "sub.learner.loss_options.tau", "eps_low, eps_high, kl_coef, entropy_coef"),
    ("tools={sub: [search, nope]}", "tools.sub", "valid: delegate, reason, search, visit, click"),
    ("tools={main: [delegate, visit]}", "tools.main", "only the env's own tools (delegate, reason)"),
    ("tools={single: [search, search]}", "tools.single", "a tool named twice"),
])
def test_every_name_is_checked_when_the_config_loads(override, field, valid):
    with pytest.raises(ValueError) as info:
        load_config(None, [override])
    message = str(info.value)
    assert message.startswith(f"config field '{field}': ") and valid in message and "\n" not in message


def test_a_malformed_store_spec_is_refused_at_load_without_connecting():
    with pytest.raises(ValueError, match=r"config field 'placement.store': malformed redis store spec"):
        load_config(None, ["placement.store=redis://host:port/0"])
    assert load_config(None, ["placement.store=redis://127.0.0.1:1/0"]).placement.store == "redis://127.0.0.1:1/0"


def test_a_name_registered_at_run_time_loads():
    @register_estimator("test-registry-zero")
    def zero(rewards, mask=None, *, eps=1e-6):
        return torch.zeros_like(torch.as_tensor(rewards, dtype=torch.float32))

    try:
        assert load_config(None, ["main_estimator=test-registry-zero"]).main_estimator == "test-registry-zero"
    finally:
        ESTIMATORS.unregister("test-registry-zero")
    with pytest.raises(ValueError, match="unknown advantage estimator 'test-registry-zero'"):
        load_config(None, ["main_estimator=test-registry-zero"])


def test_in_process_is_the_local_placement_under_a_deprecated_name():
    with pytest.warns(FutureWarning, match="'in-process' is deprecated; use 'local'"):
        config = load_config(None, ["placement={kind: in-process}"])
    assert config.placement.kind == "local"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the canonical name warns nothing
        assert load_config(None, ["placement.kind=local", "placement.staleness=1"]).placement.staleness == 1


def test_mgrpo_train_fails_at_load_in_one_line(capsys):
    from mgrpo_algo.cli import main

    assert main(["train", "--set", "main_estimator=nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("mgrpo: bad config: config field 'main_estimator': unknown advantage estimator 'nope'; "
                   "valid: grpo, grpo_pooled_masked")


@dataclass(frozen=True)
class _SpyOptions:
    eps_low: float = 0.2
    tau: float = 1.0


def test_a_loss_gets_its_options_from_the_learner_config(model_dir):  # noqa: F811
    """Each option from ``loss_options``, else the LearnerConfig field of the same name, else its
    default; the batch's arguments beside them; nothing else."""
    seen: list[dict] = []

    @register_policy_loss("test-spy", options=_SpyOptions)
    def spy(logp, old_logp, advantages, loss_mask, **kwargs):
        seen.append(kwargs)
        return clipped_pg_loss(logp, old_logp, advantages, loss_mask, eps_low=kwargs["eps_low"],
                               aggregation=kwargs["aggregation"], sample_weight=kwargs["sample_weight"],
                               global_normalizer=kwargs["global_normalizer"])

    try:
        loss = POLICY_LOSSES.get("test-spy")
        config = LearnerConfig(policy_loss="test-spy", eps_low=0.1, loss_options={"tau": 0.5})
        assert vars(loss.make_options(config)) == {"eps_low": 0.1, "tau": 0.5}
        assert vars(loss.make_options(LearnerConfig(policy_loss="test-spy"))) == {"eps_low": 0.2, "tau": 1.0}
        override = LearnerConfig(policy_loss="test-spy", eps_low=0.1, loss_options={"eps_low": 0.05})
        assert vars(loss.make_options(override)) == {"eps_low": 0.05, "tau": 1.0}  # loss_options wins
        with pytest.raises(ValueError, match=r"'main.learner.loss_options.eps_high': not an option of policy loss "
                                             r"'test-spy'; valid: eps_low, tau"):
            load_config(None, ["main.learner.policy_loss=test-spy", "main.learner.loss_options={eps_high: 0.3}"])
        RoleLearner("main", model_dir, LearnerConfig(**{**vars(config), "lr": 1e-3})).update(batch())
        assert seen and {k: seen[0][k] for k in ("eps_low", "tau")} == {"eps_low": 0.1, "tau": 0.5}
        assert set(seen[0]) == {"eps_low", "tau", "aggregation", "sample_weight", "ref_logp", "entropy",
                                "global_normalizer"}
    finally:
        POLICY_LOSSES.unregister("test-spy")


def test_a_registered_tool_is_shown_checked_and_built_for_its_roles():
    from mgrpo_env.core import WorldHandle
    from mgrpo_env.protocol import TOOLS, ToolSpec, parse_action, register_tool, role_tools, unregister_tool

    spec = ToolSpec("test-echo", "Echo the text.", {"type": "object", "properties": {"text": {"type": "string"}},
                                                     "required": ["text"], "additionalProperties": False})
    built: list[object] = []

    def factory(world):
        built.append(world)
        return lambda arguments: arguments["text"]

    class World:
        def make_tools(self):
            return {"search": "the world's own"}

    with pytest.raises(ValueError, match="are not roles of"):
        register_tool(spec, factory, roles=("nobody",))
    assert "test-echo" not in TOOLS
    register_tool(spec, factory, roles=("sub",))
    try:
        with pytest.raises(ValueError, match="tool 'test-echo' is already registered"):
            register_tool(spec, factory, roles=("sub",))
        assert list(role_tools(None, "sub"))[-1] == "test-echo" and "test-echo" not in role_tools(None, "single")
        ok = parse_action('<tool_call>{"name": "test-echo", "arguments": {"text": "hi"}}</tool_call>', role="sub",
                          allowed_tools=role_tools(None, "sub"))
        bad = parse_action('<tool_call>{"name": "test-echo", "arguments": {"txt": "hi"}}</tool_call>', role="sub",
                           allowed_tools=role_tools(None, "sub"))
        assert ok.ok and ok.tool_name == "test-echo" and not bad.ok  # the schema is checked on every call
        world = World()
        tools = WorldHandle(None, world).make_tools()
        assert set(tools) == {"search", "test-echo"} and built == [world] and tools["test-echo"]({"text": "x"}) == "x"
    finally:
        unregister_tool("test-echo")
    assert "test-echo" not in TOOLS and "test-echo" not in role_tools(None, "sub")
    assert set(WorldHandle(None, World()).make_tools()) == {"search"}


def test_a_runs_tool_choice_reaches_the_prompts_and_the_argument_check(small_scenario, small_world):
    """``tools`` drops reason from the main agent and click from the sub-agents: their prompts do not
    show them and a call of either is refused as a tool the role does not have; roles not named keep
    the scenario's set; a name registered at run time is valid at load."""
    from mgrpo_env.aec import MGRPOEnv
    from mgrpo_env.protocol import ToolSpec, parse_action, register_tool, unregister_tool
    from mgrpo_env.single import SingleAgentEnv

    config = load_config(None, ["tools={main: [delegate], sub: [search, visit]}"])
    env = MGRPOEnv(small_scenario, "stage2/test", world=small_world, tools=config.tools)
    default = MGRPOEnv(small_scenario, "stage2/test", world=small_world)
    assert list(env.core.tools_of["main"]) == ["delegate"] and list(env.core.tools_of["sub"]) == ["search", "visit"]
    assert list(default.core.tools_of["main"]) == ["delegate", "reason"]
    assert "reason" not in env.core.prompts["main"] and "reason" in default.core.prompts["main"]
    call = '<think>t</think><tool_call>{"name": "reason", "arguments": {"problem": "p"}}</tool_call>'
    assert parse_action(call, role="main", allowed_tools=default.core.tools_of["main"]).ok
    refused = parse_action(call, role="main", allowed_tools=env.core.tools_of["main"])
    assert not refused.ok and "reason" in refused.error
    single = SingleAgentEnv(small_scenario, "stage2/test", world=small_world, tools=config.tools)
    assert list(single.core.tools_of["single"]) == ["search", "visit", "click"]  # "single" not named: the scenario's set
    register_tool(ToolSpec("test-noop", "Nothing.", {"type": "object", "properties": {}}), lambda world: None)
    try:
        assert load_config(None, ["tools={sub: [search, test-noop]}"]).tools == {"sub": ["search", "test-noop"]}
    finally:
        unregister_tool("test-noop")


@dataclass(frozen=True)
class _CheckedOptions:
    tau: float = 1.0

    def __post_init__(self) -> None:
        if self.tau <= 0:
            raise ValueError(f"tau must be > 0, got {self.tau}")


def test_a_losss_options_refused_in_one_line_naming_the_field():
    """An options class that is no dataclass, a key the loss does not take (a loss without options says
    so), an option its dataclass refuses; the field's path defaults to 'learner'; a config without
    ``loss_options`` reads the fields of the same name; metrics merge by their declared kind."""
    import types

    from mgrpo_algo.core.losses import NoOptions, PolicyLoss

    with pytest.raises(TypeError, match=r"^policy loss 'test-bad': options must be a dataclass, got <class 'dict'>$"):
        register_policy_loss("test-bad", options=dict)
    assert "test-bad" not in POLICY_LOSSES
    bare = PolicyLoss(clipped_pg_loss, NoOptions, name="bare")
    with pytest.raises(ValueError, match=r"^config field 'learner.loss_options.tau': not an option of policy loss "
                                         r"'bare'; valid: \(none\)$"):
        bare.make_options(LearnerConfig(loss_options={"tau": 2.0}))
    checked = PolicyLoss(clipped_pg_loss, _CheckedOptions, maxima=("ratio_max",), normalised=("pg_loss",), name="checked")
    with pytest.raises(ValueError, match=r"^config field 'sub.learner.loss_options': tau must be > 0, got -1.0$"):
        checked.make_options(LearnerConfig(loss_options={"tau": -1.0}), "sub.learner")
    assert checked.make_options(types.SimpleNamespace(tau=3.0)) == _CheckedOptions(3.0)  # no loss_options field
    assert [checked.merge_kind(k) for k in ("ratio_max", "pg_loss", "clip_frac")] == ["max", "normalised", "token-mean"]
