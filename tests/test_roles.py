"""Role workers' recovery guards (mgrpo_algo.training.roles) with a tiny model and an SQLite store, fast.

The slow end-to-end runs (tests/test_decoupled.py, tests/test_crash.py) kill real processes; these drive
one RoleWorker object directly: an iteration is applied once, replayed iterations are no-ops, the sub
side waits for (or, stale, lags behind) the main statistics and scores its own trajectories from them,
a restarted worker resumes, and a resumed run rolls back to the loop's commit.
Frozen workers (``train=False``) and empty batches keep most of them free of token data.
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace

import pytest

# Imported once here, not lazily in each test: transformers' model classes take seconds to import, and the
# mutation run (make mutation) forks once per mutant after collecting this module.
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config, Qwen2ForCausalLM  # noqa: F401

from mgrpo_algo.core.scoring import CalledFact, CalledScoring, MainSlot, RoleBatch, RolloutKey
from mgrpo_algo.distributed.store import MainStat, StoreTimeout, open_store
from mgrpo_algo.learning.learner import RoleLearner  # noqa: F401  (RoleWorker imports these lazily)
from mgrpo_algo.policies.hf_policy import TransformersPolicy  # noqa: F401
from mgrpo_algo.policies.models import build_tiny_model, train_tokenizer
from mgrpo_algo.training.roles import RoleWorker


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny-role-model")
    tok = train_tokenizer(["hello world <answer>x</answer> " * 20] * 20, vocab_size=300)
    build_tiny_model(tok, out, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)
    return str(out)


def _server(tiny_model, tmp_path, role, **kw):
    kw.setdefault("train", False)
    return RoleWorker(role, tiny_model, str(tmp_path / "ck"), f"sqlite:{tmp_path / 'stats.db'}",
                      store_timeout_s=0.2, **kw)


NO_SUBS = [[], []]  # two rollouts that delegated nothing
SCORING = CalledScoring(k=2, d=1, strategy="duplicate", step_weight=0.0, sub_weights=(0.1, 0.4, 0.5))


def _ck(tmp_path, role, iteration):
    return tmp_path / "ck" / "workers" / role / "checkpoints" / f"iter-{iteration}"


def _steady(metrics):
    """Metrics without the store's cumulative byte counters."""
    return {k: v for k, v in metrics.items() if "/store_bytes_" not in k}


def _main_slots(correct=(1.0, 0.0)):
    return [MainSlot(RolloutKey(i, 0, i), "main_0", c, 0.0, c, i == 0) for i, c in enumerate(correct)]





def test_update_main_publishes_then_applies_once(tiny_model, tmp_path):
    main = _server(tiny_model, tmp_path, "main")
    metrics = main.update(0, RoleBatch(slots=_main_slots()))
    assert main.state.last_applied == 0 and metrics["main/store_bytes_written"] > 0
    store = open_store(f"sqlite:{tmp_path / 'stats.db'}")
    expected = [MainStat(0, 0, 1.0, True, 1.0), MainStat(0, 1, 0.0, False, 0.0)]  # R_M travels too
    assert store.get_main_stats(0, expected=2, timeout_s=0) == expected
    assert store.done_iterations("main") == {0} and store.get_health("main")["step"] == 0
    # a replay (different values even) is a no-op: nothing re-published, nothing re-applied
    replay = main.update(0, RoleBatch(slots=_main_slots((0.0, 1.0))))
    # the metrics it recorded for 0, flagged as a replay (the store's byte counters are cumulative: they move)
    assert _steady(replay) == {**_steady(metrics), "main/replayed": 1.0}
    assert isinstance(metrics["main/store_bytes_read"], float)
    assert store.get_main_stats(0, expected=2, timeout_s=0) == expected
    main.update(1, RoleBatch(slots=_main_slots()))
    assert _steady(main.update(0, RoleBatch(slots=_main_slots()))) == {"main/replayed": 1.0}  # older than the last: no metrics kept
    main.close()
    # a restarted server reads its state back and still refuses to apply 0 or 1 again
    again = _server(tiny_model, tmp_path, "main")
    assert again.status()["last_applied"] == 1 and again.status()["pending"] == []
    assert again.update(1, RoleBatch(slots=_main_slots((0.0, 1.0))))["main/replayed"] == 1.0
    assert store.get_main_stats(1, expected=2, timeout_s=0) == expected
    again.close()
    store.close()


