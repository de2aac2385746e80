"""The role worker: one role's policy, learner and token trajectories, behind every placement.

A :class:`RoleWorker` holds one role ("main", "sub" or "single"): it generates the role's actions
(``act``), keeps the token trajectories it sampled, and updates its learner. The iteration loop talks
to it through a :class:`~mgrpo_algo.distributed.placement.RoleHandle` whatever the placement: in this
process (``local``), one process per role (``processes``) or a Ray actor (``ray``).
No gradient and no trajectory crosses between roles. What crosses is the paper's statistics, through
the shared store (:mod:`mgrpo_algo.distributed.store`): the main worker publishes per rollout (query,
rollout, correctness, format flag, R_M); the sub worker waits for them (synchronized) or lags behind
them (stale(n)), computes R_S of its own trajectories from them
(:func:`mgrpo_env.rewards.paid_sub_reward`, the env's own rule), aligns them and computes A_S
(:func:`mgrpo_algo.core.scoring.score_sub_side`).

The commit protocol, one for every placement, per iteration t:

1. ``begin_collect(t)`` reseeds the policy with ``policy_seed(seed, role, t)`` and drops t's rollouts;
   ``act`` fills an in-memory buffer; ``commit(t)`` writes it to the worker's folder (atomic).
2. ``update_main(t)`` publishes the statistics (idempotent), updates and checkpoints
   ``checkpoints/iter-<t>`` (atomic rename; its ``learner.json`` carries ``last_applied = t``: the
   worker's commit point), then records it in ``worker.json``. ``update_sub`` queues t and applies
   the pending iterations whose statistics are complete.
3. The loop writes ``loop_state.json`` (the run's commit point), then ``committed(t)`` prunes the
   checkpoints older than the newest one at or before t.

A worker restarted mid-run (its process killed) restores its newest checkpoint and never applies an
iteration twice. A run resumed after everything died calls ``rollback(c)`` with the loop's last
committed iteration c: the newest checkpoint at or before c is loaded and later state dropped, so the
loop redoes c + 1 from the same weights and the same seeds. Kill points: ``MGRPO_FAULT``
(:mod:`mgrpo_algo.core.faults`).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from mgrpo_env.roles import check_role

__all__ = ["RoleWorker", "write_json"]



class RoleWorker:
    """One role of a run.

    Args:
        role: "main", "sub" or "single".
        model: path or name of the role's start model (``from_pretrained``); the tokenizer comes from it.
        run_dir: the run's ``out_dir``; the worker's state lives in ``run_dir/workers/<role>``.
        store: a store spec (:func:`mgrpo_algo.distributed.store.open_store`), "" for none (single agent).
        spec: the role's :class:`~mgrpo_algo.core.config.RoleConfig` (generation, learner, served engine).
        seed: the run's seed (:mod:`mgrpo_algo.core.seeding`).
        train: False for a frozen role (generates, never updates).
        return_extras: ``act`` returns the token extras too (in this process they cost nothing and
            the episode records keep them; across processes they stay here).
    """

    def __init__(
        self,
        role: str,
        model: str,
        run_dir: str,
        store: str,
        *,
        spec: Any = None,
        seed: int = 0,
        torch_threads: int = 1,
        train: bool = True,
        store_timeout_s: float = 120.0,
        return_extras: bool = False,
    ) -> None:
        import torch
        import transformers

        from ..core.config import RoleConfig
        from ..core.faults import FaultPoints
        from ..distributed.store import open_store
        from ..learning.learner import RoleLearner
        from ..policies.factory import make_policy

        check_role(role)
        transformers.utils.logging.disable_progress_bar()  # per-shard bars drown the training log
        torch.set_num_threads(torch_threads)
        torch.manual_seed(seed)
        self.role, self.train, self.seed, self.model_path = role, train, seed, model
        self.spec = spec if spec is not None else RoleConfig()
        if self.spec.learner.seed is None:  # the minibatch shuffles follow the run's seed
            self.spec = replace(self.spec, learner=replace(self.spec.learner, seed=seed))
        self.return_extras = return_extras
        self.run_dir = Path(run_dir)
        self.dir = self.run_dir / "workers" / role
        self.dir.mkdir(parents=True, exist_ok=True)
        self.faults = FaultPoints.from_env(self.dir)  # read once; the markers live with the worker's state
        self.store = open_store(store) if store else None
        self.store_timeout_s = store_timeout_s
        state_file = self.dir / "worker.json"
        self.state = json.loads(state_file.read_text()) if state_file.exists() else {"last_applied": -1, "metrics": {}}
        self.learner: Any = None
        self.restored = False
        if train:
            newest = self._checkpoints()[-1:] if self._checkpoints() else []
            for folder in newest:
                RoleLearner.recover(folder)  # a kill inside save leaves the previous checkpoint aside
            if newest and (newest[0] / "learner.json").exists():
                self.learner = RoleLearner.load(newest[0], config=self.spec.learner)
                self.restored = True
                self._adopt(newest[0])
            else:
                self.learner = RoleLearner(role, model, self.spec.learner)
        from ..core.seeding import policy_seed

        policy_model = self.learner.model if self.learner is not None else model
        self.engine = None
        if self.spec.served.launch:  # this role's own vLLM server, from the learner's current weights
            from ..policies.vllm_server import launch_role_engine

            self.engine, served = launch_role_engine(role, self.spec, model, self.learner, self.run_dir)
            self.spec = replace(self.spec, served=served)
        self.policy = make_policy(role, policy_model, model, self.spec, seed=policy_seed(seed, role, self.state["last_applied"] + 1),
                                  engine=self.engine)
        self.sync = None
        if self.spec.served.enabled:
            from ..policies.weight_sync import WeightSync

            s = self.spec.served
            self.sync = WeightSync(s.base_url, api_key=s.api_key, wait_s=s.wait_s, engine=self.engine)
        if self.learner is not None and self.learner.tokenizer is None:  # checkpoints are complete HF folders
            self.learner.tokenizer = getattr(self.policy, "tokenizer", None)
        self.buffers: dict[int, dict[str, Any]] = {}
        self.eval_policy: Any = None
        self.eval_history: dict[str, list[dict[str, Any]]] = {}
        self._acts = 0  # act calls of the current collection (the ``call`` of the ``act`` kill point)
        last = self.state["last_applied"]
        if last >= 0:  # a kill may have cut the idempotent tail of the last applied iteration: redo it
            self._published(last, dict(self.state["metrics"].get(str(last), {})))

    # -- checkpoints: the worker's commit point ----------------------------------------------------

    def _checkpoints(self) -> list[Path]:
        """This worker's per-iteration checkpoints, oldest first."""
        root = self.dir / "checkpoints"
        found = [p for p in root.glob("iter-*") if p.is_dir()] if root.exists() else []
        return sorted(found, key=lambda p: int(p.name.split("-", 1)[1]))

    def _adopt(self, folder: Path) -> None:
        """Take ``last_applied`` from a checkpoint when ``worker.json`` lags behind it (a kill between them)."""
        extra = json.loads((folder / "learner.json").read_text()).get("extra") or {}
        if extra.get("last_applied", -1) > self.state["last_applied"]:
            self.state["last_applied"] = extra["last_applied"]
            self.state["metrics"] = extra.get("metrics", {})
            pending = self.state.get("pending", {})
            for it in [i for i in pending if int(i) <= extra["last_applied"]]:
                del pending[it]

    def rollback(self, iteration: int) -> int:
        """Go back to the state after ``iteration`` (the loop's last committed one; -1: the start):
        the newest checkpoint at or before it, nothing later. Returns ``last_applied``."""
        later = [p for p in self._checkpoints() if int(p.name.split("-", 1)[1]) > iteration]
        for folder in later:
            shutil.rmtree(folder)
        pending = self.state.setdefault("pending", {})
        for it in [i for i in pending if int(i) > iteration]:
            del pending[it]
        if self.state["last_applied"] > iteration:
            keep = self._checkpoints()
            if self.learner is not None:
                if keep:
                    self.learner.resume(keep[-1])  # in place: the policy shares the model object
                    last = int(json.loads((keep[-1] / "learner.json").read_text())["extra"]["last_applied"])
                else:
                    raise ValueError(f"{self.role} worker: no checkpoint at or before iteration {iteration} "
                                     f"under {self.dir / 'checkpoints'}")
            else:
                last = iteration
            self.state["last_applied"] = last
            self.state["metrics"] = {}
        for path in (self.dir / "buffers").glob("*.json") if (self.dir / "buffers").exists() else []:
            if int(path.stem) > iteration:
                path.unlink()
        self._save_state()
        return self.state["last_applied"]

    def committed(self, iteration: int) -> None:
        """The loop committed ``iteration``: checkpoints older than the newest at or before it can go."""
        upto = [p for p in self._checkpoints() if int(p.name.split("-", 1)[1]) <= iteration]
        for folder in upto[:-1]:
            shutil.rmtree(folder, ignore_errors=True)

    def end_stage(self, stage_index: int) -> None:
        """A stage checkpoint (``checkpoints/stage<n>/<role>``), kept beside the run's results."""
        if self.learner is not None:
            self.learner.save(self.run_dir / "checkpoints" / f"stage{stage_index + 1}" / self.role)

    def export(self, dest: str) -> bool:
        """Write the role's current model as a complete Hugging Face folder at ``dest`` (False: nothing to write)."""
        from .final_models import export_role_model

        model = self.learner.model if self.learner is not None else getattr(self.policy, "model", None)
        return export_role_model(model, getattr(self.policy, "tokenizer", None), self.model_path, Path(dest))

    # -- rollouts ---------------------------------------------------------------------------------

    def begin_collect(self, iteration: int) -> None:
        """Start (or restart) collecting ``iteration``: its rollouts are dropped and the policy samples
        with ``policy_seed(seed, role, iteration)`` from call 0."""
        from ..core.seeding import policy_seed

        self.discard(iteration)
        if hasattr(self.policy, "reseed"):
            self.policy.reseed(policy_seed(self.seed, self.role, iteration))
        self._acts = 0

    def act(self, iteration: int, requests: list[Any]) -> list[Any]:
        """Actions for ``requests`` (``PolicyRequest`` without token history: it is filled here); texts,
        or ``PolicyResponse``s with their token extras when ``return_extras``."""
        from ..core.scoring import anchor_state  # the one anchor-state function (scoring keys records by it)

        self.faults.hit("act", role=self.role, iteration=iteration, call=self._acts)
        self._acts += 1
        buffer = self.buffers.setdefault(iteration, {"turns": {}, "states": {}})
        for request in requests:
            request.history = buffer["turns"].get(_key(request.episode, request.agent), [])
        responses = self.policy(requests)
        for request, response in zip(requests, responses, strict=True):
            key = _key(request.episode, request.agent)
            buffer["turns"].setdefault(key, []).append(response.extra)
            buffer["states"].setdefault(key, []).append(anchor_state(request.messages))  # step-credit anchors
        return list(responses) if self.return_extras else [response.text for response in responses]

    def release(self, episode: int, agent: str) -> None:
        """An agent ended: its KV cache can go."""
        if hasattr(self.policy, "release"):
            self.policy.release(episode, agent)

    def commit(self, iteration: int) -> int:
        """Write iteration's trajectories to disk (atomic); returns how many trajectories."""
        from mgrpo_env.episode import compact_token_extras

        buffer = self.buffers.get(iteration, {"turns": {}, "states": {}})
        # each turn's new prompt ids only (linear in turns); trajectory_sequence reads the compact form as is
        data = {"turns": {key: compact_token_extras(turns) for key, turns in buffer["turns"].items()},
                "states": buffer["states"]}
        write_json(self.dir / "buffers" / f"{iteration}.json", data)
        return len(buffer["turns"])

    def discard(self, iteration: int) -> None:
        """Forget an iteration's rollouts (the loop re-collects it after a failure)."""
        self.buffers.pop(iteration, None)
        (self.dir / "buffers" / f"{iteration}.json").unlink(missing_ok=True)

    def _buffer(self, iteration: int) -> dict[str, Any]:
        if iteration in self.buffers:
            return self.buffers[iteration]
        path = self.dir / "buffers" / f"{iteration}.json"
        if not path.exists():
            raise RuntimeError(f"{self.role} worker has no committed rollouts for iteration {iteration}")
        self.buffers[iteration] = json.loads(path.read_text())
        return self.buffers[iteration]

    # -- evaluation (mgrpo compare: the current weights, wherever they live) ------------------------

    def begin_eval(self, seed: int, temperature: float, max_new_tokens: int) -> None:
        """An evaluation policy over the current model with the evaluation's settings and seed."""
        from ..policies.factory import make_policy

        model = self.learner.model if self.learner is not None else getattr(self.policy, "model", None)
        if not hasattr(model, "generate"):  # a served role's policy names its engine's model: load the start
            model = self.model_path
        self.eval_policy = make_policy(self.role, model, self.model_path, self.spec, seed=seed, temperature=temperature,
                                       max_new_tokens=max_new_tokens, served=False, evaluation=True)
        self.eval_history = {}

    def eval_act(self, requests: list[Any]) -> list[str]:
        """Evaluation actions (token history kept here, as ``act`` does)."""
        for request in requests:
            request.history = self.eval_history.get(_key(request.episode, request.agent), [])
        responses = self.eval_policy(requests)
        for request, response in zip(requests, responses, strict=True):
            self.eval_history.setdefault(_key(request.episode, request.agent), []).append(response.extra)
        return [response.text for response in responses]

    def eval_release(self, episode: int, agent: str) -> None:
        self.eval_history.pop(_key(episode, agent), None)
        if hasattr(self.eval_policy, "release"):
            self.eval_policy.release(episode, agent)

    # -- updates ----------------------------------------------------------------------------------

    def update_main(self, iteration: int, slots: list[dict[str, Any]]) -> dict[str, float]:
        """Publish the main statistics of ``iteration`` (query, rollout, correct, format, R_M) and update.

        ``slots``: :func:`mgrpo_algo.core.scoring.slot_payload` of the iteration's ``MainSlot``s, one per rollout.
        """
        if iteration <= self.state["last_applied"]:
            return self._replayed(iteration)
        if self.store is not None:  # first: the sub side may be waiting for it
            self._publish_main(iteration, slots)
        self.faults.hit("after_store_write", role=self.role, iteration=iteration)
        metrics: dict[str, float] = {}
        if self.train:
            metrics = self.learner.update(self._sequences(iteration, slots))
            self.faults.hit("after_update", role=self.role, iteration=iteration)
        return self._applied(iteration, metrics)

    def _replayed(self, iteration: int) -> dict[str, float]:
        """An iteration applied before a crash: finish its idempotent tail only."""
        metrics = dict(self.state["metrics"].get(str(iteration), {}))
        return {**self._published(iteration, metrics), f"{self.role}/replayed": 1.0}

    def _publish_main(self, iteration: int, slots: list[dict[str, Any]]) -> None:
        """The main statistics of ``iteration`` into the store, one per rollout."""
        from ..distributed.store import MainStat

        self.store.put_main_stats(iteration, [MainStat(s["key"]["query"], s["key"]["rollout"], float(s["correct"]),
                                                       bool(s["format_ok"]), float(s["reward"])) for s in slots])

    def update_sub(self, iteration: int, facts: list[list[dict[str, Any]]], scoring: dict[str, Any], *,
                   staleness: int = 0) -> dict[str, Any]:
        """Queue ``iteration`` and apply every pending iteration whose main statistics are in the store.

        ``facts``: :func:`mgrpo_algo.core.scoring.sub_facts` of the iteration's rollouts (what this side
        knows of its own trajectories); ``scoring``: ``k``, ``d``, ``strategy``, ``step_weight``,
        ``sub_weights`` and ``estimator``. ``staleness`` 0 (synchronized): wait for this iteration's statistics and apply
        it now; n > 0 (stale): apply what is complete and wait only for iterations older than
        ``iteration - n``. Returns the metrics and, under ``"advantages"``, {iteration: [(rollout index,
        agent, A_S)]} of the iterations applied (the loop writes them into the episode records).
        """
        pending = self.state.setdefault("pending", {})
        if iteration > self.state["last_applied"]:
            pending[str(iteration)] = {"facts": facts, "scoring": scoring}
            self._save_state()
        return self._apply_pending(iteration, staleness)

    def _apply_pending(self, iteration: int, staleness: int) -> dict[str, Any]:
        from ..distributed.store import StoreTimeout

        pending = self.state.setdefault("pending", {})
        metrics: dict[str, Any] = {}
        advantages: dict[int, list[tuple[int, str, float]]] = {}
        for it in sorted(int(i) for i in pending):
            entry = pending[str(it)]
            must = it <= iteration - staleness  # older than the allowed lag: wait for it
            try:
                stats = self.store.get_main_stats(it, expected=len(entry["facts"]),
                                                  timeout_s=self.store_timeout_s if must else 0.0)
            except StoreTimeout:
                if must:
                    raise
                break  # stale mode: not in yet; later iterations cannot be either (main publishes in order)
            metrics, advantages[it] = self._apply_sub(it, entry, [s.correct for s in stats])
            metrics["sub/applied_iteration"] = float(it)
            metrics["sub/lag"] = float(iteration - it)
        return {**metrics, "advantages": advantages} if advantages else metrics

    def flush(self, last_iteration: int) -> dict[str, Any]:
        """Apply every pending iteration (end of a stale run)."""
        return self._apply_pending(last_iteration, 0)

    def _apply_sub(self, iteration: int, entry: dict[str, Any], correct: list[float]
                   ) -> tuple[dict[str, float], list[tuple[int, str, float]]]:
        """R_S from the store's correctness, aligned, A_S pooled; then the update."""
        pending = self.state.setdefault("pending", {})
        if iteration <= self.state["last_applied"]:
            pending.pop(str(iteration), None)
            return {}, []
        slots, metrics, scored = self._score_sub(iteration, entry, correct)
        if self.train:  # an empty batch too: the learner reports it skipped
            metrics.update(self.learner.update(self._sequences(iteration, _sub_payload(slots))))
            self.faults.hit("after_update", role=self.role, iteration=iteration)
        pending.pop(str(iteration), None)
        return self._applied(iteration, _floats(metrics), scored), [(s.key.index, s.agent, s.advantage) for s in slots]

    def _score_sub(self, iteration: int, entry: dict[str, Any], correct: list[float]
                   ) -> tuple[list[Any], dict[str, Any], set[str]]:
        """The sub side's slots of ``iteration`` (R_S from ``correct``, aligned, A_S pooled), its scoring
        metrics and their names."""
        from mgrpo_env.rewards import paid_sub_reward

        from ..core.scoring import score_sub_side
        from ..core.seeding import iteration_rngs

        facts, sc = entry["facts"], entry["scoring"]
        gate = bool(sc.get("sub_format_gate", False))
        rewards = [[paid_sub_reward(f["format_ok"], correct[i], f["expert"], sc["sub_weights"], format_gate=gate) for f in row]
                   for i, row in enumerate(facts)]
        states = None
        if sc["step_weight"]:
            saved = self._buffer(iteration)["states"]
            states = {(i, j): saved.get(_key(i, f["agent"]), []) for i, row in enumerate(facts) for j, f in enumerate(row)}
        rng = iteration_rngs(self.seed, iteration)[1]  # the alignment draws of (seed, iteration), as everywhere
        slots, metrics = score_sub_side(facts, rewards, sc["k"], sc["d"], strategy=sc["strategy"], rng=rng,
                                        step_weight=sc["step_weight"], states=states,
                                        estimator=sc.get("estimator", "grpo_pooled_masked"))
        return slots, metrics, set(metrics)  # the scoring figures: logged, not sent to the store's health

    def update_shared(self, iteration: int, slots: list[dict[str, Any]], facts: list[list[dict[str, Any]]],
                      scoring: dict[str, Any]) -> dict[str, Any]:
        """Both roles of a mode whose sub-agents are played by this (main) worker's model
        (``ModeSpec.shares``, the shared-model baseline): the main statistics are published and read back
        from the store as the sub side reads them, the sub side is scored as :meth:`update_sub` scores
        it, and one learner update runs over the main and the sub sequences together; one commit.
        Returns what :meth:`update_main` and :meth:`update_sub` return together."""
        if iteration <= self.state["last_applied"]:
            return self._replayed(iteration)
        if self.store is None:
            raise RuntimeError("a shared-model worker reads the main statistics through the store: none is open")
        self._publish_main(iteration, slots)
        stats = self.store.get_main_stats(iteration, expected=len(facts), timeout_s=self.store_timeout_s)
        sub_slots, metrics, scored = self._score_sub(iteration, {"facts": facts, "scoring": scoring},
                                                     [s.correct for s in stats])
        if self.train:
            sequences = self._sequences(iteration, slots) + self._sequences(iteration, _sub_payload(sub_slots))
            metrics.update(self.learner.update(sequences))
            self.faults.hit("after_update", role=self.role, iteration=iteration)
        applied = self._applied(iteration, _floats(metrics), scored)
        return {**applied, "advantages": {iteration: [(s.key.index, s.agent, s.advantage) for s in sub_slots]}}

    def _sequences(self, iteration: int, slots: list[dict[str, Any]]) -> list[Any]:
        """The training sequences of ``slots``, from the trajectories this worker kept."""
        from ..core.sequences import slot_sequence

        turns = self._buffer(iteration)["turns"]
        return [slot_sequence(turns[_key(s["key"]["index"], s["agent"])], s["advantage"], self.role,
                              turn_advantages=s.get("turn_advantages")) for s in slots]

    def _applied(self, iteration: int, metrics: dict[str, float], scored: set[str] = frozenset()) -> dict[str, float]:
        """Checkpoint (carrying ``last_applied``: the atomic rename commits the iteration), push the
        weights to a served engine, record it in ``worker.json``, then publish."""
        self.state["last_applied"] = iteration
        self.state["metrics"] = {str(iteration): metrics}
        if self.train:
            self.learner.save(self.dir / "checkpoints" / f"iter-{iteration}",
                              extra={"last_applied": iteration, "metrics": self.state["metrics"]})
            self.faults.hit("after_checkpoint", role=self.role, iteration=iteration)
            if self.sync is not None:
                metrics = {**metrics, **self._push_weights()}
        self._save_state()
        return self._published(iteration, metrics, scored)

    def _push_weights(self) -> dict[str, float]:
        """After an update: the served engine samples from the new weights (LoRA adapter or full reload)."""
        t0 = time.perf_counter()
        if self.learner.config.lora_rank > 0:
            name = f"{self.role}-step{self.learner.step}"
            folder = self.learner.save_adapter(self.run_dir / "adapters" / name)
            self.policy.model = self.sync.sync_lora(folder, name)
        else:
            weights = self.spec.served.weights_dir
            if not weights:
                raise ValueError(f"config field '{self.role}.served.weights_dir' is needed to push full weights")
            from ..policies.vllm_server import save_for_engine

            save_for_engine(self.learner.model, weights)  # untied: vLLM's reload skips a tied head
            self.sync.sync_full(sleep=self.spec.served.sleep)
        return {f"{self.role}/weight_sync_s": time.perf_counter() - t0}

    def _published(self, iteration: int, metrics: dict[str, float], scored: set[str] = frozenset()) -> dict[str, float]:
        """The idempotent tail of an applied iteration: health (the learner's figures), done mark, its
        buffer dropped."""
        self.discard(iteration)
        if self.store is None:
            return metrics
        self.store.put_health(self.role, iteration, {k: v for k, v in metrics.items()
                                                     if isinstance(v, (int, float)) and k not in scored})
        self.store.mark_done(self.role, iteration)
        metrics[f"{self.role}/store_bytes_written"] = float(self.store.bytes_written)
        metrics[f"{self.role}/store_bytes_read"] = float(self.store.bytes_read)
        return metrics

    def _save_state(self) -> None:
        write_json(self.dir / "worker.json", self.state)

    # -- introspection ----------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        return {"role": self.role, "pid": os.getpid(), "last_applied": self.state["last_applied"], "restored": self.restored,
                "step": self.learner.step if self.learner is not None else 0,
                "pending": sorted(int(i) for i in self.state.get("pending", {}))}

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
        if self.engine is not None:
            self.engine.stop()


def _sub_payload(slots: list[Any]) -> list[dict[str, Any]]:
    """Sub slots as :meth:`RoleWorker._sequences` reads them."""
    return [{"key": {"index": s.key.index}, "agent": s.agent, "advantage": s.advantage,
             "turn_advantages": s.turn_advantages} for s in slots]


def _floats(metrics: dict[str, Any]) -> dict[str, float]:
    import numpy as np

    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float, np.floating))}


def _key(episode: int, agent: str) -> str:
    return f"{episode}/{agent}"


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as JSON at ``path`` atomically (a temporary file renamed over it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)
