"""The run storage (:mod:`mgrpo_algo.training.storage`) on its two kinds of file system: a local folder
(atomic by rename) and an fsspec URL without a rename (``memory://``: a commit marker written last), and
the worker's parts (:class:`WorkerState`, :class:`Trajectories`) on each. Fast, no model."""

from __future__ import annotations

import json
import os
import shutil
import uuid

import pytest

from mgrpo_algo.core.config import load_config
from mgrpo_algo.training.preflight import PreflightError, check_storage
from mgrpo_algo.training.storage import COMMIT_MARKER, RunStorage, StorageUnreachable
from mgrpo_algo.training.trajectories import Trajectories
from mgrpo_algo.training.worker_state import WorkerState


@pytest.fixture(params=["folder", "memory"])
def storage(request, tmp_path):
    if request.param == "folder":
        made = RunStorage.of_run(tmp_path / "out", str(tmp_path / "run"))
    else:  # one memory file system per process: a fresh root per test
        made = RunStorage.of_run("", f"memory://mgrpo-test-{uuid.uuid4().hex}")
    made.create()
    yield made
    made.close()


def _write_checkpoint(folder, iteration: int, files: int = 3) -> None:
    """What a learner's save writes, in small (a few files, learner.json among them), as it writes them:
    into a temporary sibling renamed over the target."""
    tmp = folder.parent / f".{folder.name}.writing"
    (tmp / "model").mkdir(parents=True)
    for i in range(files):
        (tmp / "model" / f"part-{i}.bin").write_bytes(bytes([iteration, i]) * 100)
    (tmp / "learner.json").write_text(json.dumps({"step": iteration, "extra": {"last_applied": iteration}}))
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)


def test_the_kind_of_commit_follows_the_file_system(storage):
    assert storage.renames == (storage.local is not None)
    assert RunStorage("file:///tmp/x").renames and RunStorage("file:///tmp/x").local is not None
    assert not RunStorage("memory://x").renames


def test_files_round_trip_and_a_missing_one_reads_as_none(storage):
    assert storage.read_json("workers/main/worker.json") is None and storage.names("workers") == []
    storage.write_json("workers/main/worker.json", {"last_applied": 2})
    storage.write_json("workers/main/advantages/3.json", [1])
    storage.write_json("workers/main/advantages/4.json", [2])
    storage.write_json("workers/main/advantages/10.json", [3])
    assert storage.read_json("workers/main/worker.json") == {"last_applied": 2}
    folder = storage.child("workers/main")
    assert sorted(folder.names()) == ["advantages", "worker.json"]  # no temporary file left behind
    folder.drop_json_after("advantages", 3)
    assert folder.names("advantages") == ["3.json"]
    folder.move("advantages/3.json", "kept/3.json")
    assert folder.read_json("kept/3.json") == [1] and not folder.exists("advantages/3.json")
    folder.remove("kept")
    folder.remove("nothing/here")  # not there: nothing to do
    assert not folder.exists("kept/3.json")


def test_a_folder_is_committed_whole_or_not_at_all(storage, monkeypatch):
    state = WorkerState(storage.child("workers/main"))
    for it in (0, 1):
        storage.child("workers/main").save_folder(f"checkpoints/iter-{it}", lambda f, it=it: _write_checkpoint(f, it))
    assert [p.name for p in state.checkpoints()] == ["iter-0", "iter-1"]
    local = state.local_checkpoint(state.newest())
    assert json.loads((local / "learner.json").read_text())["step"] == 1
    assert (local / "model" / "part-2.bin").read_bytes() == bytes([1, 2]) * 100
    assert not (local / COMMIT_MARKER).exists()  # the marker is the storage's, not the checkpoint's

    # a save cut in the middle (the node lost during its upload, or during the writer's own files)
    if storage.local is None:
        put, calls = storage.fs.put_file, []

        def dying_put(lpath, rpath, **kw):
            calls.append(rpath)
            if len(calls) == 2:
                raise ConnectionError("connection reset by peer")
            return put(lpath, rpath, **kw)

        monkeypatch.setattr(storage.fs, "put_file", dying_put)
    else:
        def dying_write(folder):  # the learner's own protocol: a temporary sibling, renamed at the end
            (folder.parent / f".{folder.name}.tmp-{os.getpid()}" / "model").mkdir(parents=True)
            raise ConnectionError("killed before the rename")
    with pytest.raises((StorageUnreachable, ConnectionError)):
        storage.child("workers/main").save_folder(
            "checkpoints/iter-2", (lambda f: _write_checkpoint(f, 2)) if storage.local is None else dying_write)
    monkeypatch.undo()
    again = WorkerState(storage.child("workers/main"))
    assert again.newest().name == "iter-1"  # the cut one is no checkpoint: the newest complete is
    assert [p.name for p in again.checkpoints()] == ["iter-0", "iter-1"]
    assert "iter-2" not in storage.child("workers/main").names("checkpoints")  # an upload cut: removed


