"""TRL's GRPOTrainer on the mgrpo env: the planner (``main_0``) trained by TRL, the sub-agents frozen
policies inside the environment (TRL's own version of the frozen-sub baseline).

The integration TRL's docs recommend for multi-turn environments (its OpenEnv guide,
"``environment_factory`` vs ``rollout_func``"): ``environment_factory``, an environment class whose
public methods are the model's tools, with TRL running generation, tool-call parsing and the turn loop
(``rollout_func`` is for an external server that owns the generation loop). Here the class wraps the
env served over OpenEnv (``mgrpo serve-env``, :class:`mgrpo_env.openenv_client.MGRPOEnvClient`): its
tools are the main agent's, ``delegate(task, context)`` and ``reason(problem)``; a delegation steps
``main_0`` on the server, then plays the new ``sub_<n>`` with the frozen sub policy until the report
comes back, which is the tool's result.

The tiny models speak the agent protocol (``<tool_call>{json}</tool_call>``, ``<answer>``) through a
ChatML template without tool calling. :func:`prepare_planner` gives the planner's tokenizer a
template that renders the same text for the same chat and renders TRL's tool messages as the env's
user turns, so the ids TRL builds (the prompt, the sampled ids, then each tool result's suffix) are
the ids the project's own policy builds (``chat_tokens.ChatPrompter``); generation stops at the
protocol's closing tags, as the project's policy does.

TRL hands a tool only its parsed arguments, never the turn's text, so the server is stepped with the
call written canonically; when the episode is over, :func:`main_reward_func` reads each turn's
sampled text from TRL's completion ids, parses it with the env's parser and pays the env's main
reward only when every turn is what the env was stepped with (a malformed turn pays 0 in the env
too: R_M needs every main turn well-formed). An episode TRL ends while the env still expects the
planner (a turn TRL could not parse that the env would run) pays 0 and is counted
(``FrozenSubEnv.cut``).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "TOOL_CHAT_TEMPLATE",
    "RESPONSE_TEMPLATE",
    "FrozenSubEnv",
    "prepare_planner",
    "stop_ids",
    "main_turn_texts",
    "main_reward_func",
    "task_dataset",
    "local_env_spec",
    "split_task_ids",
    "frozen_sub_trainer",
]

#: The ChatML the tiny models were trained on (``configs/demo-warm-start/*/chat_template.jinja``) plus
#: tool calling: an assistant turn with tool calls is its content then each call as the protocol's
#: ``<tool_call>{json}</tool_call>`` (no ``<|im_end|>``: the env's turn ends at the closing tag, and
#: the end of turn comes with what follows); a tool message is the env's next user turn, closing the
#: assistant turn first. The same text as the plain template for every chat without tool messages.
TOOL_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' + (message['content'] or '') }}"
    "{%- if message['tool_calls'] %}"
    "{%- for call in message['tool_calls'] %}"
    "{%- set fn = call['function'] if call['function'] is defined else call %}"
    "{{- '<tool_call>' + ({'name': fn['name'], 'arguments': fn['arguments']} | tojson) + '</tool_call>' }}"
    "{%- endfor %}"
    "{%- else %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.previtem['role'] == 'assistant' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{{- '<|im_start|>user\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

#: transformers' response template for that chat: the text before the first ``<tool_call>`` is the
#: content (think included), each ``<tool_call>{json}</tool_call>`` a call.
RESPONSE_TEMPLATE: dict[str, Any] = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {"open": "<tool_call>", "close_pattern": r"</tool_call>\s*", "repeats": True,
                       "content": "json", "transform": {"type": "function", "function": "{content}"}},
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}

# the suffix TRL appends after a tool call (TOOL_CHAT_TEMPLATE's tool message and generation prompt)
_TOOL_SUFFIX = re.compile(r"<\|im_end\|>\n<\|im_start\|>user\n.*?<\|im_end\|>\n<\|im_start\|>assistant\n", re.DOTALL)


def stop_ids(tokenizer: Any) -> list[int]:
    """The ids a turn stops at, as the project's policy stops (``chat_tokens.stop_spec``): the protocol's
    closing tags, end of turn, end of text."""
    from ..policies.chat_tokens import stop_spec

    return list(stop_spec(tokenizer).token_ids)


def prepare_planner(model_dir: str) -> tuple[Any, Any]:
    """The planner's model and tokenizer from ``model_dir`` (a warm start's ``main`` folder), ready for
    ``GRPOTrainer(environment_factory=...)``: the tool-calling template and its response template
    on the tokenizer, the protocol's stop ids as the model's end of generation."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    tokenizer.response_template = RESPONSE_TEMPLATE
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32")
    model.generation_config.eos_token_id = stop_ids(tokenizer)
    return model, tokenizer


