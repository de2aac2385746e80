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


def _made_storage(kind: str, tmp_path):
    if kind == "folder":
        made = RunStorage.of_run(tmp_path / "out", str(tmp_path / "run"))
    elif kind == "fsspec-folder":  # a file system with folders but no rename used (commit markers)
        made = RunStorage.of_run(tmp_path / "out", f"local://{tmp_path / 'run'}")
    else:  # one memory file system per process: a fresh root per test
        made = RunStorage.of_run("", f"memory://mgrpo-test-{uuid.uuid4().hex}")
    made.create()
    return made


@pytest.fixture(params=["folder", "memory", "fsspec-folder"])
def storage(request, tmp_path):
    made = _made_storage(request.param, tmp_path)
    yield made
    made.close()


@pytest.fixture(params=["memory", "fsspec-folder"])
def remote_storage(request, tmp_path):
    """The storages written through fsspec (a local folder is read in place and renamed into place whole)."""
    made = _made_storage(request.param, tmp_path)
    assert made.local is None
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
    folder.move("advantages/3.json", "kept/old/3.json")  # into folders not made yet
    assert folder.read_json("kept/old/3.json") == [1] and not folder.exists("advantages/3.json")
    folder.remove("kept")
    folder.remove("nothing/here")  # not there: nothing to do
    assert not folder.exists("kept/old/3.json") and sorted(folder.names()) == ["advantages", "worker.json"]


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


# -- where it is, what it names, what it leaves behind (by value, each kind) ---------------------------

def test_paths_urls_and_kinds_by_value(storage, tmp_path):
    files = storage.child("/workers/main/")  # slashes around a folder's name are not parts
    assert files.path() == files.root and files.path("a/b.json") == f"{storage.root}/workers/main/a/b.json"
    assert files.url == f"{storage.url}/workers/main" and storage.child("x").base_url == storage.url
    kind = "rename" if storage.local is not None else "commit marker"
    assert repr(files) == f"<RunStorage {storage.url}/workers/main {kind}>"
    local = RunStorage(f"file://{tmp_path}/run")  # file:// is a local folder: renames
    assert (local.local, local.root, local.renames) == (tmp_path / "run", str(tmp_path / "run"), True)
    assert repr(local) == f"<RunStorage file://{tmp_path}/run rename>"
    chained = RunStorage(f"simplecache::{tmp_path}/cached")  # an fsspec chain is a URL, not a local path
    assert (chained.renames, chained.local, chained.root) == (False, None, f"{tmp_path}/cached")
    plain = RunStorage.of_run(tmp_path / "out")  # no storage declared: the run folder, made as needed
    assert (plain.local, plain.guarded) == (tmp_path / "out", False)
    name = f"mgrpo-test-{uuid.uuid4().hex}"
    RunStorage(f"memory://{name}/").write_json("w.json", [1])  # a trailing slash names the same root
    assert RunStorage(f"memory://{name}").read_json("w.json") == [1]
    assert RunStorage(f"memory://{name}/").child("a").url == f"memory://{name}/a"


def test_folders_are_made_only_where_a_local_storage_has_them(storage, tmp_path):
    files = storage.child("workers/main")
    files.create_folder()
    if storage.local is not None:
        assert (storage.local / "workers" / "main").is_dir()
    else:  # an object store has no folders: nothing is made
        assert storage.names() == []
    deep = RunStorage(tmp_path / "a" / "b" / "run")
    deep.create()  # its parents too
    assert deep.local.is_dir()
    (tmp_path / "file").write_text("")
    with pytest.raises(StorageUnreachable) as refused:
        RunStorage(tmp_path / "file" / "run").create()
    assert str(refused.value).startswith(f"storage {tmp_path}/file/run cannot be created: [Errno 20] Not a directory")


