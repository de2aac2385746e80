"""Role servers: one role's policy, learner and token trajectories, on its own server.

This is the paper's deployment (section 4.2): the main agent and the sub-agents are trained on
separate servers. A :class:`RoleServer` generates its role's actions (``act``), keeps the token
trajectories it sampled (they never leave it), and updates its learner from the rewards it is
told. No gradient and no trajectory crosses between roles; what crosses is minimal statistics
through the shared store (:mod:`mgrpo_algo.distributed.store`): the main server publishes, per rollout, its
correctness and format flag; the sub server waits for them before it applies an iteration
(synchronized) or lags behind them (stale). Rewards and advantages are not computed here: the env
pays R_M and R_S once, the loop scores the batch once (:mod:`mgrpo_algo.core.scoring`), and each server
gets its slots (keys and advantages).

Fault tolerance, per iteration t:

1. ``begin_collect(t)`` reseeds the policy with ``policy_seed(seed, role, t)`` and drops t's rollouts;
   ``act`` fills an in-memory buffer; ``commit(t)`` writes it to the server's disk (atomic). A server
   lost before commit loses only iteration t's rollouts: the controller calls ``begin_collect(t)`` on
   both servers and re-collects them, drawing the same tokens (sampling is keyed by seed, role,
   iteration and call, never by what a process sampled before).
2. ``update_main(t)`` publishes the statistics (idempotent: the same values again are a no-op),
   updates, checkpoints, records ``last_applied = t``, marks t done. ``update_sub`` applies pending
   iterations whose main statistics are complete. The checkpoint carries ``last_applied`` itself (its
   ``learner.json`` ``extra``), so the atomic checkpoint rename is the commit point: a server killed
   anywhere in 2 restarts from its checkpoint, finds t's committed buffer on disk and redoes exactly
   the missing work; an iteration at or below ``last_applied`` is never applied twice.

Crash tests kill a server at named points with ``MGRPO_FAULT`` (:mod:`mgrpo_algo.core.faults`; markers
in the server's folder keep a restarted server from firing the same point again).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

__all__ = ["RoleServer"]


class RoleServer:
    """One role ("main" or "sub") of a decoupled M-GRPO run.

    Args:
        role: "main" or "sub".
        model: path or name of the role's model (``from_pretrained``); the tokenizer comes from it.
        checkpoint_dir: this server's own folder (checkpoint, committed buffers, state).
        store: a store spec for :func:`mgrpo_algo.distributed.store.open_store` (``sqlite:PATH``, ``redis://...``).
        learner, generation: fields of ``LearnerConfig`` and ``GenerationConfig``.
        seed: the run's seed (the policy's sampling seed follows :func:`mgrpo_algo.training.trainer.policy_seed`).
        train: False for a frozen role (generates, never updates).
    """

    def __init__(
        self,
        role: str,
        model: str,
        checkpoint_dir: str,
        store: str,
        *,
        learner: dict[str, Any] | None = None,
        generation: dict[str, Any] | None = None,
        seed: int = 0,
        torch_threads: int = 1,
        train: bool = True,
        store_timeout_s: float = 120.0,
    ) -> None:
        import torch
        import transformers

        from ..core.config import GenerationConfig, LearnerConfig
        from ..core.faults import FaultPoints
        from ..core.seeding import policy_seed
        from ..distributed.store import open_store
        from ..learning.learner import RoleLearner
        from ..policies.hf_policy import TransformersPolicy

        if role not in ("main", "sub"):
            raise ValueError(f"role must be 'main' or 'sub', got {role!r}")
        transformers.utils.logging.disable_progress_bar()
        torch.set_num_threads(torch_threads)
        self.role = role
        self.train = train
        self.seed = seed
        self.dir = Path(checkpoint_dir) / role
        self.dir.mkdir(parents=True, exist_ok=True)
        self.faults = FaultPoints.from_env(self.dir)  # read once; the markers live with the server's state
        self.store = open_store(store)
        self.store_timeout_s = store_timeout_s
        state_file = self.dir / "server.json"
        self.state = json.loads(state_file.read_text()) if state_file.exists() else {"last_applied": -1, "metrics": {}}
        learner_cfg = LearnerConfig(**(learner or {}))
        checkpoint = self.dir / "checkpoint"
        RoleLearner.recover(checkpoint)  # a kill inside save leaves the previous checkpoint aside
        self.restored = (checkpoint / "learner.json").exists()
        if self.restored:
            self.learner = RoleLearner.load(checkpoint, config=learner_cfg)
            # a kill between the checkpoint's rename and server.json's leaves server.json one behind
            extra = json.loads((checkpoint / "learner.json").read_text()).get("extra") or {}
            if extra.get("last_applied", -1) > self.state["last_applied"]:
                self.state["last_applied"] = extra["last_applied"]
                self.state["metrics"] = extra.get("metrics", {})
                pending = self.state.get("pending", {})
                for it in [i for i in pending if int(i) <= extra["last_applied"]]:
                    del pending[it]
        else:
            self.learner = RoleLearner(role, model, learner_cfg)
        g = GenerationConfig(**(generation or {}))
        self.policy = TransformersPolicy(self.learner.model, model, role=role, max_new_tokens=g.max_new_tokens,
                                         temperature=g.temperature, top_p=g.top_p, max_prompt_tokens=g.max_prompt_tokens,
                                         seed=policy_seed(seed, role, self.state["last_applied"] + 1), kv_cache_mb=g.kv_cache_mb,
                                         decode=g.decode, sampler=g.sampler)
        if self.learner.tokenizer is None:  # the checkpoint is a complete Hugging Face folder
            self.learner.tokenizer = self.policy.tokenizer
        self.buffers: dict[int, dict[str, list[dict[str, Any]]]] = {}
        self._acts = 0  # act calls of the current collection (the ``call`` of the ``act`` kill point)
        last = self.state["last_applied"]
        if last >= 0:  # a kill may have cut the idempotent tail of the last applied iteration: redo it
            self._published(last, dict(self.state["metrics"].get(str(last), {})))

    # -- rollouts -------------------------------------------------------------------------------

    def begin_collect(self, iteration: int) -> None:
        """Start (or restart) collecting ``iteration``: its rollouts are dropped and the policy samples
        with ``policy_seed(seed, role, iteration)`` from call 0, as the in-process loop does."""
        from ..core.seeding import policy_seed

        self.discard(iteration)
        self.policy.reseed(policy_seed(self.seed, self.role, iteration))
        self._acts = 0

    def act(self, iteration: int, requests: list[Any]) -> list[str]:
        """Actions for ``requests`` (``PolicyRequest`` without token history: it is filled here)."""
        self.faults.hit("act", role=self.role, iteration=iteration, call=self._acts)
        self._acts += 1
        buffer = self.buffers.setdefault(iteration, {})
        for request in requests:
            request.history = buffer.get(_key(request.episode, request.agent), [])
        responses = self.policy(requests)
        for request, response in zip(requests, responses, strict=True):
            buffer.setdefault(_key(request.episode, request.agent), []).append(response.extra)
        return [response.text for response in responses]

    def commit(self, iteration: int) -> int:
        """Write iteration's trajectories to disk (atomic); returns how many trajectories."""
        from mgrpo_env.episode import compact_token_extras

        buffer = self.buffers.get(iteration, {})
        # each turn's new prompt ids only (linear in turns); trajectory_sequence reads the compact form as is
        _write_json(self.dir / "buffers" / f"{iteration}.json", {key: compact_token_extras(turns) for key, turns in buffer.items()})
        return len(buffer)

    def discard(self, iteration: int) -> None:
        """Forget an iteration's rollouts (the controller re-collects it after a failure)."""
        self.buffers.pop(iteration, None)
        (self.dir / "buffers" / f"{iteration}.json").unlink(missing_ok=True)

    def _buffer(self, iteration: int) -> dict[str, list[dict[str, Any]]]:
        if iteration in self.buffers:
            return self.buffers[iteration]
        path = self.dir / "buffers" / f"{iteration}.json"
        if not path.exists():
            raise RuntimeError(f"{self.role} server has no committed rollouts for iteration {iteration}")
        self.buffers[iteration] = json.loads(path.read_text())
        return self.buffers[iteration]

    # -- updates --------------------------------------------------------------------------------

    def update_main(self, iteration: int, slots: list[dict[str, Any]]) -> dict[str, float]:
        """Publish the main statistics of ``iteration`` and update on them.

        ``slots``: :func:`mgrpo_algo.core.scoring.slot_payload` of the iteration's ``MainSlot``s (rollout
        key, reward, A_M, correctness, format flag), one per rollout.
        """
        from ..distributed.store import MainStat

        if iteration <= self.state["last_applied"]:  # applied before a crash: finish its idempotent tail only
            metrics = dict(self.state["metrics"].get(str(iteration), {}))
            return {**self._published(iteration, metrics), f"{self.role}/replayed": 1.0}
        stats = [MainStat(s["key"]["query"], s["key"]["rollout"], float(s["correct"]), bool(s["format_ok"])) for s in slots]
        self.store.put_main_stats(iteration, stats)  # first: the sub side may be waiting for it
        self.faults.hit("after_store_write", role=self.role, iteration=iteration)
        metrics: dict[str, float] = {}
        if self.train:
            metrics = self.learner.update(self._sequences(iteration, slots))
            self.faults.hit("after_update", role=self.role, iteration=iteration)
        return self._applied(iteration, metrics)

    def update_sub(self, iteration: int, slots: list[dict[str, Any]], rollouts: int, *, staleness: int = 0) -> dict[str, float]:
        """Queue ``iteration`` and apply every pending iteration whose main statistics are in the store.

        ``slots``: :func:`mgrpo_algo.core.scoring.slot_payload` of the iteration's aligned ``SubSlot``s
        (rollout key, agent, A_S); ``rollouts``: how many main statistics complete the iteration.
        ``staleness`` 0 (synchronized): wait for this iteration's main statistics and apply it now.
        n > 0 (stale): apply what is complete, and wait only for iterations older than
        ``iteration - n``, so the sub learner lags at most n iterations.
        """
        pending = self.state.setdefault("pending", {})
        if iteration > self.state["last_applied"]:
            pending[str(iteration)] = {"slots": slots, "rollouts": rollouts}
            self._save_state()
        return self._apply_pending(iteration, staleness)

    def _apply_pending(self, iteration: int, staleness: int) -> dict[str, float]:
        from ..distributed.store import StoreTimeout

        pending = self.state.setdefault("pending", {})
        metrics: dict[str, float] = {}
        for it in sorted(int(i) for i in pending):
            entry = pending[str(it)]
            must = it <= iteration - staleness  # older than the allowed lag: wait for it
            try:
                self.store.get_main_stats(it, expected=entry["rollouts"], timeout_s=self.store_timeout_s if must else 0.0)
            except StoreTimeout:
                if must:
                    raise
                break  # stale mode: not in yet; later iterations cannot be either (main publishes in order)
            metrics = self._apply_sub(it, entry["slots"])
            metrics["sub/applied_iteration"] = float(it)
            metrics["sub/lag"] = float(iteration - it)
        return metrics

    def flush(self, last_iteration: int) -> dict[str, float]:
        """Apply every pending iteration (end of a stale run)."""
        return self._apply_pending(last_iteration, 0)

    def _apply_sub(self, iteration: int, slots: list[dict[str, Any]]) -> dict[str, float]:
        pending = self.state.setdefault("pending", {})
        if iteration <= self.state["last_applied"]:
            pending.pop(str(iteration), None)
            return {}
        metrics: dict[str, float] = {}
        if self.train:  # an empty batch too: the learner reports it skipped, as in process
            metrics = self.learner.update(self._sequences(iteration, slots))
            self.faults.hit("after_update", role=self.role, iteration=iteration)
        pending.pop(str(iteration), None)
        return self._applied(iteration, metrics)

    def _sequences(self, iteration: int, slots: list[dict[str, Any]]) -> list[Any]:
        """The training sequences of ``slots``, from the trajectories this server kept."""
        from ..core.sequences import slot_sequence

        buffer = self._buffer(iteration)
        return [slot_sequence(buffer[_key(s["key"]["index"], s["agent"])], s["advantage"], self.role,
                              turn_advantages=s.get("turn_advantages")) for s in slots]

    def _applied(self, iteration: int, metrics: dict[str, float]) -> dict[str, float]:
        """Checkpoint (carrying ``last_applied``: the atomic rename commits the iteration), record it in
        ``server.json``, then publish. A crash before the rename redoes the iteration from the previous
        checkpoint; after it, the restarted server reads ``last_applied`` from the checkpoint and never
        applies the iteration twice."""
        self.state["last_applied"] = iteration
        self.state["metrics"] = {str(iteration): metrics}
        if self.train:
            self.learner.save(self.dir / "checkpoint", extra={"last_applied": iteration, "metrics": self.state["metrics"]})
            self.faults.hit("after_checkpoint", role=self.role, iteration=iteration)
        self._save_state()
        return self._published(iteration, metrics)

    def _published(self, iteration: int, metrics: dict[str, float]) -> dict[str, float]:
        """The idempotent tail of an applied iteration: health, done mark, its buffer dropped."""
        self.store.put_health(self.role, iteration, {k: v for k, v in metrics.items() if isinstance(v, (int, float))})
        self.store.mark_done(self.role, iteration)
        self.discard(iteration)
        metrics[f"{self.role}/store_bytes_written"] = float(self.store.bytes_written)
        metrics[f"{self.role}/store_bytes_read"] = float(self.store.bytes_read)
        return metrics

    def _save_state(self) -> None:
        _write_json(self.dir / "server.json", self.state)

    # -- introspection --------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        return {"role": self.role, "pid": os.getpid(), "last_applied": self.state["last_applied"], "restored": self.restored,
                "step": self.learner.step, "pending": sorted(int(i) for i in self.state.get("pending", {}))}

    def close(self) -> None:
        self.store.close()


def _key(episode: int, agent: str) -> str:
    return f"{episode}/{agent}"


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def remove_server_state(checkpoint_dir: str | Path) -> None:
    """Delete every role server's folder under ``checkpoint_dir`` (a fresh run)."""
    shutil.rmtree(checkpoint_dir, ignore_errors=True)