def test_synchronized_sub_waits_for_the_main_statistics(tiny_model, tmp_path):
    main, sub = _server(tiny_model, tmp_path, "main"), _server(tiny_model, tmp_path, "sub")
    with pytest.raises(StoreTimeout):
        sub.update(0, RoleBatch(facts=NO_SUBS, scoring=SCORING))
    assert sub.state.last_applied == -1 and sub.status()["pending"] == [0]  # kept for the retry
    main.update(0, RoleBatch(slots=_main_slots()))
    metrics = sub.update(0, RoleBatch(facts=NO_SUBS, scoring=SCORING))
    assert metrics["sub/applied_iteration"] == 0.0 and metrics["sub/lag"] == 0.0
    assert sub.state.last_applied == 0 and sub.status()["pending"] == []
    assert sub.update(0, RoleBatch(facts=NO_SUBS, scoring=SCORING)) == {}  # applied already: not queued again
    assert sub.store.done_iterations("sub") == {0}
    main.close()
    sub.close()


def test_stale_sub_lags_behind_by_at_most_n(tiny_model, tmp_path):
    main, sub = _server(tiny_model, tmp_path, "main"), _server(tiny_model, tmp_path, "sub")
    assert sub.update(0, RoleBatch(facts=NO_SUBS, scoring=SCORING, staleness=1)) == {}  # main 0 not in yet: no wait, nothing applied
    assert sub.status()["pending"] == [0]
    with pytest.raises(StoreTimeout):  # iteration 1 may lag by 1, so 0 must be applied now: wait, time out
        sub.update(1, RoleBatch(facts=NO_SUBS, scoring=SCORING, staleness=1))
    main.update(0, RoleBatch(slots=_main_slots()))
    metrics = sub.update(1, RoleBatch(facts=NO_SUBS, scoring=SCORING, staleness=1))  # applies 0 (lag 1); 1 is not in yet
    assert (metrics["sub/applied_iteration"], metrics["sub/lag"]) == (0.0, 1.0)
    assert sub.state.last_applied == 0 and sub.status()["pending"] == [1]
    main.update(1, RoleBatch(slots=_main_slots()))
    metrics = sub.flush(1)
    assert (metrics["sub/applied_iteration"], metrics["sub/lag"]) == (1.0, 0.0)
    assert sub.status()["pending"] == [] and sub.store.done_iterations("sub") == {0, 1}
    main.close()
    sub.close()


def test_pending_iteration_already_applied_is_dropped(tiny_model, tmp_path):
    main, sub = _server(tiny_model, tmp_path, "main"), _server(tiny_model, tmp_path, "sub")
    main.update(0, RoleBatch(slots=_main_slots()))
    sub.update(0, RoleBatch(facts=NO_SUBS, scoring=SCORING))
    sub.state.pending["0"] = {"facts": NO_SUBS, "scoring": asdict(SCORING)}  # e.g. a state written before a crash
    metrics = sub.flush(0)
    assert "sub/store_bytes_written" not in metrics  # not applied again
    assert sub.status()["pending"] == [] and sub.state.last_applied == 0
    main.close()
    sub.close()


def test_trained_server_checkpoints_before_recording_and_resumes(tiny_model, tmp_path):
    main = _server(tiny_model, tmp_path, "main", train=True)
    assert not main.restored
    assert main.commit(0) == 0  # nothing was acted: an empty committed buffer
    with pytest.raises(RuntimeError, match="no committed rollouts for iteration 1"):
        main.update(1, RoleBatch(slots=[]))
    metrics = main.update(0, RoleBatch(slots=[]))  # an empty batch: the learner reports it skipped, no step
    assert metrics["main/skipped"] == 1.0
    assert (_ck(tmp_path, "main", 0) / "learner.json").exists()
    assert not (tmp_path / "ck" / "workers" / "main" / "buffers" / "0.json").exists()  # applied: the buffer is gone
    main.close()
    again = _server(tiny_model, tmp_path, "main", train=True)
    assert again.restored and again.status()["last_applied"] == 0
    assert again.update(0, RoleBatch(slots=[]))["main/replayed"] == 1.0
    again.close()


