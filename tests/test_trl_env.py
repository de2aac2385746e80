"""TRL's GRPOTrainer on the env (issue 42, part 2): the demo's start planner trained for 2 real
GRPOTrainer steps through ``environment_factory``, the sub-agents the demo's frozen start sub model
inside the environment class. The env is the OpenEnv server's own session class
(``HierarchyEnvironment``) run in this process: ``tests/test_openenv.py`` shows an episode over the
wire equals the in-process one, and a server process would cost this test half its time budget.

Checked by value: the planner's weights moved and the sub-agents' did not; every episode TRL scored
is replayed in process (``mgrpo_env.env``, the same task, the planner's sampled turns as TRL's tool
mask delimits them, the sub-agents' turns as they were stepped) and the main reward the in-process
env pays equals the reward TRL used; the ids TRL trained on are the ids the project's own policy
builds for the same chat (``ChatPrompter``: the first prompt, and each env reply between turns).
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "configs" / "demo.yaml"
SPLIT = "stage1/train"  # one-hop questions: the start answers some, so groups disagree and the planner moves
WEIGHTS = "[0.1, 0.9]"  # the paper's R_M: a well-formed wrong answer (0.1) differs from a malformed one (0)


def planner_turns(ids: list[int], keep: list[int]) -> tuple[list[list[int]], list[list[int]]]:
    """TRL's completion ids split by its tool mask: the planner's sampled turns (mask 1) and the ids
    TRL put between them (mask 0)."""
    runs: list[tuple[int, list[int]]] = []
    for token, k in zip(ids, keep, strict=True):
        if runs and runs[-1][0] == k:
            runs[-1][1].append(token)
        else:
            runs.append((k, [token]))
    return [r for k, r in runs if k], [r for k, r in runs if not k]


def test_two_grpo_trainer_steps_train_the_planner_on_the_envs_rewards(small_scenario, tmp_path, monkeypatch):
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")  # environment_factory is marked experimental in TRL 1.16
    import torch
    from safetensors.torch import load_file

    import mgrpo_env
    import mgrpo_scenarios
    from mgrpo_algo.core.config import load_config
    from mgrpo_algo.experiments.trl_env import frozen_sub_trainer, local_env_spec, split_task_ids
    from mgrpo_algo.policies.chat_tokens import ChatPrompter
    from mgrpo_env.core import RewardConfig

    # the demo's run (start models, learner, generation, limits) on the session's small world
    config = load_config(str(DEMO), [
        f"scenario_kwargs={{num_entities: 300, seed: 0, profile: tiny, data_dir: {small_scenario.data_dir}}}",
        "questions_per_iteration=2", "group_size=4", f"main_weights={WEIGHTS}",
    ])
    scenario = mgrpo_scenarios.get(config.scenario, **config.scenario_kwargs)
    task_ids = split_task_ids(config, SPLIT)[:4]
    with scenario.open() as world:
        trainer = frozen_sub_trainer(local_env_spec(config, SPLIT, scenario, world), config, task_ids,
                                     output_dir=str(tmp_path / "trl"), max_steps=2)
        sub_model = trainer._environment_pool[None][0]._sub_policy.model
        planner_start = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}

        scored = []  # every episode TRL scored: its ids, the reward TRL used, the sub-agents' turns
        generate_and_score = trainer._generate_and_score_completions

        def capture(inputs):
            out = generate_and_score(inputs)
            rewards = list(trainer._logs["rewards"]["main_reward"])  # what TRL's advantages were computed from
            for i, env in enumerate(trainer.environments):
                n = int(out["completion_mask"][i].sum())
                scored.append({"task_id": env.task_id, "reward": rewards[i], "subs": dict(env.sub_turns),
                               "end": env.end, "ids": out["completion_ids"][i][:n].tolist(),
                               "keep": out["tool_mask"][i][:n].tolist(),
                               "prompt": out["prompt_ids"][i][out["prompt_mask"][i].bool()].tolist()})
            return out

        trainer._generate_and_score_completions = capture
        trainer.train()

        assert len(scored) == 2 * 2 * 4
        # the planner moved, by value; the frozen sub model is the start's, bit for bit, and not the planner
        assert [k for k, v in trainer.model.named_parameters() if not torch.equal(v, planner_start[k])], \
            "no planner weight changed in two GRPOTrainer steps"
        sub = trainer._environment_pool[None][0]._sub_policy.model
        assert sub is sub_model and sub is not trainer.model
        sub_state = sub.state_dict()
        for name, value in load_file(str(Path(config.sub.model) / "model.safetensors")).items():
            assert torch.equal(sub_state[name], value), name
        assert len({s["reward"] for s in scored}) > 1  # groups disagreed: the steps had a signal

        # every episode again in process with the same actions: the env's main reward is the one TRL used
        tokenizer = trainer.processing_class
        prompter = ChatPrompter(tokenizer)
        env = mgrpo_env.env(scenario=scenario, split=SPLIT, world=world, limits=config.limits,
                            rewards=RewardConfig(main_weights=tuple(config.main_weights)))
        raw = env.unwrapped
        finished = 0
        for episode in scored:
            turns, gaps = planner_turns(episode["ids"], episode["keep"])
            texts = [tokenizer.decode(t, skip_special_tokens=False, clean_up_tokenization_spaces=False) for t in turns]
            subs = {agent: list(actions) for agent, actions in episode["subs"].items()}
            env.reset(options={"task_id": episode["task_id"]})
            assert episode["prompt"] == prompter.first_prompt(raw.infos["main_0"]["messages"])
            planner = iter(texts)
            while not raw.record.end_reason:
                agent = raw.agent_selection
                text = next(planner, None) if agent == "main_0" else subs[agent].pop(0)
                if text is None:
                    break  # TRL ended the episode while the env waits for the planner
                env.step(text)
            # between two turns, TRL fed the ids the project's policy appends for the env's reply
            replies = raw.trajectory("main_0").messages[3::2]
            for turn, gap, reply in zip(turns, gaps, replies, strict=False):
                assert gap == prompter.continuation(turn, [reply]), episode
            if raw.record.end_reason:
                finished += 1
                assert episode["reward"] == pytest.approx(raw.record.rewards["main_0"]), episode
            else:  # the env would go on: only after a malformed turn, which pays R_M = 0 whatever follows
                assert raw.trajectory("main_0").format_errors > 0 and episode["reward"] == 0.0, episode
        assert finished >= len(scored) // 2


def _canonical(name: str, arguments: dict) -> str:
    import json

    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


@pytest.mark.parametrize("sampled, end, paid", [
    # what TRL sampled is what the env was stepped with (the think aside): the env's pay
    ("<think>plan</think>" + _canonical("delegate", {"task": "Who founded Velmora Press?"}), "env", 0.1),
    # as many turns, but the first asked another subtask than the one the env ran: 0, counted as cut
    ("<think>plan</think>" + _canonical("delegate", {"task": "Who founded Another Press?"}), "cut", 0.0),
    ("<think>plan</think>" + _canonical("reason", {"problem": "Who founded Velmora Press?"}), "cut", 0.0),
])
def test_a_sampled_turn_unlike_the_stepped_one_pays_nothing_and_counts_as_cut(small_scenario, small_world, sampled,
                                                                              end, paid):
    """``FrozenSubEnv._finish`` by value, without TRL: the server session is stepped by the tool method
    (its canonical call), then TRL's sampled turns are checked against it turn by turn, not by count."""
    from mgrpo_algo.experiments.trl_env import FrozenSubEnv
    from mgrpo_env.openenv_server import EnvSpec, HierarchyEnvironment

    spec = EnvSpec(small_scenario, "stage2/test", small_world)
    task_id = next(iter(small_scenario.tasks("stage2/test"))).id
    system = HierarchyEnvironment(spec).reset(task_id=task_id).messages[0]
    env = FrozenSubEnv(spec, lambda requests: ["<think>r</think><result>nothing found</result>"] * len(requests))
    env.reset(task_id=task_id, prompt=[system, {"role": "user", "content": ""}])
    assert "nothing found" in env.delegate(task="Who founded Velmora Press?")  # the env ran this subtask
    cut, ends = FrozenSubEnv.cut, dict(FrozenSubEnv.ends)
    # the planner's last turn (an answer) is stepped as sampled: the env ends, a wrong well-formed answer
    reward = env._finish([sampled, "<think>done</think><answer>Nobody</answer>"])
    assert env.done and env.record["end_reason"] == "answer" and env.record["rewards"]["main_0"] == pytest.approx(0.1)
    assert (env.end, reward, FrozenSubEnv.cut - cut) == (end, pytest.approx(paid), int(end == "cut"))
    assert FrozenSubEnv.ends == {**ends, end: ends.get(end, 0) + 1}  # every ending counted, by kind


