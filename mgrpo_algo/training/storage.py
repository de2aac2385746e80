"""Where a run's role workers keep their durable state: the run folder, a shared file system, or an object store.

Every role worker keeps its state (``worker.json``, token buffers, A_S, per-iteration checkpoints) under
``workers/<role>`` of the run's storage (``placement.storage``); stage checkpoints go to
``checkpoints/stage<n>/<role>`` and, when a storage is declared, the final models to ``final/<role>`` there
too. The default storage is the run folder (``out_dir``): what a run on one machine always did, byte for
byte. On a cluster each worker may run on another node and be restarted on a third after a node loss, so
its state must be where every node reads it: a folder on a shared file system (NFS, the same path on every
node) or an fsspec URL (``s3://bucket/run``, ``gs://...``, ``memory://`` in tests; the fsspec backend of the
scheme must be installed on every node, e.g. ``s3fs``). This module is the one place that reads and writes it.

Atomic commits keep their guarantees on both kinds:

- a local or mounted folder (``renames``): a file is written beside its target and renamed over it, a
  checkpoint folder is written beside its target and renamed into place (as the learner always saved it);
- a store without a rename (every fsspec URL but ``file://``): a file is one object written whole (a PUT is
  atomic on object stores), a folder is uploaded file by file and then its commit marker (``.committed``)
  is written last; a folder without its marker is an interrupted upload: never read, removed on recovery.

A storage that cannot be read or written (a mount gone, a network failure, refused credentials) raises
:class:`StorageUnreachable`; the run stops there with what it committed so far intact (``mgrpo train
--resume`` continues once the storage is back). A missing file is not an error: readers get None.
Nothing here creates the storage's root while a run goes on (a missing mount must not become a fresh local
folder): :meth:`RunStorage.create` does it once, when the run starts.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

from mgrpo_env import strict_json

__all__ = ["COMMIT_MARKER", "RunStorage", "StorageUnreachable", "drop_json_after", "write_json"]

T = TypeVar("T")

#: The file a folder's upload writes last on a storage without a rename: the folder is complete with it only.
COMMIT_MARKER = ".committed"


class StorageUnreachable(OSError):
    """The run's storage could not be read or written; the message names the storage and the operation."""


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as JSON at ``path`` atomically (a temporary file renamed over it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}")
    tmp.write_text(strict_json.dumps(data))
    os.replace(tmp, path)


def drop_json_after(folder: Path, iteration: int) -> None:
    """Delete ``folder/<t>.json`` for every iteration t after ``iteration``."""
    for path in folder.glob("*.json") if folder.exists() else []:
        if int(path.stem) > iteration:
            path.unlink()


def _is_url(spec: str) -> bool:
    return "://" in spec or "::" in spec