def test_role_name_checked(tiny_model, tmp_path):
    with pytest.raises(ValueError, match=r"role must be one of \('main', 'sub', 'single'\), got 'critic'"):
        _server(tiny_model, tmp_path, "critic")


def test_committed_buffer_is_compact_and_read_back(tiny_model, tmp_path):
    main = _server(tiny_model, tmp_path, "main")
    main.trajectories.add(0, 3, "main_0", {"prompt_ids": [1, 2], "completion_ids": [3]}, "a")
    main.trajectories.add(0, 3, "main_0", {"prompt_ids": [1, 2, 3, 4], "completion_ids": [5]}, "b")
    assert main.trajectories.history(0, 3, "main_0")[1]["prompt_ids"] == [1, 2, 3, 4]
    assert main.commit(0) == 1
    main.trajectories._open.clear()  # as after a restart: read from disk
    assert main.trajectories.load(0) == {"turns": {"3/main_0": [{"prompt_ids": [1, 2], "completion_ids": [3]},
                                                      {"prompt_shared": 3, "prompt_new_ids": [4], "completion_ids": [5]}]},
                               "states": {"3/main_0": ["a", "b"]}}
    main.trajectories.discard(0)
    assert 0 not in main.trajectories._open and not (tmp_path / "ck" / "workers" / "main" / "buffers" / "0.json").exists()
    main.close()


def test_waits_only_for_what_must_be_applied(tiny_model, tmp_path):
    import time

    sub = _server(tiny_model, tmp_path, "sub")
    assert sub.flush(0) == {}  # a fresh server: nothing pending
    sub.store_timeout_s = 3.0
    t = time.monotonic()
    assert sub.update(0, RoleBatch(facts=NO_SUBS, scoring=SCORING, staleness=1)) == {}  # may lag: does not wait at all
    assert time.monotonic() - t < 0.9
    sub.store_timeout_s = 0.5
    t = time.monotonic()
    with pytest.raises(StoreTimeout):  # the end of a stale run: flush waits for every pending iteration
        sub.flush(0)
    assert time.monotonic() - t >= 0.5
    sub.close()


def test_trained_sub_applies_its_slots(tiny_model, tmp_path):
    main, sub = _server(tiny_model, tmp_path, "main"), _server(tiny_model, tmp_path, "sub", train=True)
    main.update(0, RoleBatch(slots=_main_slots()))
    sub.commit(0)
    metrics = sub.update(0, RoleBatch(facts=NO_SUBS, scoring=SCORING))
    assert metrics["sub/skipped"] == 1.0 and metrics["sub/applied_iteration"] == 0.0
    assert (_ck(tmp_path, "sub", 0) / "learner.json").exists()
    main.close()
    sub.close()


def test_checkpoint_is_the_commit_point_when_worker_json_lags(tiny_model, tmp_path):
    """A kill between the checkpoint's rename and worker.json's write: the restarted worker takes
    last_applied and the metrics from the checkpoint, and drops the pending entry it already applied."""
    main = _server(tiny_model, tmp_path, "main", train=True)
    main.commit(0)
    applied = main.update(0, RoleBatch(slots=[]))
    main.close()
    state_file = tmp_path / "ck" / "workers" / "main" / "worker.json"
    state_file.write_text(json.dumps({"last_applied": -1, "metrics": {}, "pending": {"0": {}, "1": {}}}))  # one behind
    extra = json.loads((_ck(tmp_path, "main", 0) / "learner.json").read_text())["extra"]
    assert extra == {"last_applied": 0, "metrics": {"0": _steady(applied)}}
    again = _server(tiny_model, tmp_path, "main", train=True)
    assert again.status()["last_applied"] == 0 and again.status()["pending"] == [1]
    assert _steady(again.update(0, RoleBatch(slots=[]))) == {**_steady(applied), "main/replayed": 1.0}  # not applied twice
    again.close()


