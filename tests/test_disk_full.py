"""A full disk stops ``mgrpo train`` in one line with the run resumable, and it resumes once space returns.

The run folder is a real tmpfs of its own (mounted here: the tests run as root, as CI does), filled
by a ballast file while the run trains; the kernel's ENOSPC reaches whichever write comes next
(a checkpoint through torch, SQLite, a JSON file), which is what a user's full disk does.
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import subprocess
import sys
import time

import pytest
from test_crash import ITERATIONS, ROOT, train_args

from mgrpo_algo.distributed.placement import RemoteError
from mgrpo_algo.training.disk_full import FULL_BELOW_BYTES, disk_full_line


def test_disk_full_line_reads_the_error_chain_and_the_free_space(tmp_path):
    plenty = [tmp_path]  # a folder with room: only the error can say the disk is full
    assert disk_full_line(ValueError("bad config"), plenty) is None
    assert disk_full_line(OSError(errno.EACCES, "Permission denied"), plenty) is None
    line = disk_full_line(OSError(errno.ENOSPC, "No space left on device"), plenty)
    assert line is not None and line.startswith(f"the disk of {tmp_path} is full (") and "MiB free" in line
    assert disk_full_line(OSError(errno.EDQUOT, "quota"), plenty) is not None
    assert disk_full_line(sqlite3.OperationalError("database or disk is full"), plenty) is not None
    # torch's checkpoint writer: a RuntimeError raised while handling the ENOSPC
    try:
        try:
            raise OSError(errno.ENOSPC, "write")
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0") from None
    except RuntimeError as exc:
        assert exc.__cause__ is None and disk_full_line(exc, plenty) is not None  # found on __context__
    # a role worker in another process sends the type's name and the message only
    remote = RemoteError("mgrpo-main", "update", "OSError", "[Errno 28] No space left on device", "Traceback ...")
    line = disk_full_line(remote, plenty)
    assert line is not None and line.endswith("; OSError: [Errno 28] No space left on device)")
    # a URL storage is no local disk: it is not looked at
    assert disk_full_line(ValueError("x"), ["s3://bucket/run"]) is None


def test_a_folder_without_free_space_is_full_whatever_the_error(monkeypatch, tmp_path):
    import mgrpo_algo.training.disk_full as disk_full

    monkeypatch.setattr(disk_full, "free_bytes", lambda folder: FULL_BELOW_BYTES - 1)
    line = disk_full_line(RuntimeError("unexpected pos 64 vs 0"), [tmp_path / "not-yet" / "run"])
    assert line is not None and "1.0 MiB free" in line and "RuntimeError: unexpected pos 64 vs 0" in line
    monkeypatch.setattr(disk_full, "free_bytes", lambda folder: FULL_BELOW_BYTES)
    assert disk_full_line(RuntimeError("unexpected pos 64 vs 0"), [tmp_path]) is None


@pytest.fixture
def small_disk(tmp_path):
    """A 200 MiB tmpfs of its own, unmounted after the test."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200m", "tmpfs", str(mount)], capture_output=True, text=True)
    assert done.returncode == 0, f"this test mounts a tmpfs and needs root (CI runs as root): {done.stderr}"
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _train(args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "mgrpo_algo.cli", "train", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_full_disk_stops_the_run_in_one_line_and_it_resumes_when_space_returns(small_scenario, small_disk, tmp_path):
    out = small_disk / "run"
    args = train_args(small_scenario, out, tmp_path / "models")
    run = _train(args)
    metrics, ballast = out / "metrics.jsonl", small_disk / "ballast"
    deadline = time.monotonic() + 600
    while run.poll() is None and not (metrics.exists() and metrics.read_text().count("\n") >= 1):
        assert time.monotonic() < deadline, "no iteration committed in 10 minutes"
        time.sleep(0.02)
    assert run.poll() is None, "the run ended before the disk could fill"
    with ballast.open("wb") as fh:  # fill the disk while iteration 1 runs
        chunk = b"\0" * (1 << 20)
        try:
            while True:
                fh.write(chunk)
                fh.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    stdout, stderr = run.communicate(timeout=600)
    assert run.returncode == 1, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(f"mgrpo: the disk of {out} is full (") and last.endswith(
        "the iterations committed so far are kept: rerun with --resume once space is freed"), last
    committed = json.loads((out / "loop_state.json").read_text())["iteration"]
    assert 0 <= committed < ITERATIONS - 1

    # still full: resuming stops in the same one line, and commits nothing
    again = _train([*args, "--resume"])
    _, stderr = again.communicate(timeout=600)
    assert again.returncode == 1 and "Traceback" not in stderr and " is full (" in stderr.strip().splitlines()[-1], stderr[-3000:]
    assert json.loads((out / "loop_state.json").read_text())["iteration"] == committed

    ballast.unlink()  # space returns
    resumed = _train([*args, "--resume"])
    stdout, stderr = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, stderr[-3000:]
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [m["iteration"] for m in lines] == list(range(ITERATIONS))  # none lost, none applied twice
    assert [m["main/step"] - m["iteration"] for m in lines] == [1.0] * ITERATIONS
    for role in ("main", "sub"):
        assert sorted(p.name for p in (out / "workers" / role / "checkpoints").glob("iter-*")) == [f"iter-{ITERATIONS - 1}"]
