"""The role worker: one role's policy, learner and token trajectories, behind every placement.

A :class:`RoleWorker` holds one role ("main", "sub" or "single"): it generates the role's actions
(``act``), keeps the token trajectories it sampled, and updates its learner. The iteration loop talks
to it through a :class:`~mgrpo_algo.distributed.placement.RoleHandle` whatever the placement: in this
process (``local``), one process per role (``processes``) or a Ray actor (``ray``).
No gradient and no trajectory crosses between roles. What crosses is the paper's statistics, through
the shared store (:mod:`mgrpo_algo.distributed.store`): the main worker publishes per rollout (query,
rollout, correctness, format flag, R_M); the sub worker waits for them (synchronized) or lags behind
them (stale(n)), computes R_S of its own trajectories from them
(its role spec's ``reward``, the env's own rule: :func:`mgrpo_env.rewards.paid_sub_reward`), aligns them and computes A_S
(:func:`mgrpo_algo.core.scoring.score_sub_side`) and keeps them: ``advantages/<t>.json`` in its
folder (the loop is not handed A_S back; ``mgrpo view`` joins them to the episode records).

Its parts, one job each: :class:`~mgrpo_algo.training.trajectories.Trajectories` (the sampled
tokens), :class:`~mgrpo_algo.training.worker_state.WorkerState` (``worker.json`` and the checkpoints:
commit, rollback, prune), :class:`~mgrpo_algo.training.role_eval.RoleEvaluation` (evaluation). The
worker itself acts, scores its side and updates.

The commit protocol, one for every placement, per iteration t:

1. ``begin_collect(t)`` reseeds the policy with ``policy_seed(seed, role, t)`` and drops t's rollouts;
   ``act`` keeps each sampled turn's token ids (:class:`~mgrpo_algo.training.trajectories.Trajectories`,
   their one owner); ``commit(t)`` writes them to the worker's folder (atomic).
2. ``update(t, batch)`` with the main side's slots publishes the statistics (idempotent), updates
   and checkpoints ``checkpoints/iter-<t>`` (atomic rename; its ``learner.json`` carries
   ``last_applied = t``: the worker's commit point), then records it in ``worker.json``; with a
   called role's facts it queues t and applies the pending iterations whose statistics are complete.
3. The loop writes ``loop_state.json`` (the run's commit point), then ``committed(t)`` prunes the
   checkpoints older than the newest one at or before t.

A worker restarted mid-run (its process killed) restores its newest checkpoint and never applies an
iteration twice. A run resumed after everything died calls ``rollback(c)`` with the loop's last
committed iteration c: the newest checkpoint at or before c is loaded and later state dropped, so the
loop redoes c + 1 from the same weights and the same seeds. Kill points: ``MGRPO_FAULT``
(:mod:`mgrpo_algo.core.faults`).
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from mgrpo_env.rewards import called_pay
from mgrpo_env.roles import ROLE_TABLE, check_role
from mgrpo_env.turn_requests import ChatKeeper, TurnRequest

from ..core.scoring import CalledFact, CalledScoring, CalledSlot, MainSlot, RoleBatch
from .role_eval import RoleEvaluation
from .storage import RunStorage
from .trajectories import Trajectories, trajectory_key
from .worker_state import WorkerState

__all__ = ["RoleWorker"]


class RoleWorker:
    """One role of a run.

    Args:
        role: "main", "sub" or "single".
        model: path or name of the role's start model (``from_pretrained``); the tokenizer comes from it.
        run_dir: the run's ``out_dir`` (on the controller's node; a worker reads and writes nothing there
            when ``storage`` is set, a served engine's node-local files aside).
        storage: where the worker's state lives (``<storage>/workers/<role>``): a folder every node sees or an
            fsspec URL (:mod:`mgrpo_algo.training.storage`); "" for ``run_dir``.
        store: a store spec (:func:`mgrpo_algo.distributed.store.open_store`), "" for none (single agent).
        spec: the role's :class:`~mgrpo_algo.core.config.RoleConfig` (generation, learner, served engine).
        seed: the run's seed (:mod:`mgrpo_algo.core.seeding`).
        train: False for a frozen role (generates, never updates).
        keep_token_ids: keep each applied iteration's token trajectories (``trajectories/<t>.json``).
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
        keep_token_ids: bool = False,
        storage: str = "",
    ) -> None:
        import torch
        import transformers

        from ..core.config import RoleConfig
        from ..core.faults import FaultPoints
        from ..core.kernels import check_in_force
        from ..core.seeding import policy_seed
        from ..distributed.store import open_store
        from ..learning.learner import RoleLearner
        from ..policies.factory import make_policy

        check_role(role)
        transformers.utils.logging.disable_progress_bar()  # per-shard bars drown the training log
        torch.set_num_threads(torch_threads)
        check_in_force()  # a pinned run's worker runs the pinned kernels, or stops
        torch.manual_seed(seed)
        self.role, self.train, self.seed, self.model_path = role, train, seed, model
        self.spec = spec if spec is not None else RoleConfig()
        if self.spec.learner.seed is None:  # the minibatch shuffles follow the run's seed
            self.spec = replace(self.spec, learner=replace(self.spec.learner, seed=seed))
        self.run_dir = Path(run_dir)
        self.storage = RunStorage.of_run(run_dir, storage)  # the run's storage; this worker's folder in it:
        self.files = self.storage.child(f"workers/{role}")
        self.files.create_folder()
        # read once; the markers live with the worker's state (on a URL storage: in this node's scratch folder)
        self.faults = FaultPoints.from_env(self.files.local or self.files.scratch())
        self.store = open_store(store) if store else None
        self.store_timeout_s = store_timeout_s
        self.state = WorkerState(self.files)
        self.trajectories = Trajectories(self.files, keep=keep_token_ids)
        self.chats = ChatKeeper()  # each agent's chat while collecting (requests carry only what is new)
        self.learner: Any = None
        self.restored = False
        if train:
            newest = self.state.newest()
            if newest is not None:
                self.learner = RoleLearner.load(self.state.local_checkpoint(newest), config=self.spec.learner)
                self.restored = True
                self.state.adopt(newest)
            else:
                self.learner = RoleLearner(role, model, self.spec.learner)
        policy_model = self.learner.model if self.learner is not None else model
        self.engine = None
        if self.spec.served.launch:  # this role's own vLLM server, from the learner's current weights
            from ..policies.vllm_server import launch_role_engine

            self.engine, served = launch_role_engine(role, self.spec, model, self.learner, self.run_dir)
            self.spec = replace(self.spec, served=served)
        self.policy = make_policy(role, policy_model, model, self.spec, seed=policy_seed(seed, role, self.state.last_applied + 1),
                                  engine=self.engine)
        self.sync = None
        if self.spec.served.enabled:
            from ..policies.weight_sync import WeightSync

            s = self.spec.served
            self.sync = WeightSync(s.base_url, api_key=s.api_key, wait_s=s.wait_s, engine=self.engine)
        if self.learner is not None and self.learner.tokenizer is None:  # checkpoints are complete HF folders
            self.learner.tokenizer = getattr(self.policy, "tokenizer", None)
        self.evaluation = RoleEvaluation(role, model, self.spec)
        self._acts = 0  # act calls of the current collection (the ``call`` of the ``act`` kill point)
        last = self.state.last_applied
        if last >= 0:  # a kill may have cut the idempotent tail of the last applied iteration: redo it
            self._published(last, self.state.metrics_of(last))

    # -- the commit protocol (WorkerState) ----------------------------------------------------------

    def rollback(self, iteration: int) -> int:
        """Go back to the state after ``iteration`` (the loop's last committed one; -1: the start):
        the newest checkpoint at or before it, nothing later. Returns ``last_applied``."""
        self.state.rollback(iteration, self.learner, self.role)
        self.trajectories.drop_after(iteration)
        self.files.drop_json_after("advantages", iteration)  # the A_S this worker scored, one file an iteration
        self.state.save()
        return self.state.last_applied

    def committed(self, iteration: int) -> None:
        """The loop committed ``iteration``: checkpoints older than the newest at or before it can go."""
        self.state.prune(iteration)

    def end_stage(self, stage_index: int) -> None:
        """A stage checkpoint (``checkpoints/stage<n>/<role>`` of the run's storage), kept beside the run's results."""
        if self.learner is not None:
            self.storage.save_folder(f"checkpoints/stage{stage_index + 1}/{self.role}", self.learner.save)

    def export(self, dest: str) -> bool:
        """Write the role's current model as a complete Hugging Face folder at ``dest``, a path or a URL
        (False: nothing to write)."""
        from .final_models import export_role_model

        parent, _, name = dest.rstrip("/").rpartition("/")
        return RunStorage(parent or ".").save_folder(name, lambda folder: export_role_model(
            self._model(), getattr(self.policy, "tokenizer", None), self.model_path, folder))

    def _model(self) -> Any:
        """The role's current model: the learner's, or the frozen policy's."""
        return self.learner.model if self.learner is not None else getattr(self.policy, "model", None)

    # -- rollouts (Trajectories) --------------------------------------------------------------------

    def begin_collect(self, iteration: int) -> None:
        """Start (or restart) collecting ``iteration``: its rollouts are dropped and the policy samples
        with ``policy_seed(seed, role, iteration)`` from call 0."""
        from ..core.seeding import policy_seed

        self.trajectories.discard(iteration)
        self.chats.clear()
        if hasattr(self.policy, "reseed"):
            self.policy.reseed(policy_seed(self.seed, self.role, iteration))
        self._acts = 0

    def act(self, iteration: int, turns: list[TurnRequest]) -> list[str]:
        """The actions for ``turns`` (each carries only its agent's new messages: this worker keeps the
        chats and the token history), as text; the sampled token ids stay here."""
        from ..core.scoring import anchor_state  # the one anchor-state function (scoring keys records by it)

        self.faults.hit("act", role=self.role, iteration=iteration, call=self._acts)
        self._acts += 1
        requests = [self.chats.expand(turn, self.trajectories.history(iteration, turn.episode, turn.agent))
                    for turn in turns]
        responses = self.policy(requests)
        for request, response in zip(requests, responses, strict=True):
            self.trajectories.add(iteration, request.episode, request.agent, response.extra,
                                  anchor_state(request.messages))  # step-credit anchors
        texts = [response.text for response in responses]
        self.chats.answered(requests, texts)
        return texts

    def release(self, episode: int, agent: str) -> None:
        """An agent ended: its chat and its KV cache can go."""
        self.chats.release(episode, agent)
        if hasattr(self.policy, "release"):
            self.policy.release(episode, agent)

    def commit(self, iteration: int) -> int:
        """Write iteration's trajectories to disk (atomic); returns how many trajectories."""
        return self.trajectories.commit(iteration)

    # -- evaluation (RoleEvaluation: mgrpo compare on the current weights) --------------------------

    def begin_eval(self, seed: int, temperature: float, max_new_tokens: int) -> None:
        """An evaluation policy over the current model with the evaluation's settings and seed."""
        self.evaluation.begin(self._model(), seed, temperature, max_new_tokens)

    def eval_act(self, turns: list[TurnRequest]) -> list[str]:
        """Evaluation actions (chats and token history kept by the evaluation, as ``act`` keeps them)."""
        return self.evaluation.act(turns)

    def eval_release(self, episode: int, agent: str) -> None:
        self.evaluation.release(episode, agent)

    # -- updates ----------------------------------------------------------------------------------

    def update(self, iteration: int, batch: RoleBatch) -> dict[str, float]:
        """This role's update of ``iteration``: the one update of every role
        (:class:`~mgrpo_algo.core.scoring.RoleBatch`).

        A batch of ``slots`` (the side the loop scored: the main or single agent) is published to the
        store (query, rollout, correct, format, R_M), then learned from. A batch of ``facts`` (a called
        role, which scores itself) is queued, and every pending iteration whose main statistics are in
        the store is applied (``batch.staleness`` 0: wait for this one; n > 0: wait only for iterations
        older than ``iteration - n``); its A_S are kept in ``advantages/<t>.json``. Both (one model
        plays both sides): published, read back, scored and learned in one update. Returns the metrics
        (of the last iteration applied)."""
        if batch.slots is not None and batch.scores_itself:
            return self._update_shared(iteration, batch.slots, batch.facts, batch.scoring)
        if batch.slots is not None:
            return self._update_scored(iteration, batch.slots)
        return self._update_self_scored(iteration, batch.facts, batch.scoring, batch.staleness)

    def _update_scored(self, iteration: int, slots: list[MainSlot]) -> dict[str, float]:
        """Publish the main statistics of ``iteration`` and update on ``slots`` (one per rollout)."""
        if iteration <= self.state.last_applied:
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
        return {**self._published(iteration, self.state.metrics_of(iteration)), f"{self.role}/replayed": 1.0}

    def _publish_main(self, iteration: int, slots: list[MainSlot]) -> None:
        """The main statistics of ``iteration`` into the store, one per rollout."""
        from ..distributed.store import MainStat

        self.store.put_main_stats(iteration, [MainStat(s.key.query, s.key.rollout, float(s.correct), bool(s.format_ok),
                                                       float(s.reward)) for s in slots])

    def _update_self_scored(self, iteration: int, facts: list[list[CalledFact]], scoring: CalledScoring,
                            staleness: int) -> dict[str, float]:
        """Queue ``iteration`` (``facts``: what this side knows of its own trajectories, per rollout,
        :func:`mgrpo_algo.core.scoring.sub_facts`) and apply every pending iteration whose main
        statistics are in the store."""
        if iteration > self.state.last_applied:
            self.state.pending[str(iteration)] = {"facts": [[asdict(f) for f in row] for row in facts],
                                                  "scoring": asdict(scoring)}
            self.state.save()
        return self._apply_pending(iteration, staleness)

    def _apply_pending(self, iteration: int, staleness: int) -> dict[str, float]:
        from ..distributed.store import StoreTimeout

        metrics: dict[str, float] = {}
        for it in sorted(int(i) for i in self.state.pending):
            facts, scoring = _queued(self.state.pending[str(it)])
            must = it <= iteration - staleness  # older than the allowed lag: wait for it
            try:
                stats = self.store.get_main_stats(it, expected=len(facts), timeout_s=self.store_timeout_s if must else 0.0)
            except StoreTimeout:
                if must:
                    raise
                break  # stale mode: not in yet; later iterations cannot be either (main publishes in order)
            metrics = self._apply_sub(it, facts, scoring, [s.correct for s in stats])
            metrics[f"{self.role}/applied_iteration"] = float(it)
            metrics[f"{self.role}/lag"] = float(iteration - it)
        return metrics

    def flush(self, last_iteration: int) -> dict[str, float]:
        """Apply every pending iteration (end of a stale run)."""
        return self._apply_pending(last_iteration, 0)

    def _apply_sub(self, iteration: int, facts: list[list[CalledFact]], scoring: CalledScoring, correct: list[float]
                   ) -> dict[str, float]:
        """R_S from the store's correctness, aligned, A_S pooled (kept); then the update."""
        if iteration <= self.state.last_applied:
            self.state.pending.pop(str(iteration), None)
            return {}
        slots, metrics = self._score_sub(iteration, facts, scoring, correct)
        return self._learn_scored(iteration, slots, metrics)

    def _score_sub(self, iteration: int, facts: list[list[CalledFact]], scoring: CalledScoring, correct: list[float]
                   ) -> tuple[list[CalledSlot], dict[str, Any]]:
        """The sub side's slots of ``iteration`` (R_S from ``correct``, aligned, A_S pooled) and its
        scoring metrics; the slots are written to ``advantages/<t>.json`` (atomic, idempotent)."""
        from ..core.scoring import score_sub_side
        from ..core.seeding import iteration_rngs

        paid = ROLE_TABLE[scoring.role].reward  # the called role's pay, composed as the env paid it (called_pay)
        rewards = [[called_pay(paid, {**f.inputs, "format_ok": f.format_ok, "expert": f.expert, "main_correct": correct[i]},
                               scoring.sub_weights, format_gate=scoring.sub_format_gate, terms=scoring.terms)
                    for f in row] for i, row in enumerate(facts)]
        states = None
        if scoring.step_weight:
            saved = self.trajectories.load(iteration)["states"]
            states = {(i, j): saved.get(trajectory_key(i, f.agent), []) for i, row in enumerate(facts) for j, f in enumerate(row)}
        rng = iteration_rngs(self.seed, iteration)[1]  # the alignment draws of (seed, iteration), as everywhere
        slots, metrics = score_sub_side(facts, rewards, scoring.k, scoring.d, strategy=scoring.strategy, rng=rng,
                                        step_weight=scoring.step_weight, states=states, estimator=scoring.estimator,
                                        credit=scoring.credit, outcome_groups=scoring.outcome_groups, role=scoring.role)
        self.files.write_json(f"advantages/{iteration}.json", [
            {"index": s.key.index, "agent": s.agent, "slot": s.slot, "reward": s.reward, "advantage": s.advantage}
            for s in slots])
        return slots, metrics

    def _update_shared(self, iteration: int, slots: list[MainSlot], facts: list[list[CalledFact]],
                       scoring: CalledScoring) -> dict[str, float]:
        """Both roles of a mode whose sub-agents are played by this (main) worker's model
        (``ModeSpec.shares``, the shared-model baseline): the main statistics are published and read back
        from the store as the sub side reads them, the sub side is scored as a called role scores
        itself, and one learner update runs over the main and the sub sequences together; one commit."""
        if iteration <= self.state.last_applied:
            return self._replayed(iteration)
        if self.store is None:
            raise RuntimeError("a shared-model worker reads the main statistics through the store: none is open")
        self._publish_main(iteration, slots)
        stats = self.store.get_main_stats(iteration, expected=len(facts), timeout_s=self.store_timeout_s)
        sub_slots, metrics = self._score_sub(iteration, facts, scoring, [s.correct for s in stats])
        return self._learn_scored(iteration, [*slots, *sub_slots], metrics)

    def _learn_scored(self, iteration: int, slots: list[MainSlot | CalledSlot], metrics: dict[str, Any]) -> dict[str, float]:
        """The update on ``slots`` (a frozen worker: none; an empty batch too: the learner reports it
        skipped), then ``iteration`` applied; ``metrics`` are the scoring's figures: logged, not sent to
        the store's health."""
        scored = set(metrics)
        if self.train:
            metrics.update(self.learner.update(self._sequences(iteration, slots)))
            self.faults.hit("after_update", role=self.role, iteration=iteration)
        return self._applied(iteration, _floats(metrics), scored)

    def _sequences(self, iteration: int, slots: list[MainSlot | CalledSlot]) -> list[Any]:
        """The training sequences of ``slots``, from the trajectories this worker kept."""
        from ..core.sequences import slot_sequence

        turns = self.trajectories.load(iteration)["turns"]
        return [slot_sequence(turns[trajectory_key(s.key.index, s.agent)], s.advantage, self.role,
                              turn_advantages=s.turn_advantages) for s in slots]

    def _applied(self, iteration: int, metrics: dict[str, float], scored: set[str] = frozenset()) -> dict[str, float]:
        """Checkpoint (carrying ``last_applied``: the atomic rename commits the iteration), push the
        weights to a served engine, record it in ``worker.json``, then publish."""
        self.state.applied(iteration, metrics)
        if self.train:
            self.state.save_checkpoint(iteration, self.learner,
                                       {"last_applied": iteration, "metrics": self.state.data["metrics"]})
            self.faults.hit("after_checkpoint", role=self.role, iteration=iteration)
            if self.sync is not None:
                metrics = {**metrics, **self._push_weights()}
        self.state.save()
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
        trajectories retired."""
        self.trajectories.retire(iteration)
        if self.store is None:
            return metrics
        self.store.put_health(self.role, iteration, {k: v for k, v in metrics.items()
                                                     if isinstance(v, (int, float)) and k not in scored})
        self.store.mark_done(self.role, iteration)
        metrics[f"{self.role}/store_bytes_written"] = float(self.store.bytes_written)
        metrics[f"{self.role}/store_bytes_read"] = float(self.store.bytes_read)
        return metrics

    # -- introspection ----------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        return {"role": self.role, "pid": os.getpid(), "last_applied": self.state.last_applied, "restored": self.restored,
                "step": self.learner.step if self.learner is not None else 0,
                "pending": sorted(int(i) for i in self.state.pending)}

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
        if self.engine is not None:
            self.engine.stop()
        self.storage.close()  # this node's scratch folder (downloads)


def _queued(entry: dict[str, Any]) -> tuple[list[list[CalledFact]], CalledScoring]:
    """A pending iteration as ``worker.json`` keeps it (plain JSON), typed again."""
    scoring = dict(entry["scoring"])
    scoring["sub_weights"] = tuple(scoring["sub_weights"])
    return [[CalledFact(**f) for f in row] for row in entry["facts"]], CalledScoring(**scoring)


def _floats(metrics: dict[str, Any]) -> dict[str, float]:
    import numpy as np

    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float, np.floating))}