class _Recorder:
    """Stands in for FaultPoints: records every point a server passes, kills nothing."""

    def __init__(self) -> None:
        self.hits = []

    def hit(self, name, **where):
        self.hits.append((name, where))


def test_fault_points_are_passed_where_the_crash_tests_kill(tiny_model, tmp_path):
    main = _server(tiny_model, tmp_path / "a", "main", train=True)
    main.faults = _Recorder()
    main.commit(0)
    main.update(0, RoleBatch(slots=[]))
    where = {"role": "main", "iteration": 0}
    assert main.faults.hits == [("after_store_write", where), ("after_update", where), ("after_checkpoint", where)]
    main.close()
    publisher = _server(tiny_model, tmp_path / "b", "main")  # the sub's iteration needs 2 main statistics
    publisher.update(0, RoleBatch(slots=_main_slots()))
    sub = _server(tiny_model, tmp_path / "b", "sub", train=True)
    sub.faults = _Recorder()
    sub.commit(0)
    sub.update(0, RoleBatch(facts=NO_SUBS, scoring=SCORING))
    where = {"role": "sub", "iteration": 0}
    assert sub.faults.hits == [("after_update", where), ("after_checkpoint", where)]
    publisher.close()
    sub.close()


def test_sub_worker_scores_its_trajectories_from_the_store(tiny_model, tmp_path):
    """R_S = b1 + b2 * r_correct(main, read from the store) + b3 * expert (b3 = 0 without an expert
    score, 0 for a bad format), then A_S pooled per query: computed on the sub side, not sent to it."""
    import numpy as np

    main, sub = _server(tiny_model, tmp_path, "main"), _server(tiny_model, tmp_path, "sub")
    main.update(0, RoleBatch(slots=_main_slots((1.0, 0.0))))  # rollout 0 answered correctly, rollout 1 did not
    facts = [[CalledFact("sub_0", True, 0.5, "hops"), CalledFact("sub_1", False, 1.0, "hops")],
             [CalledFact("sub_0", True, None, "none")]]
    metrics = sub.update(0, RoleBatch(facts=facts, scoring=replace(SCORING, d=2)))
    rewards = [0.1 + 0.4 * 1.0 + 0.5 * 0.5, 0.0, 0.1 + 0.4 * 0.0, 0.1]  # rollout 1's sub fills both of its slots
    assert metrics["sub/reward_mean"] == pytest.approx(np.mean(rewards))
    assert metrics["sub/expert_disabled"] == pytest.approx(1 / 3) and metrics["sub/expert_mean"] == pytest.approx(0.5)
    expected = (np.array(rewards) - np.mean(rewards)) / np.std(rewards)
    assert "advantages" not in metrics  # the sub side keeps its A_S: the loop is not handed them
    kept = json.loads((tmp_path / "ck" / "workers" / "sub" / "advantages" / "0.json").read_text())
    assert [(s["index"], s["agent"], s["slot"]) for s in kept] == [(0, "sub_0", 0), (0, "sub_1", 1), (1, "sub_0", 0),
                                                                   (1, "sub_0", 1)]
    assert [s["reward"] for s in kept] == pytest.approx(rewards)
    assert [s["advantage"] for s in kept] == pytest.approx(expected.tolist())
    main.close()
    sub.close()


def test_rollback_returns_to_the_loops_commit_and_committed_prunes(tiny_model, tmp_path):
    """A resumed run: the worker goes back to the newest checkpoint at or before the loop's committed
    iteration and drops what came after; ``committed`` keeps only the newest checkpoint up to it."""
    import torch

    main = _server(tiny_model, tmp_path, "main", train=True)
    for it in range(3):
        main.commit(it)
        main.update(it, RoleBatch(slots=[]))
    assert [p.name for p in main.state.checkpoints()] == ["iter-0", "iter-1", "iter-2"]
    main.committed(1)
    assert [p.name for p in main.state.checkpoints()] == ["iter-1", "iter-2"]  # iter-2 is not committed yet
    main.learner.step = 99  # stands for weights that moved after iteration 1
    assert main.rollback(1) == 1
    assert main.learner.step == 0 and main.status()["last_applied"] == 1  # the empty batches never stepped
    assert [p.name for p in main.state.checkpoints()] == ["iter-1"]
    saved = RoleLearner.load(_ck(tmp_path, "main", 1))
    for name, tensor in saved.model.state_dict().items():
        assert torch.equal(tensor, main.learner.model.state_dict()[name])
    main.close()
    again = _server(tiny_model, tmp_path, "main", train=True)  # a restart reads the rolled-back state
    assert again.status()["last_applied"] == 1
    again.close()


