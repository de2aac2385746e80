"""A role worker's evaluation: its current weights, wherever they live, under the evaluation's settings.

``mgrpo compare`` evaluates a run's roles through their workers (any placement): :meth:`begin` builds
an evaluation policy over the worker's current model with the evaluation's seed, temperature and
token budget; :meth:`act` answers requests, keeping each agent's chat and token history here as collection
keeps it in :class:`~mgrpo_algo.training.trajectories.Trajectories`; :meth:`release` frees an agent.
Nothing of an evaluation reaches the worker's training state.
"""

from __future__ import annotations

from typing import Any

from mgrpo_env.turn_requests import ChatKeeper, TurnRequest

from .trajectories import trajectory_key

__all__ = ["RoleEvaluation"]


class RoleEvaluation:
    """The evaluation side of one role worker (see the module docstring)."""

    def __init__(self, role: str, model_path: str, spec: Any) -> None:
        self.role, self.model_path, self.spec = role, model_path, spec
        self.policy: Any = None
        self.history: dict[str, list[dict[str, Any]]] = {}
        self.chats = ChatKeeper()

    def begin(self, model: Any, seed: int, temperature: float, max_new_tokens: int) -> None:
        """A fresh evaluation policy over ``model`` (the learner's, or the policy's when frozen)."""
        from ..policies.factory import make_policy

        if not hasattr(model, "generate"):  # a served role's policy names its engine's model: load the start
            model = self.model_path
        self.policy = make_policy(self.role, model, self.model_path, self.spec, seed=seed, temperature=temperature,
                                  max_new_tokens=max_new_tokens, served=False, evaluation=True)
        self.history = {}
        self.chats.clear()

    def act(self, turns: list[TurnRequest]) -> list[str]:
        """Evaluation actions, as text (``turns`` carry only their agents' new messages)."""
        if self.policy is None:
            raise RuntimeError(f"{self.role} worker: begin_eval was not called before eval_act")
        requests = [self.chats.expand(turn, self.history.get(trajectory_key(turn.episode, turn.agent), []))
                    for turn in turns]
        responses = self.policy(requests)
        for request, response in zip(requests, responses, strict=True):
            self.history.setdefault(trajectory_key(request.episode, request.agent), []).append(response.extra)
        texts = [response.text for response in responses]
        self.chats.answered(requests, texts)
        return texts

    def release(self, episode: int, agent: str) -> None:
        self.history.pop(trajectory_key(episode, agent), None)
        self.chats.release(episode, agent)
        if hasattr(self.policy, "release"):
            self.policy.release(episode, agent)
