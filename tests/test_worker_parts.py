"""The role worker's parts on their own, by hand, without a model: its token trajectories
(:class:`~mgrpo_algo.training.trajectories.Trajectories`: kept, committed, retired, rolled back) and its
commit point (:class:`~mgrpo_algo.training.worker_state.WorkerState`: ``worker.json``, the per-iteration
checkpoints, adopt, rollback, prune). Fast; in the mutation run's selection (``make mutation``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mgrpo_algo.training.trajectories import Trajectories, drop_json_after, trajectory_key, write_json
from mgrpo_algo.training.worker_state import WorkerState

TURN = {"prompt_ids": [1, 2], "completion_ids": [3]}


# -- Trajectories -------------------------------------------------------------------------------------


def test_history_is_the_agents_own_turns_and_empty_for_one_that_never_acted(tmp_path):
    trajectories = Trajectories(tmp_path / "w")
    assert trajectories.history(0, 3, "sub_0") == [] and trajectories.history(5, 0, "main_0") == []
    trajectories.add(0, 3, "sub_0", TURN, "s0")
    trajectories.add(0, 3, "sub_1", {"completion_ids": [9]}, "s1")
    trajectories.add(0, 3, "sub_0", {"prompt_ids": [1, 2, 3, 4], "completion_ids": [5]}, "s2")
    assert trajectories.history(0, 3, "sub_0") == [TURN, {"prompt_ids": [1, 2, 3, 4], "completion_ids": [5]}]
    assert trajectories.history(1, 3, "sub_0") == []  # another iteration's
    assert trajectories.load(0)["states"] == {"3/sub_0": ["s0", "s2"], "3/sub_1": ["s1"]}
    assert trajectory_key(3, "sub_0") == "3/sub_0"


def test_retire_deletes_or_keeps_each_applied_iteration(tmp_path):
    dropped = Trajectories(tmp_path / "a")
    dropped.add(0, 0, "main_0", TURN, "s")
    assert dropped.commit(0) == 1
    dropped.retire(0)
    assert 0 not in dropped._open and not (tmp_path / "a" / "buffers" / "0.json").exists()
    assert not (tmp_path / "a" / "trajectories").exists()  # not kept: nowhere
    kept = Trajectories(tmp_path / "b", keep=True)
    for it in (0, 1):  # the second retire finds its folder there already
        kept.add(it, 2, "main_0", {**TURN, "logprobs": [-0.5 - it]}, "s")
        kept.commit(it)
        written = (tmp_path / "b" / "buffers" / f"{it}.json").read_text()
        kept.retire(it)
        assert it not in kept._open and not (tmp_path / "b" / "buffers" / f"{it}.json").exists()
        assert (tmp_path / "b" / "trajectories" / f"{it}.json").read_text() == written  # moved as committed
    kept.retire(1)  # a replayed tail: nothing left to move, nothing lost
    assert json.loads((tmp_path / "b" / "trajectories" / "1.json").read_text())["turns"]["2/main_0"][0]["logprobs"] == [-1.5]


def test_drop_after_rolls_back_later_iterations_only(tmp_path):
    trajectories = Trajectories(tmp_path / "w", keep=True)
    for it in range(4):
        trajectories.add(it, 0, "main_0", TURN, "s")
        trajectories.commit(it)
    for it in (0, 1):
        trajectories.retire(it)
    trajectories.drop_after(1)
    assert sorted(p.name for p in (tmp_path / "w" / "trajectories").iterdir()) == ["0.json", "1.json"]
    assert list((tmp_path / "w" / "buffers").iterdir()) == []
    assert sorted(trajectories._open) == []  # 0 and 1 retired, 2 and 3 dropped
    trajectories.add(5, 0, "main_0", TURN, "s")
    trajectories.add(6, 0, "main_0", TURN, "s")
    trajectories.drop_after(5)
    assert sorted(trajectories._open) == [5]


def test_drop_json_after_and_write_json(tmp_path):
    folder = tmp_path / "a" / "b"
    write_json(folder / "3.json", [1])  # the folders are made
    write_json(folder / "4.json", {"x": 2})
    write_json(folder / "10.json", [])
    (folder / "notes.txt").write_text("kept")
    drop_json_after(folder, 3)
    assert sorted(p.name for p in folder.iterdir()) == ["3.json", "notes.txt"]
    assert json.loads((folder / "3.json").read_text()) == [1]
    assert [p.name for p in folder.parent.iterdir()] == ["b"]  # no temporary file left behind
    drop_json_after(tmp_path / "missing", 0)  # nothing to drop: no error


# -- WorkerState ----------------------------------------------------------------------------------------


def _checkpoint(state: WorkerState, iteration: int, *, last_applied: int | None = None, metrics=None,
                complete: bool = True) -> Path:
    folder = state.checkpoint_dir(iteration)
    folder.mkdir(parents=True)
    if complete:
        extra = {} if last_applied is None else {"last_applied": last_applied}
        if metrics is not None:
            extra["metrics"] = metrics
        (folder / "learner.json").write_text(json.dumps({"step": iteration, "extra": extra}))
    return folder


class _Learner:
    """Stands in for RoleLearner.resume: records the folder it resumed from."""

    def __init__(self) -> None:
        self.resumed: list[str] = []

    def resume(self, folder: Path) -> None:
        self.resumed.append(folder.name)


def test_a_fresh_state_and_a_saved_one(tmp_path):
    state = WorkerState(tmp_path)
    assert state.last_applied == -1 and state.metrics_of(0) == {} and state.pending == {}
    state.applied(4, {"main/loss": 0.5})
    state.pending["5"] = {"facts": []}
    state.save()
    again = WorkerState(tmp_path)
    assert again.last_applied == 4 and again.metrics_of(4) == {"main/loss": 0.5} and again.metrics_of(3) == {}
    assert again.pending == {"5": {"facts": []}}
    again.applied(5, {})
    assert again.pending == {}  # an applied iteration is no longer pending
    (tmp_path / "worker.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"worker\.json: not a worker state"):
        WorkerState(tmp_path)


def test_checkpoints_in_iteration_order_and_the_newest_complete_one(tmp_path):
    state = WorkerState(tmp_path)
    assert state.checkpoints() == [] and state.newest() is None
    for it in (10, 2, 9):
        _checkpoint(state, it, last_applied=it)
    (tmp_path / "checkpoints" / "iter-11.txt").write_text("not a checkpoint")
    assert [p.name for p in state.checkpoints()] == ["iter-2", "iter-9", "iter-10"]  # by number, not by name
    assert state.newest().name == "iter-10"
    _checkpoint(state, 12, complete=False)  # a save cut before learner.json
    assert state.newest() is None


def test_adopt_only_a_newer_checkpoint(tmp_path):
    state = WorkerState(tmp_path)
    state.applied(3, {"main/loss": 1.0})
    state.pending.update({"3": {}, "4": {}, "5": {}})
    state.adopt(_checkpoint(state, 3, last_applied=3, metrics={"3": {"main/loss": 2.0}}))
    assert state.metrics_of(3) == {"main/loss": 1.0} and sorted(state.pending) == ["3", "4", "5"]  # as new: kept
    state.adopt(_checkpoint(state, 2))  # a checkpoint without last_applied: never newer
    assert state.last_applied == 3
    state.adopt(_checkpoint(state, 4, last_applied=4))  # newer, without metrics
    assert state.last_applied == 4 and state.metrics_of(4) == {} and sorted(state.pending) == ["5"]
    fresh = WorkerState(tmp_path / "fresh")
    fresh.applied(0, {})
    fresh.adopt(_checkpoint(fresh, 1))  # no last_applied in it: -1 is not newer than 0
    assert fresh.last_applied == 0


def test_rollback_keeps_what_the_loop_committed_and_drops_the_rest(tmp_path):
    state = WorkerState(tmp_path)
    for it in (1, 2, 3):
        _checkpoint(state, it, last_applied=it)
    state.applied(3, {"main/loss": 0.1})
    state.pending.update({"2": {}, "3": {}})
    learner = _Learner()
    state.rollback(2, learner, "main")
    assert [p.name for p in state.checkpoints()] == ["iter-1", "iter-2"] and learner.resumed == ["iter-2"]
    assert state.last_applied == 2 and state.metrics_of(2) == {} and state.data["metrics"] == {}
    assert sorted(state.pending) == ["2"]
    state.applied(2, {"main/loss": 0.2})
    state.rollback(2, learner, "main")  # already there: nothing resumed, the metrics kept
    assert learner.resumed == ["iter-2"] and state.metrics_of(2) == {"main/loss": 0.2}
    with pytest.raises(ValueError, match=r"^sub worker: no checkpoint at or before iteration 0 under .*/checkpoints$"):
        state.rollback(0, learner, "sub")


def test_rollback_of_a_frozen_worker_and_prune(tmp_path):
    frozen = WorkerState(tmp_path / "frozen")
    frozen.applied(5, {"x": 1.0})
    frozen.rollback(3, None, "sub")  # no learner, no checkpoints: the loop's iteration
    assert frozen.last_applied == 3 and frozen.data["metrics"] == {}
    state = WorkerState(tmp_path / "trained")
    for it in (0, 1, 2, 4):
        _checkpoint(state, it, last_applied=it)
    state.prune(2)
    assert [p.name for p in state.checkpoints()] == ["iter-2", "iter-4"]  # the newest at or before 2, and later
    state.prune(3)
    assert [p.name for p in state.checkpoints()] == ["iter-2", "iter-4"]