def test_a_probe_leaves_the_storage_as_it_was_and_a_lost_probe_is_an_error(storage, monkeypatch):
    storage.write_json("workers/main/worker.json", {"last_applied": 1})
    storage.check()
    assert storage.names() == ["workers"] and storage.read_json("workers/main/worker.json") == {"last_applied": 1}
    monkeypatch.setattr(storage, "read_json", lambda rel: None)  # written, then not found (a lagging store)
    with pytest.raises(StorageUnreachable) as lost:
        storage.check()
    assert str(lost.value) == f"storage {storage.url}: a probe file written could not be read back"


def test_a_committed_folder_copied_out_replaces_the_destination(storage, tmp_path):
    files = storage.child("final")
    files.save_folder("main", lambda f: _write_checkpoint(f, 1, files=2))
    dest = tmp_path / "models" / "final" / "main"  # its parents are not there yet
    files.copy_folder_to("main", dest)
    (dest / "stale.bin").write_bytes(b"old")
    cut = dest.parent / f".main.tmp-{os.getpid()}"  # what a copy cut in the middle left
    (cut / "model").mkdir(parents=True)
    files.save_folder("main", lambda f: _write_checkpoint(f, 2, files=1))
    files.copy_folder_to("main", dest)  # over the first copy and the cut one's leftovers: replaced whole
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*")) == ["learner.json", "model", "model/part-0.bin"]
    assert json.loads((dest / "learner.json").read_text())["step"] == 2
    assert os.listdir(dest.parent) == ["main"]  # no temporary copy left beside it
    assert files.is_folder("main") and json.loads((files.local_folder("main") / "learner.json").read_text())["step"] == 2
    if storage.local is None:  # the download was moved into place, not left in the scratch folder
        assert not (storage.scratch() / "downloads" / "final" / "main").exists()


def test_a_download_is_replaced_and_uploads_leave_no_scratch_behind(remote_storage):
    storage = remote_storage
    files = storage.child("final")
    given = []
    files.save_folder("main", lambda f: (given.append(f), _write_checkpoint(f, 1, files=3)))
    assert given[0].parent.parent == storage.scratch()  # staged in this process's scratch folder
    assert os.listdir(storage.scratch()) == []  # and removed once uploaded
    assert len(list((files.local_folder("main") / "model").iterdir())) == 3
    files.save_folder("main", lambda f: _write_checkpoint(f, 2, files=1))
    assert [p.name for p in (files.local_folder("main") / "model").iterdir()] == ["part-0.bin"]  # not the old download's
    scratch = storage.scratch()
    shutil.rmtree(scratch)  # a TMPDIR cleaner was there first: closing still works
    storage.close()
    assert storage.scratch_dir == [] and storage.scratch() != scratch


def test_a_replacement_cut_while_the_old_files_go_leaves_no_committed_folder(remote_storage, monkeypatch):
    """The old folder's marker goes first: a save cut while it deletes the old files leaves a folder that is
    no checkpoint (removed on recovery), never a committed one missing files."""
    storage = remote_storage
    files = storage.child("workers/main")
    files.save_folder("checkpoints/iter-1", lambda f: _write_checkpoint(f, 1))
    files.write_json("checkpoints/notes.json", {"a file": "not a folder"})
    rm = storage.fs.rm

    def dying_rm(path, recursive=False, **kw):
        if recursive:  # one old file deleted, then the connection drops
            rm(f"{path}/learner.json")
            raise ConnectionError("connection reset by peer")
        return rm(path, recursive=recursive, **kw)

    monkeypatch.setattr(storage.fs, "rm", dying_rm)
    with pytest.raises(StorageUnreachable, match=r"\(upload workers/main/checkpoints/iter-1: ConnectionError: connection reset"):
        files.save_folder("checkpoints/iter-1", lambda f: _write_checkpoint(f, 2))
    monkeypatch.undo()
    assert not files.is_folder("checkpoints/iter-1")
    files.discard_incomplete("checkpoints")  # the cut folder goes; a file is no folder and stays
    assert files.names("checkpoints") == ["notes.json"]


def _unused_write(folder):
    raise AssertionError("a lost storage is never written")