class _RecordingSub:
    """A frozen sub policy that reports at once, keeps every request it read and every release."""

    def __init__(self, report: str = "<think>r</think><result>nothing found</result>") -> None:
        self.report, self.requests, self.released = report, [], []

    def __call__(self, requests):
        from mgrpo_env.rollout import PolicyResponse

        self.requests += requests
        return [PolicyResponse(self.report, {"n": len(self.requests)}) for _ in requests]

    def release(self, episode: int, agent: str) -> None:
        self.released.append((episode, agent))


def _frozen_env(scenario, world, sub, weights=None, terms=(), **env_kwargs):
    from mgrpo_algo.experiments.trl_env import FrozenSubEnv
    from mgrpo_env.openenv_server import EnvSpec, HierarchyEnvironment

    spec = EnvSpec(scenario, "stage2/test", world, env_kwargs.pop("limits", None), env_kwargs)
    task = next(iter(scenario.tasks("stage2/test")))
    system = HierarchyEnvironment(spec).reset(task_id=task.id).messages[0]
    return FrozenSubEnv(spec, sub, weights, iter(range(7, 10)), terms), task, [system, {"role": "user", "content": ""}]


def test_the_trl_environments_episode_by_value(small_scenario, small_world, monkeypatch):
    """FrozenSubEnv's own steps, without TRL: the question it hands TRL, the sub-agents it plays (what their
    policy reads, the history it keeps, the release), the pay with and without the config's weights, and
    what it refuses (a dataset prompt that is not the env's, a tool after the end)."""
    from mgrpo_env.core import Limits, RewardConfig

    sub = _RecordingSub()
    env, task, prompt = _frozen_env(small_scenario, small_world, sub)
    with pytest.raises(ValueError, match="the dataset's prompt is not the env's system prompt"):
        env.reset(task_id=task.id, prompt=[prompt[0], {"role": "user", "content": "not empty"}])
    assert env.reset(task_id=task.id, prompt=prompt) == task.question  # what TRL appends to the user turn
    assert (env.reward, env.end, env.done, env.record) == (0.0, "", False, None)
    reply = env.delegate(task="Who founded Ünïcode Press?", context="a fact")
    assert "nothing found" in reply and env.sub_turns == {"sub_0": [sub.report]}
    (request,) = sub.requests
    # episode 8: the refused reset above took 7 (each reset draws its own policy keys)
    assert (request.episode, request.agent, request.role, request.task) == (8, "sub_0", "sub", None)
    assert request.observation == request.messages[-1]["content"] and "Ünïcode Press" in request.observation
    assert request.messages[0]["role"] == "system" and request.history == [{"n": 1}]  # its own extras, kept
    assert sub.released == [(8, "sub_0")]  # the sub-agent reported: its policy state is let go
    # the env was stepped with the call written canonically (non-ASCII kept as it is)
    assert env._main_texts == ['<tool_call>{"name": "delegate", "arguments": {"task": "Who founded Ünïcode Press?", '
                               '"context": "a fact"}}</tool_call>']
    thought = env.reason(problem="which press is older?")
    assert env._main_texts[-1] == '<tool_call>{"name": "reason", "arguments": {"problem": "which press is older?"}}</tool_call>'
    assert thought and not env.done
    answer = f"<think>a</think><answer>{task.answer}</answer>"
    assert env._finish([*env._main_texts, answer]) == 1.0 and env.end == "env"  # right, the server's own pay
    with pytest.raises(ValueError, match="^the episode is over$"):
        env.delegate(task="again")
    # the config's weights: R_M from the env's parts (format ok, correct), not the server's reward
    for weights, text, paid in (((0.3, 0.7), task.answer, 1.0), ((0.3, 0.7), "Nobody", 0.3), ((0.0, 1.0), "Nobody", 0.0)):
        env, task, prompt = _frozen_env(small_scenario, small_world, _RecordingSub(), weights)
        env.reset(task_id=task.id, prompt=prompt)
        assert env._finish([f"<think>a</think><answer>{text}</answer>"]) == pytest.approx(paid), (weights, text)
        assert env.record["components"]["main_0"]["format_ok"] and env.end == "env"
    # the run's extra terms of the main agent, paid on top (root_pay over the env's reward inputs: 1 turn)
    from mgrpo_env.rewards import REWARD_TERMS

    REWARD_TERMS.register("per_turn", lambda inputs: inputs["turns"])
    try:
        env, task, prompt = _frozen_env(small_scenario, small_world, _RecordingSub(), (0.3, 0.7), (("per_turn", 0.25),))
        env.reset(task_id=task.id, prompt=prompt)
        assert env._finish([f"<think>a</think><answer>{task.answer}</answer>"]) == pytest.approx(1.25)
    finally:
        REWARD_TERMS.unregister("per_turn")
    # TRL stopped while the env still waits for the planner (a turn TRL ran and nothing after): 0, cut
    env, task, prompt = _frozen_env(small_scenario, small_world, _RecordingSub(), (0.3, 0.7))
    env.reset(task_id=task.id, prompt=prompt)
    env.delegate(task="Who founded Velmora Press?")
    assert (env._finish(list(env._main_texts)), env.end, env.done) == (0.0, "cut", False)
    assert len(env._main_texts) == 1  # nothing stepped on TRL's behalf
    # a malformed sampled turn: 0 whatever the env paid, counted under its own name
    monkeypatch.setattr(type(env), "ends", {})
    env, task, prompt = _frozen_env(small_scenario, small_world, _RecordingSub(), (0.3, 0.7))
    env.reset(task_id=task.id, prompt=prompt)
    assert env._finish([f"no tags {task.answer}"]) == 0.0 and env.end == "malformed" and type(env).ends == {"malformed": 1}
    # the server's own pay when no weights are given, a 0 included (R_M weights [0, 1], a wrong answer)
    env, task, prompt = _frozen_env(small_scenario, small_world, _RecordingSub(), rewards=RewardConfig(main_weights=(0.0, 1.0)))
    env.reset(task_id=task.id, prompt=prompt)
    assert env._finish(["<think>a</think><answer>Nobody</answer>"]) == 0.0 and env.end == "env"
    assert type(env).ends == {"malformed": 1, "env": 1}
    # a tool call that ends the episode (the main agent's last turn): the tool says the episode is over
    env, task, prompt = _frozen_env(small_scenario, small_world, _RecordingSub(), limits=Limits(max_main_turns=1))
    env.reset(task_id=task.id, prompt=prompt)
    with pytest.raises(ValueError, match="^the episode is over$"):
        env.delegate(task="Who founded Velmora Press?")
    assert env.done and env.record["end_reason"] == "main_turn_limit"