def test_the_learner_shuffles_with_the_run_seed_unless_its_own_is_set(tiny_model, tmp_path):
    from mgrpo_algo.core.config import LearnerConfig, RoleConfig

    tied = _server(tiny_model, tmp_path / "a", "main", train=True, seed=7)
    assert tied.learner.config.seed == 7
    tied.close()
    own = _server(tiny_model, tmp_path / "b", "main", train=True, seed=7, spec=RoleConfig(learner=LearnerConfig(seed=3)))
    assert own.learner.config.seed == 3
    own.close()


def test_the_sub_sides_health_carries_the_learners_figures_not_the_scoring_ones(tiny_model, tmp_path):
    main, sub = _server(tiny_model, tmp_path, "main"), _server(tiny_model, tmp_path, "sub", train=True)
    main.update(0, RoleBatch(slots=_main_slots()))
    sub.commit(0)
    metrics = sub.update(0, RoleBatch(facts=NO_SUBS, scoring=SCORING))
    assert "sub/reward_mean" in metrics and "align/num_masked_slots" in metrics  # logged ...
    health = sub.store.get_health("sub")["metrics"]
    assert health["sub/skipped"] == 1.0  # ... the learner's figures published ...
    assert not any(k in health for k in ("sub/reward_mean", "align/num_masked_slots", "sub/expert_mean"))  # ... not those
    main.update(1, RoleBatch(slots=_main_slots()))
    sub.commit(1)
    with pytest.raises(ValueError, match="unknown advantage estimator 'nope'"):  # the scoring's own estimator
        sub.update(1, RoleBatch(facts=NO_SUBS, scoring=replace(SCORING, estimator="nope")))
    main.close()
    sub.close()


def test_rollback_drops_later_advantages_and_trajectories_and_names_the_role(tiny_model, tmp_path):
    main, sub = _server(tiny_model, tmp_path, "main"), _server(tiny_model, tmp_path, "sub")
    folder = tmp_path / "ck" / "workers" / "sub"
    for it in (0, 1):
        main.update(it, RoleBatch(slots=_main_slots()))
        sub.update(it, RoleBatch(facts=NO_SUBS, scoring=SCORING))
    sub.trajectories.add(2, 0, "sub_0", {"completion_ids": [1]}, "s")
    sub.commit(2)  # collected, never applied
    assert sorted(p.name for p in (folder / "advantages").iterdir()) == ["0.json", "1.json"]
    assert sub.rollback(0) == 0
    assert sorted(p.name for p in (folder / "advantages").iterdir()) == ["0.json"]
    assert not (folder / "buffers" / "2.json").exists() and 2 not in sub.trajectories._open
    trained = _server(tiny_model, tmp_path / "t", "main", train=True)
    trained.commit(0)
    trained.update(0, RoleBatch(slots=[]))
    with pytest.raises(ValueError, match="^main worker: no checkpoint at or before iteration -1"):
        trained.rollback(-1)
    main.close()
    sub.close()
    trained.close()


def test_a_served_roles_weight_push_is_in_the_iterations_metrics(tiny_model, tmp_path):
    main = _server(tiny_model, tmp_path, "main", train=True)
    main.sync = object()  # a served engine: after the checkpoint, the weights are pushed to it
    main._push_weights = lambda: {"main/weight_sync_s": 1.5}
    main.commit(0)
    assert main.update(0, RoleBatch(slots=[]))["main/weight_sync_s"] == 1.5
    main.close()