#: Each operation of a storage and how its failure names it (inside ``workers/main``).
OPERATIONS = {
    "exists": (lambda s, d: s.exists("a.json"), "look up workers/main/a.json"),
    "read_json": (lambda s, d: s.read_json("a.json"), "read workers/main/a.json"),
    "write_json": (lambda s, d: s.write_json("a.json", {}), "write workers/main/a.json"),
    "move": (lambda s, d: s.move("a.json", "b.json"), "move workers/main/a.json"),
    "remove": (lambda s, d: s.remove("a.json"), "remove workers/main/a.json"),
    "names": (lambda s, d: s.names("advantages"), "list workers/main/advantages"),
    "drop_json_after": (lambda s, d: s.drop_json_after("advantages", 1), "clean workers/main/advantages"),
    "is_folder": (lambda s, d: s.is_folder("checkpoints/iter-1"), "look up workers/main/checkpoints/iter-1"),
    "save_folder": (lambda s, d: s.save_folder("checkpoints/iter-1", _unused_write), "write workers/main/checkpoints/iter-1"),
    "create_folder": (lambda s, d: s.create_folder(), "create workers/main"),
    "copy_folder_to": (lambda s, d: s.copy_folder_to("checkpoints/iter-1", d), "copy workers/main/checkpoints/iter-1"),
}


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
def test_every_operation_on_a_lost_mount_names_itself_and_never_recreates_the_root(tmp_path, operation):
    run = RunStorage.of_run(tmp_path / "out", str(tmp_path / "shared"))
    run.create()
    os.rename(tmp_path / "shared", tmp_path / "unmounted")
    call, named = OPERATIONS[operation]
    with pytest.raises(StorageUnreachable) as lost:
        call(run.child("workers/main"), tmp_path / "copy" / "main")
    assert str(lost.value) == (f"storage {tmp_path}/shared cannot be reached ({named}: its folder is gone; "
                               "is the shared file system mounted?)")
    assert not (tmp_path / "shared").exists()
    with pytest.raises(StorageUnreachable, match=r"\(create \.: its folder is gone"):
        run.create_folder()  # the root itself: named "."


#: Each operation of a storage without a rename, the file system call that fails under it, and its name.
REMOTE = {
    "exists": ("exists", lambda s: s.exists("a.json"), "look up workers/main/a.json"),
    "read_json": ("cat_file", lambda s: s.read_json("a.json"), "read workers/main/a.json"),
    "move": ("copy", lambda s: s.move("a.json", "b.json"), "move workers/main/a.json"),
    "remove": ("exists", lambda s: s.remove("a.json"), "remove workers/main/a.json"),
    "names": ("ls", lambda s: s.names("advantages"), "list workers/main/advantages"),
    "is_folder": ("exists", lambda s: s.is_folder("ck"), "look up workers/main/ck"),
    "save_folder": ("put_file", lambda s: s.save_folder("ck", lambda f: _write_checkpoint(f, 1)), "upload workers/main/ck"),
    "local_folder": ("find", lambda s: s.local_folder("ck"), "download workers/main/ck"),
    "discard_incomplete": ("isdir", lambda s: s.discard_incomplete("checkpoints"), "look up workers/main/checkpoints/iter-9"),
}


@pytest.mark.parametrize("operation", sorted(REMOTE))
def test_every_operation_on_a_refusing_store_names_itself(operation, monkeypatch):
    store = RunStorage(f"memory://mgrpo-test-{uuid.uuid4().hex}")
    store.write_json("workers/main/a.json", [1])
    store.write_json("workers/main/checkpoints/iter-9/model.bin", [1])  # an upload cut before its marker
    method, call, named = REMOTE[operation]

    def refused(*args, **kwargs):
        raise PermissionError("403 Forbidden")

    monkeypatch.setattr(store.fs, method, refused)
    with pytest.raises(StorageUnreachable) as lost:
        call(store.child("workers/main"))
    assert str(lost.value) == f"storage {store.url} cannot be reached ({named}: PermissionError: 403 Forbidden)"
