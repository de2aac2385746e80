"""Role-server placement: the same toy behaves the same in "local", "processes" and "ray".

The toy is ``mgrpo_algo.distributed.probe.EchoServer``. It lives in the package, not in ``tests/``: a
``spawn``-ed child gets the parent's ``sys.path`` but a Ray worker does not (it gets the driver's
working directory only), so a class importable from the installed package is the one way that works in
every placement, on every node, without ``sys.path`` tricks. The Ray tests share one 2-CPU local
cluster (module-scoped fixture; skipped when Ray is not installed).
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import tempfile
import threading
import time

import pytest

from mgrpo_algo.distributed.placement import (
    PLACEMENTS,
    RemoteError,
    RoleCallTimeout,
    RoleServerDied,
    spawn,
)
from mgrpo_algo.distributed.probe import EchoServer

REMOTE = [p for p in PLACEMENTS if p != "local"]


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    if ray.is_initialized():  # someone else's cluster: use it, leave it running
        yield ray
        return
    temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths have a length limit
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=temp_dir)
    try:
        yield ray
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


def _use(request, placement: str) -> str:
    if placement == "ray":
        request.getfixturevalue("ray_cluster")
    return placement


@pytest.fixture(params=PLACEMENTS)
def placement(request):
    return _use(request, request.param)


@pytest.fixture(params=REMOTE)
def remote(request):
    return _use(request, request.param)


@pytest.fixture
def handles():
    """Spawned handles, closed after the test whatever happened."""
    made = []
    yield made
    for handle in made:
        handle.close(timeout_s=10)


def toy(handles, placement, start=0, **options):
    handle = spawn(EchoServer, {"start": start}, placement=placement, name=f"toy{len(handles)}", **options)
    handles.append(handle)
    return handle


def gone(pid: int, within_s: float = 10.0) -> bool:
    """True once ``pid`` has exited (a zombie not yet reaped by its parent counts as exited)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_same_results_in_every_placement(handles, placement):
    handle = toy(handles, placement, start=10)
    got = [handle.call("incr"), handle.call("incr", by=5), handle.call("get"),
           handle.call("echo", 1, "a", [2.5], k={"x": None}), handle.call("sleep", 0.01), handle.call("noop")]
    ref = EchoServer(start=10)
    assert got == [ref.incr(), ref.incr(by=5), ref.get(), ref.echo(1, "a", [2.5], k={"x": None}), 0.01, None]
    assert handle.alive() and handle.placement == placement and handle.name == "toy0"
    assert handle.pid is None if placement == "local" else handle.call("getpid") == handle.pid


def test_remote_exception_carries_type_and_traceback(handles, placement):
    handle = toy(handles, placement)
    with pytest.raises(RemoteError) as info:
        handle.call("fail", "boom")
    err = info.value
    assert (err.name, err.method, err.type_name) == ("toy0", "fail", "ValueError")
    assert err.message == "toy failure: boom"
    assert 'raise ValueError(f"toy failure: {message}")' in err.remote_traceback
    assert "in fail" in err.remote_traceback and err.remote_traceback in str(err)
    assert isinstance(err.__cause__, ValueError)
    with pytest.raises(RemoteError, match="AttributeError"):
        handle.call("no_such_method")
    with pytest.raises(ValueError, match="public"):
        handle.call("_private")
    with pytest.raises(RemoteError, match="ValueError"):
        handle.submit("fail", "via submit").result(timeout=30)
    assert handle.call("incr") == 1 and handle.alive()  # errors leave the server usable


def test_constructor_error_is_raised_by_spawn(placement):
    with pytest.raises(RemoteError) as info:
        spawn(EchoServer, {"fail_on_start": True}, placement=placement, name="bad")
    assert (info.value.method, info.value.type_name) == ("__init__", "RuntimeError")
    assert "asked to fail on start" in info.value.remote_traceback
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("mgrpo-role:")]


def test_submit_runs_two_roles_concurrently(handles, placement):
    # On Ray: two actors of num_cpus=1 fit the 2-CPU cluster and run at the same time.
    a, b = toy(handles, placement, num_cpus=1), toy(handles, placement, num_cpus=1)
    t0 = time.perf_counter()
    futures = [a.submit("sleep", 1.0), b.submit("sleep", 1.0)]
    assert [f.result(timeout=30) for f in futures] == [1.0, 1.0]
    assert time.perf_counter() - t0 < 1.7  # sequential would be 2.0


def test_calls_from_many_threads_are_serialised(handles, placement):
    handle = toy(handles, placement)
    results: list[int] = []

    def work():
        results.extend(handle.call("incr") for _ in range(25))

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(results) == list(range(1, 201)) and handle.call("get") == 200  # no reply lost or swapped


def test_restart_gives_a_fresh_instance(handles, placement):
    handle = toy(handles, placement, start=7)
    assert [handle.call("incr") for _ in range(3)] == [8, 9, 10]
    old_pid = handle.pid
    handle.restart()
    assert handle.call("get") == 7 and handle.alive()  # state reset: a new object
    assert handle.pid is None if placement == "local" else handle.pid != old_pid
    if old_pid is not None:
        assert gone(old_pid)