def main_turn_texts(tokenizer: Any, completion_ids: Sequence[int]) -> list[str]:
    """Each main-agent turn's text, as the project's policy decodes it, from the ids of a TRL
    completion (the turns with each tool result's suffix between them)."""
    text = tokenizer.decode(list(completion_ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)
    return _TOOL_SUFFIX.split(text)


def _canonical_call(name: str, arguments: dict[str, Any]) -> str:
    """A tool call as the protocol writes it (the text the server is stepped with)."""
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "</tool_call>"


def _same_action(a: Any, b: Any) -> bool:
    """Two parsed turns that the env treats alike (kind, tool, arguments, final text, error kind)."""
    return (a.kind, a.tool_name, a.arguments, a.content, a.error_kind) == \
           (b.kind, b.tool_name, b.arguments, b.content, b.error_kind)


class FrozenSubEnv:
    """One episode of the hierarchy for TRL (``environment_factory``): the planner's tools are the
    public methods; the sub-agents are played inside by a frozen policy.

    Args:
        env: the ``mgrpo serve-env`` server's URL (the hierarchy), or an
            :class:`mgrpo_env.openenv_server.EnvSpec` to run the server's own sessions in this process
            (no transport; :func:`local_env_spec`).
        sub_policy: the frozen sub-agents' policy (``mgrpo_env.rollout.Policy``, e.g. a
            ``TransformersPolicy`` of the warm start's ``sub``); never trained here.
        main_weights: (a1, a2) of R_M, paid with ``main_terms`` (the run's extra terms of the main agent,
            ``mgrpo_env.rewards.root_pay`` over the reward inputs the env emits). None: the server's own reward.
        episode_ids: a shared counter: each episode's sub-agents get their own policy keys (KV caches).
    """

    #: episodes TRL ended while the env still expected the planner (paid 0), over every instance
    cut = 0
    #: every scored episode's ending over every instance: "env", "cut" or "malformed" -> count
    ends: dict[str, int] = {}

    def __init__(self, env: Any, sub_policy: Any, main_weights: Sequence[float] | None = None,
                 episode_ids: Any = None, main_terms: Sequence[tuple[str, float]] = ()) -> None:
        self._client = _client(env)
        self._sub_policy = sub_policy
        self._main_weights = tuple(main_weights) if main_weights is not None else None
        self._main_terms = tuple(main_terms)
        self._episode_ids = episode_ids if episode_ids is not None else itertools.count()
        self._result: Any = None
        self._main_texts: list[str] = []  # the texts main_0 was stepped with, in order
        self.task_id: str | None = None
        self.reward = 0.0
        self.done = False
        self.record: dict[str, Any] | None = None
        self.end = ""  # "env" (the env ended it), "cut" (TRL did), "malformed" (a turn the env refuses)
        self.sub_turns: dict[str, list[str]] = {}  # each sub-agent's texts in this episode, as stepped

    # -- TRL's hooks ----------------------------------------------------------------------------

    def reset(self, **kwargs: Any) -> str | None:
        """A new episode on the dataset row's task (``task_id``). The row's prompt is the env's
        system prompt and an empty user turn (:func:`task_dataset`); the question returned here is
        what TRL appends to that turn, so the planner reads the env's first chat."""
        self.task_id = kwargs["task_id"]
        self._result = self._client.reset(task_id=self.task_id)
        self._main_texts, self.reward, self.done, self.record, self.end = [], 0.0, False, None, ""
        self.sub_turns = {}
        self._episode = next(self._episode_ids)
        messages = self._result.observation.messages
        prompt = [dict(m) for m in kwargs.get("prompt") or []]
        if len(messages) != 2 or prompt != [messages[0], {**messages[1], "content": ""}]:
            raise ValueError(f"task {self.task_id}: the dataset's prompt is not the env's system prompt and a "
                             f"user turn: {prompt!r} against {messages!r}")
        return messages[1]["content"]

    def delegate(self, task: str, context: str | None = None) -> str:
        """Start a sub-agent on a self-contained subtask; its report comes back as the tool response.

        Args:
            task: the subtask, stated so it can be done alone.
            context: facts the sub-agent needs (optional).

        Returns:
            The sub-agent's report, or what went wrong.
        """
        arguments: dict[str, Any] = {"task": task}
        if context is not None:
            arguments["context"] = context
        return self._main_call("delegate", arguments)

    def reason(self, problem: str) -> str:
        """Think through a sub-problem in depth (no web access); the reasoning comes back as the tool response.

        Args:
            problem: the sub-problem.

        Returns:
            The reasoning, or what went wrong.
        """
        return self._main_call("reason", {"problem": problem})

    # -- the episode ----------------------------------------------------------------------------

    def _main_call(self, name: str, arguments: dict[str, Any]) -> str:
        if self.done:
            raise ValueError("the episode is over")
        text = _canonical_call(name, arguments)
        self._step_main(text)
        if self.done:
            raise ValueError("the episode is over")
        return self._result.observation.text  # main_0's next user turn: the <tool_response>

    def _step_main(self, text: str) -> None:
        from mgrpo_env.openenv_types import AgentAction

        self._main_texts.append(text)
        self._result = self._client.step(AgentAction(agent="main_0", text=text))
        self._play_subs()
        self._settle()

    def _play_subs(self) -> None:
        """Step every sub-agent the delegation started with the frozen policy until main_0 acts again."""
        from mgrpo_env.openenv_types import AgentAction
        from mgrpo_env.rollout import PolicyRequest, PolicyResponse

        history: dict[str, list[dict[str, Any]]] = {}
        obs = self._result.observation
        while not self._result.done and obs.agent != "main_0":
            agent = obs.agent
            request = PolicyRequest(episode=self._episode, agent=agent, role="sub", observation=obs.text,
                                    messages=[dict(m) for m in obs.messages], task=None,  # type: ignore[arg-type]
                                    history=history.setdefault(agent, []))
            response = self._sub_policy([request])[0]
            text = response.text if isinstance(response, PolicyResponse) else str(response)
            if isinstance(response, PolicyResponse):
                history[agent].append(response.extra)
            self.sub_turns.setdefault(agent, []).append(text)
            self._result = self._client.step(AgentAction(agent=agent, text=text))
            obs = self._result.observation
            if obs.agent != agent:
                release = getattr(self._sub_policy, "release", None)
                if release is not None:
                    release(self._episode, agent)

    def _settle(self) -> None:
        if self._result.done:
            obs = self._result.observation
            self.done, self.record = True, obs.record
            components = obs.reward_components.get("main_0", {})
            if self._main_weights is None:
                self.reward = float(self._result.reward or 0.0)
            else:
                from mgrpo_env.rewards import root_pay

                self.reward = root_pay(components, self._main_weights, self._main_terms)  # the env's inputs

    def _finish(self, turns: list[str]) -> float:
        """The episode's main reward once TRL is done with it: ``turns`` are the planner's sampled texts.

        The last turn, when the env has not seen it, is stepped as sampled; every turn must parse as
        the env parsed what it was stepped with, else the episode pays 0 (a malformed turn pays 0 in
        the env as well)."""
        from mgrpo_env.protocol import MAIN_TOOLS, parse_action

        def parse(text: str) -> Any:
            return parse_action(text, role="main", allowed_tools=MAIN_TOOLS)

        if not self.done and len(turns) == len(self._main_texts) + 1:
            self._step_main(turns[-1])
        raw = [parse(t) for t in turns]
        seen = [parse(t) for t in self._main_texts]
        if any(not p.ok for p in raw):
            self.end, self.reward = "malformed", 0.0
        elif len(raw) != len(seen) or not all(_same_action(a, b) for a, b in zip(raw, seen, strict=True)) \
                or not self.done:
            self.end, self.reward = "cut", 0.0
            type(self).cut += 1
        else:
            self.end = "env"
        type(self).ends[self.end] = type(self).ends.get(self.end, 0) + 1
        return self.reward

    def _close(self) -> None:
        """End the connection (the next ``reset`` opens a new session; each ``reset`` does anyway)."""
        with contextlib.suppress(Exception):  # best effort: the server may be gone
            self._client.close()


class _LocalClient:
    """The sync client's ``reset`` / ``step`` on the server's own session class in this process: a
    fresh session (:class:`~mgrpo_env.openenv_server.HierarchyEnvironment`) per episode, as over the wire."""

    def __init__(self, spec: Any) -> None:
        self._spec = spec
        self._session: Any = None

    def _result(self, observation: Any) -> Any:
        from mgrpo_env.openenv_types import StepResult

        return StepResult(observation=observation, reward=observation.reward, done=observation.done)

    def reset(self, **kwargs: Any) -> Any:
        from mgrpo_env.openenv_server import HierarchyEnvironment

        self.close()
        self._session = HierarchyEnvironment(self._spec)
        return self._result(self._session.reset(**kwargs))

    def step(self, action: Any) -> Any:
        return self._result(self._session.step(action))

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    def __enter__(self) -> _LocalClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _client(env: Any) -> Any:
    """A sync client of the env: over OpenEnv for a URL, else in process on an ``EnvSpec``."""
    if isinstance(env, str):
        from mgrpo_env.openenv_client import MGRPOEnvClient

        return MGRPOEnvClient(env).sync()
    return _LocalClient(env)


def local_env_spec(config: Any, split: str, scenario: Any, world: Any) -> Any:
    """The server's session spec for ``config``'s env (``mgrpo serve-env --config`` builds the same):
    ``scenario`` and its open ``world``, the split, the limits, the rewards."""
    from mgrpo_env.openenv_server import EnvSpec

    from ..training.trainer import env_options, reward_config

    options = env_options(config, reward_config(config, scenario))
    limits = options.pop("limits")
    return EnvSpec(scenario, split, world, limits, options)


def main_reward_func(tokenizer: Any) -> Callable[..., list[float]]:
    """TRL's reward function: each rollout's main reward from its :class:`FrozenSubEnv`
    (``environments``), the planner's turns read from ``completion_ids``."""

    def main_reward(environments: list[FrozenSubEnv], completion_ids: list[list[int]], **_: Any) -> list[float]:
        return [env._finish(main_turn_texts(tokenizer, ids)) for env, ids in zip(environments, completion_ids, strict=True)]

    return main_reward


def task_dataset(env: Any, task_ids: Sequence[str]) -> Any:
    """TRL's dataset: a row per task (``task_id``), its prompt the env's system prompt for the
    planner and an empty user turn, which ``FrozenSubEnv.reset`` fills with the task's question (one
    session, not one per task)."""
    from datasets import Dataset

    with _client(env) as client:
        system = dict(client.reset(task_id=task_ids[0]).observation.messages[0])
    prompt = [system, {"role": "user", "content": ""}]
    return Dataset.from_dict({"prompt": [prompt] * len(task_ids), "task_id": list(task_ids)})


def split_task_ids(config: Any, split: str) -> list[str]:
    """The ids of ``split``'s tasks in the scenario ``config`` names (its world is not opened)."""
    import mgrpo_scenarios

    return [task.id for task in mgrpo_scenarios.get(config.scenario, **config.scenario_kwargs).tasks(split)]


def frozen_sub_trainer(env: Any, config: Any, task_ids: Sequence[str], *, output_dir: str, max_steps: int,
                       seed: int | None = None, max_completion_length: int = 2048, **grpo_overrides: Any) -> Any:
    """TRL's ``GRPOTrainer`` for the planner of ``config`` (a :class:`~mgrpo_algo.core.config.TrainConfig`:
    the start models ``main.model`` and ``sub.model``, the main learner's settings, K, questions per
    iteration, the main reward's weights, the limits) on the env (``env``: a served one's URL, or an
    ``EnvSpec`` from :func:`local_env_spec`), the sub-agents the
    frozen ``sub.model`` sampling as the project's rollouts do. One optimizer step per
    ``questions_per_iteration`` x ``group_size`` rollouts, as an iteration of ``mgrpo train``."""
    from trl import GRPOConfig, GRPOTrainer

    from ..core.seeding import policy_seed
    from ..policies.factory import make_policy

    seed = config.seed if seed is None else seed
    model, tokenizer = prepare_planner(str(config.main.model))
    sub_policy = make_policy("sub", str(config.sub.model), str(config.sub.model), config.sub,
                             seed=policy_seed(seed, "sub", 0))
    sub_policy.model.requires_grad_(False)  # frozen: nothing may train it (TRL's optimizer never sees it)
    counter = itertools.count()
    weights, terms = tuple(config.main_weights), config.role_terms("main")

    def environment() -> FrozenSubEnv:
        return FrozenSubEnv(env, sub_policy, weights, counter, terms)

    dataset = task_dataset(env, task_ids)
    learner, generation = config.main.learner, config.main.generation
    batch = config.questions_per_iteration * config.group_size
    args = GRPOConfig(**{
        "output_dir": output_dir, "max_steps": max_steps, "seed": seed, "use_cpu": True, "report_to": "none",
        "save_strategy": "no", "logging_steps": 1, "per_device_train_batch_size": batch,
        "gradient_accumulation_steps": 1, "num_generations": config.group_size,
        "learning_rate": learner.lr, "lr_scheduler_type": "constant", "warmup_steps": 0,
        "weight_decay": learner.weight_decay, "adam_beta1": learner.betas[0], "adam_beta2": learner.betas[1],
        "adam_epsilon": learner.adam_eps, "max_grad_norm": learner.max_grad_norm or 0.0,
        "epsilon": learner.eps_low, "epsilon_high": learner.eps_high, "beta": learner.kl_coef,
        "loss_type": "grpo",  # per-sequence token mean, then the mean over sequences (our "seq-mean")
        "temperature": generation.temperature, "top_p": generation.top_p, "top_k": 0,
        "generation_kwargs": {"max_new_tokens": generation.max_new_tokens},
        "max_completion_length": max_completion_length,
        "max_tool_calling_iterations": config.limits.max_main_turns - 1,  # then the env's last main turn
        "bf16": False, "fp16": False, "dataloader_num_workers": 0,
        **grpo_overrides,
    })
    return GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=main_reward_func(tokenizer),
                       args=args, train_dataset=dataset, environment_factory=environment)