def test_a_committed_folder_saved_again_is_replaced(storage):
    folder = storage.child("final")
    folder.save_folder("main", lambda f: _write_checkpoint(f, 1, files=3))
    folder.save_folder("main", lambda f: _write_checkpoint(f, 2, files=1))
    local = folder.local_folder("main")
    assert sorted(p.name for p in (local / "model").iterdir()) == ["part-0.bin"]  # the old files gone
    assert json.loads((local / "learner.json").read_text())["step"] == 2
    assert folder.save_folder("nothing", lambda f: False) is False and not folder.is_folder("nothing")


def test_worker_state_and_trajectories_on_the_storage(storage):
    files = storage.child("workers/sub")
    state = WorkerState(files)
    state.applied(1, {"sub/loss": 0.5})
    state.pending["2"] = {"facts": []}
    state.save()
    for it in (0, 1, 2):
        files.save_folder(f"checkpoints/iter-{it}", lambda f, it=it: _write_checkpoint(f, it))
    again = WorkerState(files)
    assert again.last_applied == 1 and again.pending == {"2": {"facts": []}}
    again.adopt(again.newest())  # iter-2 carries last_applied 2: worker.json lagged behind it
    assert again.last_applied == 2 and again.pending == {}

    class Learner:
        resumed: list = []

        def resume(self, folder):
            self.resumed.append(json.loads((folder / "learner.json").read_text())["step"])

    learner = Learner()
    again.rollback(0, learner, "sub")
    assert [p.name for p in again.checkpoints()] == ["iter-0"] and learner.resumed == [0] and again.last_applied == 0
    for it in (1, 2):
        files.save_folder(f"checkpoints/iter-{it}", lambda f, it=it: _write_checkpoint(f, it))
    again.prune(2)
    assert [p.name for p in again.checkpoints()] == ["iter-2"]

    trajectories = Trajectories(files, keep=True)
    trajectories.add(3, 0, "sub_0", {"completion_ids": [1]}, "s")
    assert trajectories.commit(3) == 1
    fresh = Trajectories(files, keep=True)  # a worker restarted (on another node): reads the committed buffer
    assert fresh.load(3)["turns"] == {"0/sub_0": [{"completion_ids": [1]}]}
    fresh.retire(3)
    fresh.retire(3)  # a replayed tail: nothing left to move, nothing lost
    assert files.read_json("trajectories/3.json")["states"] == {"0/sub_0": ["s"]} and files.names("buffers") == []
    fresh.drop_after(2)
    assert files.names("trajectories") == []


def test_a_storage_that_cannot_be_reached_raises_one_error(tmp_path, monkeypatch):
    run = RunStorage.of_run(tmp_path / "run", str(tmp_path / "shared"))
    run.create()
    run.write_json("workers/main/worker.json", {"last_applied": 0})
    os.rename(tmp_path / "shared", tmp_path / "unmounted")  # the mount is gone
    with pytest.raises(StorageUnreachable, match=r"storage .*shared cannot be reached \(write workers/main/x.json: "
                                                 r"its folder is gone"):
        run.child("workers/main").write_json("x.json", {})
    assert not (tmp_path / "shared").exists()  # never recreated on the local disk
    remote = RunStorage(f"memory://mgrpo-test-{uuid.uuid4().hex}")

    def refused(*args, **kwargs):
        raise PermissionError("403 Forbidden")

    monkeypatch.setattr(remote.fs, "pipe_file", refused)
    with pytest.raises(StorageUnreachable, match=r"^storage memory://.* cannot be reached \(write w.json: "
                                                 r"PermissionError: 403 Forbidden\)$"):
        remote.write_json("w.json", {})
    monkeypatch.undo()  # fsspec shares one memory file system per process
    with pytest.raises(PreflightError, match="run storage .* cannot be created: .* is not a folder"):
        (tmp_path / "file").write_text("")
        check_storage(str(tmp_path / "file" / "run"))
    check_storage(f"memory://mgrpo-test-{uuid.uuid4().hex}")  # takes a probe and gives it back


def test_the_storage_field_is_checked():
    assert load_config(None, ["placement.storage=memory://x"]).placement.storage == "memory://x"
    with pytest.raises(ValueError, match=r"'placement.storage' has an unknown fsspec protocol 'nfz'"):
        load_config(None, ["placement.storage=nfz://host/run"])


def test_a_fresh_run_refuses_a_storage_that_holds_another_runs_workers(tmp_path):
    from mgrpo_algo.training.run_folder import check_fresh_run_folder

    shared = tmp_path / "shared"
    check_fresh_run_folder(tmp_path / "run", resume=False, overwrite=False, storage=str(shared))  # nothing there yet
    RunStorage(shared).write_json("workers/main/worker.json", {"last_applied": 3})
    with pytest.raises(PreflightError, match=r"run storage '.*shared' holds a previous run's workers \(main\); continue it"):
        check_fresh_run_folder(tmp_path / "run", resume=False, overwrite=False, storage=str(shared))
    check_fresh_run_folder(tmp_path / "run", resume=True, overwrite=False, storage=str(shared))
    check_fresh_run_folder(tmp_path / "run", resume=False, overwrite=True, storage=str(shared))