def test_kill_makes_calls_raise_died_and_restart_recovers(handles, placement):
    handle = toy(handles, placement, start=3)
    handle.kill()
    assert not handle.alive()
    t0 = time.perf_counter()
    with pytest.raises(RoleServerDied) as info:
        handle.call("get")
    assert time.perf_counter() - t0 < 2.0
    assert info.value.name == "toy0" and "toy0" in str(info.value)
    handle.restart()
    assert handle.call("get") == 3 and handle.alive()


def test_sigkill_of_the_child_is_seen_promptly(handles):
    handle = toy(handles, "processes", start=1)
    handle.call("incr")
    old_pid = handle.pid
    os.kill(old_pid, signal.SIGKILL)
    t0 = time.perf_counter()
    with pytest.raises(RoleServerDied) as info:
        handle.call("get")
    assert time.perf_counter() - t0 < 2.0
    assert info.value.exitcode == -signal.SIGKILL and "SIGKILL" in str(info.value)
    assert not handle.alive()
    with pytest.raises(RoleServerDied):  # and it stays dead
        handle.call("get")
    handle.restart()
    assert handle.call("get") == 1 and handle.pid != old_pid


def test_a_role_server_process_carries_its_name(handles):
    """ps, top and pkill tell the role servers apart: the kernel's name of each is the handle's."""
    first, second = toy(handles, "processes"), toy(handles, "processes")
    for handle, name in ((first, "toy0"), (second, "toy1")):
        with open(f"/proc/{handle.pid}/comm") as fh:
            assert fh.read().strip() == name
    long = spawn(EchoServer, {}, placement="processes", name="mgrpo-a-very-long-role-name")
    handles.append(long)
    with open(f"/proc/{long.pid}/comm") as fh:
        assert fh.read().strip() == "mgrpo-a-very-lo"  # the kernel keeps 15 bytes


def test_death_during_a_call_fails_the_call_promptly(handles, remote):
    handle = toy(handles, remote)
    future = handle.submit("sleep", 30)
    time.sleep(0.5)  # the call is running in the server
    t0 = time.perf_counter()
    os.kill(handle.pid, signal.SIGKILL)  # the Ray worker runs on this machine too
    with pytest.raises(RoleServerDied):
        future.result(timeout=15)
    assert time.perf_counter() - t0 < 5.0
    handle.restart()
    assert handle.call("incr") == 1


def test_timeout_leaves_the_server_usable(handles, remote):
    handle = toy(handles, remote)
    with pytest.raises(RoleCallTimeout):
        handle.call("sleep", 0.5, timeout_s=0.1)
    assert isinstance(RoleCallTimeout(), TimeoutError)
    assert handle.call("incr") == 1  # the late reply of sleep (0.5) is not taken for this one
    assert handle.alive()


def test_close_runs_the_objects_close_and_leaves_no_process(placement, tmp_path):
    marker = tmp_path / "closed.txt"
    with spawn(EchoServer, {"marker_path": str(marker)}, placement=placement, name="c") as handle:
        pid = handle.call("getpid")
        assert handle.call("incr") == 1
    assert marker.read_text() == f"closed {pid}\n"
    assert not handle.alive()
    if placement != "local":
        assert pid != os.getpid() and gone(pid)
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("mgrpo-role:")]
    with pytest.raises(RoleServerDied):
        handle.call("get")
    handle.close()  # idempotent
    assert marker.read_text() == f"closed {pid}\n"


def test_close_of_a_dead_server_and_restart_after_close(handles, placement):
    handle = toy(handles, placement, start=2)
    handle.kill()
    handle.close()  # nothing to ask: no error
    handle.restart()  # a closed handle can be started again
    assert handle.call("get") == 2 and handle.alive()


def test_env_reaches_the_server(handles, placement):
    key = "MGRPO_PLACEMENT_TEST_VAR"
    if placement == "local":
        with pytest.warns(UserWarning, match="env is ignored"):
            handle = toy(handles, placement, env={key: "yes"})
        assert handle.call("getenv", key) is None and key not in os.environ
    else:
        assert toy(handles, placement, env={key: "yes"}).call("getenv", key) == "yes"


def test_ray_resources_are_reserved_per_role(handles, ray_cluster):
    toy(handles, "ray", num_cpus=1)
    toy(handles, "ray", num_cpus=1)  # the two roles fill the 2-CPU cluster
    with pytest.raises(RoleCallTimeout, match="num_cpus=1"):
        spawn(EchoServer, {}, placement="ray", name="third", num_cpus=1, start_timeout_s=1.5)
    handles.pop().close()  # frees a CPU
    deadline = time.monotonic() + 20
    while ray_cluster.available_resources().get("CPU", 0) < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert toy(handles, "ray", num_cpus=1, start_timeout_s=20).call("incr") == 1


def test_processes_pickling_errors_stay_local(handles):
    with pytest.raises(TypeError, match="must pickle"):
        spawn(lambda: None, {}, placement="processes", name="lambda")
    handle = toy(handles, "processes")
    with pytest.raises(TypeError, match="pickle"):
        handle.call("echo", threading.Lock())
    assert handle.call("incr") == 1


def test_child_exiting_during_start_raises_died():
    t0 = time.perf_counter()
    with pytest.raises(RoleServerDied) as info:
        spawn(EchoServer, {"exit_on_start": 3}, placement="processes", name="quitter")
    assert info.value.exitcode == 3 and time.perf_counter() - t0 < 10


def test_bad_placement_lists_the_valid_ones():
    with pytest.raises(ValueError, match="local, processes, ray"):
        spawn(EchoServer, {}, placement="threads", name="x")