class RunStorage:
    """A run's storage (or a folder inside it): a local path or an fsspec URL (see the module docstring).

    Paths given to the methods are relative (``"checkpoints/iter-3"``), with ``/`` between parts.
    """

    def __init__(self, spec: str | os.PathLike, *, _parent: RunStorage | None = None, _rel: str = "") -> None:
        if _parent is not None:  # a folder inside a storage: same file system, same root guard
            self.fs, self.renames, self.base, self.scratch_dir = _parent.fs, _parent.renames, _parent.base, _parent.scratch_dir
            self.guarded, self.base_url = _parent.guarded, _parent.base_url
            self.root = f"{_parent.root}/{_rel}" if _parent.root else _rel
            self.url = f"{_parent.url.rstrip('/')}/{_rel}"
            self.local = _parent.local / _rel if _parent.local is not None else None
            return
        spec = str(spec)
        if _is_url(spec) and not spec.startswith("file://"):
            import fsspec

            self.fs, root = fsspec.core.url_to_fs(spec)
            self.root, self.renames, self.local = root.rstrip("/"), False, None
        else:
            path = Path(spec[len("file://"):] if spec.startswith("file://") else spec).expanduser().absolute()
            self.fs, self.root, self.renames, self.local = None, str(path), True, path
        self.url, self.base, self.base_url = spec, self.root, spec
        self.scratch_dir: list[Path] = []  # shared by the folders inside: one scratch folder per storage
        self.guarded = False  # a run's storage (of_run): its local root is never recreated mid-run

    @classmethod
    def of_run(cls, run_dir: str | os.PathLike, storage: str = "") -> RunStorage:
        """A run's storage: ``placement.storage`` (its root must exist: :meth:`create`), else its run folder
        (made as needed, as always)."""
        made = cls(storage or run_dir)
        made.guarded = bool(storage)
        return made

    def child(self, rel: str) -> RunStorage:
        """The folder ``rel`` inside this storage, as a storage of its own."""
        return RunStorage("", _parent=self, _rel=rel.strip("/"))

    def __repr__(self) -> str:
        return f"<RunStorage {self.url} {'rename' if self.renames else 'commit marker'}>"

    def path(self, rel: str = "") -> str:
        """The full path of ``rel`` (a local path, or the file system's path of the URL)."""
        return f"{self.root}/{rel}" if rel else self.root

    # -- failures ---------------------------------------------------------------------------------

    def _where(self, rel: str) -> str:
        """``rel`` as a path inside the run's storage (for messages)."""
        return self.path(rel)[len(self.base):].lstrip("/") or "."

    @contextlib.contextmanager
    def _io(self, what: str, rel: str) -> Iterator[None]:
        """Any failure but a missing file becomes StorageUnreachable naming the storage and ``what``."""
        self._guard(what, rel)
        try:
            yield
        except FileNotFoundError:
            raise
        except StorageUnreachable:
            raise
        except Exception as exc:
            raise StorageUnreachable(f"storage {self.base_url} cannot be reached ({what} {self._where(rel)}: "
                                     f"{type(exc).__name__}: {exc})") from exc

    def _guard(self, what: str, rel: str) -> None:
        # a local storage whose root is gone (an NFS mount lost): never recreate it on the local disk
        if self.guarded and self.local is not None and not os.path.isdir(self.base):
            raise StorageUnreachable(f"storage {self.base_url} cannot be reached ({what} {self._where(rel)}: "
                                     "its folder is gone; is the shared file system mounted?)")

    def create(self) -> None:
        """Make the storage's root (a local folder; nothing to make on an object store). Once, at the run's start."""
        if self.local is not None:
            try:
                self.local.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StorageUnreachable(f"storage {self.url} cannot be created: {exc}") from exc

    def create_folder(self) -> None:
        """This folder, on a local storage whose root is there (a lost mount is not recreated); nothing to
        make on an object store."""
        if self.local is not None:
            with self._io("create", ""):
                self.local.mkdir(parents=True, exist_ok=True)

    def check(self) -> None:
        """The storage takes a file and gives it back (a probe written, read and deleted)."""
        self.create()
        probe = f".probe-{os.getpid()}-{time.monotonic_ns()}"
        self.write_json(probe, {"probe": True})
        if self.read_json(probe) != {"probe": True}:
            raise StorageUnreachable(f"storage {self.url}: a probe file written could not be read back")
        self.remove(probe)

    # -- files --------------------------------------------------------------------------------------

    def exists(self, rel: str) -> bool:
        with self._io("look up", rel):
            return (self.local / rel).exists() if self.local is not None else self.fs.exists(self.path(rel))

    def read_json(self, rel: str) -> Any:
        """The JSON at ``rel``, None when there is no such file."""
        try:
            with self._io("read", rel):
                if self.local is not None:
                    text = (self.local / rel).read_text()
                else:
                    text = self.fs.cat_file(self.path(rel)).decode()
        except FileNotFoundError:
            return None
        return json.loads(text)

    def write_json(self, rel: str, data: Any) -> None:
        """``data`` as JSON at ``rel``, atomically (renamed into place, or one object written whole)."""
        with self._io("write", rel):
            if self.local is not None:
                write_json(self.local / rel, data)
            else:
                self._makedirs(self.path(rel).rsplit("/", 1)[0])
                self.fs.pipe_file(self.path(rel), strict_json.dumps(data).encode())

    def move(self, src: str, dst: str) -> None:
        """The file ``src`` to ``dst`` (renamed; copied then deleted without a rename: idempotent, so a
        cut move is finished by doing it again)."""
        with self._io("move", src):
            if self.local is not None:
                (self.local / dst).parent.mkdir(parents=True, exist_ok=True)
                os.replace(self.local / src, self.local / dst)
            else:
                self._makedirs(self.path(dst).rsplit("/", 1)[0])
                self.fs.copy(self.path(src), self.path(dst))
                self.fs.rm(self.path(src))

    def remove(self, rel: str) -> None:
        """The file or folder ``rel``; nothing when it is not there."""
        with self._io("remove", rel):
            if self.local is not None:
                target = self.local / rel
                if target.is_dir() and not target.is_symlink():
                    shutil.rmtree(target, ignore_errors=True)
                else:
                    target.unlink(missing_ok=True)
            elif self.fs.exists(self.path(rel)):
                if self.fs.isdir(self.path(rel)):
                    self.fs.rm(self.path(rel), recursive=True)
                else:
                    self.fs.rm(self.path(rel))

    def names(self, rel: str = "") -> list[str]:
        """The names directly inside the folder ``rel`` (files and folders), [] when there is none."""
        try:
            with self._io("list", rel):
                if self.local is not None:
                    return os.listdir(self.local / rel) if (self.local / rel).is_dir() else []
                return [PurePosixPath(p.rstrip("/")).name for p in self.fs.ls(self.path(rel), detail=False)]
        except (FileNotFoundError, NotADirectoryError):
            return []

    def drop_json_after(self, rel: str, iteration: int) -> None:
        """Delete ``rel/<t>.json`` for every iteration t after ``iteration``."""
        if self.local is not None:
            with self._io("clean", rel):
                drop_json_after(self.local / rel, iteration)
            return
        for name in self.names(rel):
            if name.endswith(".json") and int(name[:-5]) > iteration:
                self.remove(f"{rel}/{name}")

    # -- folders (checkpoints, models) --------------------------------------------------------------

    def is_folder(self, rel: str) -> bool:
        """``rel`` is a folder (on a storage without a rename: a committed one)."""
        with self._io("look up", rel):
            if self.local is not None:
                return (self.local / rel).is_dir()
            return self.fs.exists(self.path(f"{rel}/{COMMIT_MARKER}"))

    def save_folder(self, rel: str, write: Callable[[Path], T]) -> T:
        """Have ``write(folder)`` write the folder ``rel`` and commit it; returns what ``write`` returns.

        A local storage hands ``write`` the target itself (the writers rename their own temporary folder
        into place). Otherwise ``write`` fills a local scratch folder, which is uploaded over ``rel`` (the old
        one's marker removed first, then the old files), the marker written last.
        """
        if self.local is not None:
            self._guard("write", rel)
            return write(self.local / rel)
        staging = Path(tempfile.mkdtemp(prefix="upload-", dir=self.scratch()))
        try:
            result = write(staging / "folder")
            if (staging / "folder").is_dir():
                with self._io("upload", rel):
                    target = self.path(rel)
                    if self.fs.exists(target):
                        if self.fs.exists(f"{target}/{COMMIT_MARKER}"):
                            self.fs.rm(f"{target}/{COMMIT_MARKER}")
                        self.fs.rm(target, recursive=True)
                    for file in sorted(p for p in (staging / "folder").rglob("*") if p.is_file()):
                        dest = f"{target}/{file.relative_to(staging / 'folder').as_posix()}"
                        self._makedirs(dest.rsplit("/", 1)[0])
                        self.fs.put_file(str(file), dest)
                    self.fs.pipe_file(f"{target}/{COMMIT_MARKER}", b"")  # last: the folder is complete
            return result
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def discard_incomplete(self, rel: str) -> None:
        """Remove the folders inside ``rel`` that an interrupted upload left without their commit marker
        (nothing to do on a local storage: the writers' own recovery handles their temporary folders)."""
        if self.local is not None:
            return
        for name in self.names(rel):
            if not self.is_folder(f"{rel}/{name}") and self._isdir(f"{rel}/{name}"):
                self.remove(f"{rel}/{name}")

    def local_folder(self, rel: str) -> Path:
        """A local copy of the committed folder ``rel`` to load from: the folder itself on a local storage,
        else a download into this node's scratch folder (replaced at each call for the same ``rel``)."""
        if self.local is not None:
            return self.local / rel
        dest = self.scratch() / "downloads" / rel
        shutil.rmtree(dest, ignore_errors=True)
        with self._io("download", rel):
            source = self.path(rel)
            for remote in self.fs.find(source):
                name = remote[len(source):].lstrip("/")
                if name == COMMIT_MARKER:
                    continue
                (dest / name).parent.mkdir(parents=True, exist_ok=True)
                self.fs.get_file(remote, str(dest / name))
        return dest

    def copy_folder_to(self, rel: str, dest: Path) -> None:
        """The committed folder ``rel`` copied to the local folder ``dest`` (replaced; renamed into place)."""
        source = self.local_folder(rel)
        tmp = dest.parent / f".{dest.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if self.local is not None:
            with self._io("copy", rel):
                shutil.copytree(source, tmp)
        else:
            os.replace(source, tmp)  # the download is this process's own
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp, dest)

    # -- helpers ----------------------------------------------------------------------------------

    def _isdir(self, rel: str) -> bool:
        with self._io("look up", rel):
            return bool(self.fs.isdir(self.path(rel)))

    def _makedirs(self, path: str) -> None:
        """Folders where the file system has them (object stores have none: a no-op there)."""
        with contextlib.suppress(FileExistsError):
            self.fs.makedirs(path, exist_ok=True)

    def scratch(self) -> Path:
        """This process's scratch folder for uploads and downloads (under TMPDIR: the node's own disk)."""
        if not self.scratch_dir:
            self.scratch_dir.append(Path(tempfile.mkdtemp(prefix="mgrpo-storage-")))
        return self.scratch_dir[0]

    def close(self) -> None:
        """Remove this process's scratch folder (downloads, leftover uploads)."""
        while self.scratch_dir:
            shutil.rmtree(self.scratch_dir.pop(), ignore_errors=True)
