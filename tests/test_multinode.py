"""M-GRPO across machines with no shared disk assumed: the workers' state on the declared run storage
(``placement.storage``), on a real multi-node Ray cluster (``ray.cluster_utils.Cluster``: a head for the
loop, a node each for the main and the sub learner pinned by custom resources, each node with its own
temporary folder), a node lost mid-iteration, an object store without a rename (``memory://``), and a
storage that goes away mid-run. Every run is compared with the same run on the local placement in the
run folder: same metrics, same parameters.

The cluster tests are slow (a 4-node cluster on a 2-core machine): CI runs them after ``make test``."""

from __future__ import annotations

import contextlib
import inspect
import os
import threading
import time
import uuid
from pathlib import Path

import pytest
import torch
from redis_server import RedisServer, free_port, redis_available
from test_decoupled import warm_config, warm_overrides, worker_parameters

from mgrpo_algo.cli import main
from mgrpo_algo.core.config import PlacementConfig
from mgrpo_algo.experiments.status import run_status
from mgrpo_algo.experiments.view import join_sub_advantages, load_episodes
from mgrpo_algo.training.storage import COMMIT_MARKER, RunStorage
from mgrpo_algo.training.trainer import Trainer
from mgrpo_algo.training.workers import WorkerPolicy

ITERATIONS = 2
#: What a role worker keeps (its folder, commit point, buffers, A_S, checkpoints): found only in the storage.
STATE_NAMES = {"workers", "worker.json", "buffers", "advantages", "trajectories", "checkpoints"}


def comparable(history: list[dict]) -> list[dict]:
    """The metrics that do not depend on the clock, the store's encoding or restarts."""
    def clocked(key: str) -> bool:
        return (key.startswith("time/") or key.endswith(("/seconds", "/tokens_per_s")) or "/store_bytes_" in key
                or key == "restarts")
    return [{k: v for k, v in h.items() if not clocked(k)} for h in history]


def with_placement(config, **placement):
    config.placement = PlacementConfig(**placement)
    return config


@pytest.fixture(scope="module")
def reference(small_scenario, tmp_path_factory):
    """The unfaulted run on the local placement, its state in the run folder: (metrics, folder)."""
    tmp = tmp_path_factory.mktemp("reference")
    with Trainer(warm_config(tmp, small_scenario, "local", ITERATIONS)) as trainer:
        history = trainer.run()
    assert all(h["main/skipped"] == 0.0 and h["sub/skipped"] == 0.0 for h in history)  # both learners train
    return comparable(history), tmp / "local"


def same_parameters(reference_state: Path, state: Path | RunStorage) -> None:
    for role in ("main", "sub"):
        if isinstance(state, RunStorage):  # a remote storage: its newest checkpoint downloaded
            files = state.child(f"workers/{role}")
            newest = max((n for n in files.names("checkpoints") if n.startswith("iter-")), key=lambda n: int(n[5:]))
            assert files.is_folder(f"checkpoints/{newest}")
            from safetensors.torch import load_file

            params = load_file(str(files.local_folder(f"checkpoints/{newest}") / "model" / "model.safetensors"))
        else:
            params = worker_parameters(state, role)
        expected = worker_parameters(reference_state, role)
        assert expected.keys() == params.keys()
        for name, tensor in expected.items():
            assert torch.equal(tensor, params[name]), f"{role}: {name} differs"


def state_outside(root: Path, storage: Path) -> list[str]:
    """Worker-state files and folders under ``root`` but outside ``storage``."""
    found = []
    for folder, dirs, files in os.walk(root):
        if Path(folder) == storage or storage in Path(folder).parents:
            continue
        found += [str(Path(folder) / n) for n in [*dirs, *files] if n in STATE_NAMES or n.startswith("iter-")]
    return found


def test_an_object_store_without_rename_gives_the_run_of_the_run_folder(small_scenario, tmp_path, reference):
    """``memory://`` (commit markers, every folder uploaded and downloaded): the sub worker killed after
    iteration 0 is restarted from the store; same metrics and parameters as the run-folder run."""
    expected, reference_state = reference
    url = f"memory://mgrpo-test-{uuid.uuid4().hex}"

    def kill_sub(metrics):
        if metrics["iteration"] == 0:
            trainer.handles["sub"].kill()

    trainer = Trainer(with_placement(warm_config(tmp_path, small_scenario, "run", ITERATIONS), storage=url), log=kill_sub)
    with trainer:
        history = trainer.run()
    assert [(r["role"], r["iteration"], r["status"]["restored"]) for r in trainer.restarts] == [("sub", 1, True)]
    assert comparable(history) == expected
    storage = RunStorage(url)
    same_parameters(reference_state, storage)
    assert storage.read_json("workers/sub/worker.json")["last_applied"] == ITERATIONS - 1
    assert storage.exists(f"workers/main/checkpoints/iter-{ITERATIONS - 1}/{COMMIT_MARKER}")
    assert storage.is_folder("final/main") and storage.is_folder("checkpoints/stage1/sub")
    assert (tmp_path / "run" / "final" / "sub" / "config.json").is_file()  # copied next to the run's results
    assert state_outside(tmp_path, tmp_path / "none") == []  # nothing of the workers' state on the local disk
    status = run_status(tmp_path / "run")  # mgrpo status and mgrpo view read the workers' state from the store
    assert status["storage"] == url and {r: s["last_applied"] for r, s in status["roles"].items()} == {"main": 1, "sub": 1}
    records, _ = load_episodes(tmp_path / "run" / "episodes.jsonl", 100)
    assert join_sub_advantages(records, tmp_path / "run") > 0
    storage.remove("")


def test_a_storage_that_goes_away_stops_the_run_in_one_line_and_it_resumes(small_scenario, tmp_path, reference,
                                                                           monkeypatch, capsys):
    """The shared folder disappears after iteration 0 (an NFS mount lost): ``mgrpo train`` stops with one
    line and exit code 1; back again, ``--resume`` ends with the unfaulted run's metrics."""
    expected, _ = reference
    shared = tmp_path / "shared"
    args = ["train"]
    for item in warm_overrides(tmp_path, small_scenario, "run", ITERATIONS, extra=[f"placement.storage={shared}"]):
        args += ["--set", item]
    real = Trainer.train_iteration

    def unmount_after_first(self, *a, **kw):
        metrics = real(self, *a, **kw)
        if metrics["iteration"] == 0:
            os.rename(shared, tmp_path / "unmounted")
        return metrics

    monkeypatch.setattr(Trainer, "train_iteration", unmount_after_first)
    assert main(args) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("mgrpo: warning:")]
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"mgrpo: storage {shared} cannot be reached (") and "rerun with --resume" in errors[0]
    assert not shared.exists()  # not recreated on the local disk
    os.rename(tmp_path / "unmounted", shared)
    monkeypatch.undo()
    assert main([*args, "--resume"]) == 0
    import json

    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert comparable(lines) == expected
    assert state_outside(tmp_path, shared) == []


# -- a real multi-node Ray cluster -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A head (the loop; no CPU for actors) and a node each for the main and the sub learner, each with
    its own temporary folder; Redis on loopback for the statistics. (Ray binds its services to the
    machine's address, not to loopback: it resolves 127.0.0.1 to it.)"""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    if not redis_available():
        pytest.skip("redis-server is not installed")
    if ray.is_initialized():
        pytest.skip("Ray is already initialised in this process")
    nodes = tmp_path_factory.mktemp("nodes")

    def node_args(name: str, **kw):
        (nodes / name / "tmp").mkdir(parents=True, exist_ok=True)
        # the agents' ports chosen here (with 0 the raylet waits for files saying which they took, see below);
        # no log monitor (nothing is printed to the driver): fewer Python processes starting at once
        ports = {"metrics_agent_port": free_port(), "metrics_export_port": free_port(),
                 "runtime_env_agent_port": free_port(), "dashboard_agent_listen_port": free_port()}
        return {"env_vars": {"TMPDIR": str(nodes / name / "tmp")}, "include_log_monitor": False, **ports, **kw}

    def add_node(made, name: str, **kw):
        """``made.add_node``, again after a failed start: on busy cores a raylet aborts when its dashboard
        agent (a Python process) takes more than ~15 s to report its port (a fixed wait in this Ray); the
        failed attempt's processes (children of this one) are killed, by id."""
        import psutil

        for attempt in range(3):
            before = {p.pid for p in psutil.Process().children(recursive=True)}
            try:
                return made.add_node(**node_args(name, **kw))
            except Exception:
                if attempt == 2:
                    raise
                for leftover in [p for p in psutil.Process().children(recursive=True) if p.pid not in before]:
                    with contextlib.suppress(psutil.Error):
                        leftover.kill()
                time.sleep(2)

    with pytest.MonkeyPatch.context() as patch:
        # Ray gives a new node's raylet 30 s to register; on a loaded 2-core machine it can need more (90 s here)
        real_get_node = ray._private.services.get_node

        def patient_get_node(gcs_address, node_id, *args, **kwargs):
            deadline = time.monotonic() + 90
            while True:
                try:
                    return real_get_node(gcs_address, node_id, *args, **kwargs)
                except RuntimeError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)

        patch.setattr(ray._private.services, "get_node", patient_get_node)
        # ... and its dashboard agent (a Python process, slow to start on busy cores) ~15 s to write the
        # port it listens on, else the raylet aborts (a fixed wait in this Ray): the port is chosen here
        # (node_args), so its file is written here, before the raylet starts; the agent writes the same
        real_start_raylet = ray._private.services.start_raylet

        def start_raylet(*args, **kwargs):
            from ray._raylet import DASHBOARD_AGENT_LISTEN_PORT_NAME, persist_port

            given = inspect.signature(real_start_raylet).bind(*args, **kwargs).arguments
            persist_port(given["session_dir"], given["node_id"], DASHBOARD_AGENT_LISTEN_PORT_NAME,
                         given["dashboard_agent_listen_port"])
            return real_start_raylet(*args, **kwargs)

        patch.setattr(ray._private.services, "start_raylet", start_raylet)
        # Ray's default health checks: a lost node's actors fail at once (their connections break), and a
        # loaded machine's slow raylet is not declared dead
        made = Cluster()
        try:
            add_node(made, "head", num_cpus=0, include_dashboard=False)
            workers = {"main": add_node(made, "main", num_cpus=1, resources={"main_node": 1}),
                       "sub": add_node(made, "sub", num_cpus=1, resources={"sub_node": 1})}
            ray.init(address=made.address, include_dashboard=False, log_to_driver=False)
            with RedisServer() as redis:
                yield {"cluster": made, "nodes": nodes, "workers": workers, "add_node": add_node, "redis": redis}
        finally:
            ray.shutdown()
            made.shutdown()


def actor_node(handle) -> str:
    """The id of the node a role worker's Ray actor runs on (the GCS's view)."""
    from ray._private.state import actors

    return actors(actor_id=handle._actor._actor_id.hex())["Address"]["NodeID"]


RESOURCES = {"main": {"num_cpus": 1, "main_node": 1}, "sub": {"num_cpus": 1, "sub_node": 1}}


def cluster_config(tmp_path, scenario, cluster, name: str, db: int):
    """The reference run's config on the cluster: Ray placement, state on ``tmp_path/shared``, Redis
    database ``db`` (one per run: the statistics of one run are not another's)."""
    store = f"{cluster['redis'].url.rsplit('/', 1)[0]}/{db}"
    # a worker's start (torch, transformers, the model) can take minutes on a busy 2-core machine
    return with_placement(warm_config(tmp_path, scenario, name, ITERATIONS), kind="ray", resources=RESOURCES,
                          storage=str(tmp_path / "shared"), store=store, start_timeout_s=900)


@pytest.mark.slow
def test_multi_node_run_equals_the_local_run(small_scenario, tmp_path, reference, cluster, monkeypatch):
    """Main and sub learners each on their own node: the local run's metrics and parameters, and the
    workers' state only in the declared storage (nothing in the head's run folder or a node's folder)."""
    monkeypatch.chdir(cluster["nodes"] / "head")  # Ray workers start in the driver's folder: the head's
    expected, reference_state = reference
    with Trainer(cluster_config(tmp_path, small_scenario, cluster, "multi", 1)) as trainer:
        history = trainer.run()
        where = {role: trainer.handles[role].call("status")["pid"] for role in ("main", "sub")}
        actors = {role: actor_node(trainer.handles[role]) for role in ("main", "sub")}
    assert actors == {role: node.node_id for role, node in cluster["workers"].items()}  # pinned by resources
    assert os.getpid() not in where.values()
    assert comparable(history) == expected
    same_parameters(reference_state, tmp_path / "shared")
    assert not (tmp_path / "multi" / "workers").exists() and (tmp_path / "multi" / "final" / "main").is_dir()
    assert state_outside(tmp_path, tmp_path / "shared") == []
    assert state_outside(cluster["nodes"], tmp_path / "shared") == []


@pytest.mark.slow
def test_a_node_lost_mid_iteration_restarts_its_worker_on_a_spare_node(small_scenario, tmp_path, reference, cluster,
                                                                        monkeypatch):
    """The sub learner's node is removed while iteration 1 is being collected; its worker restarts on a
    spare node from the storage, the iteration is collected again once, and the run ends with the
    unfaulted run's metrics and parameters."""
    monkeypatch.chdir(cluster["nodes"] / "head")
    expected, reference_state = reference
    made, lost, once = cluster["cluster"], [], threading.Lock()
    real_call = WorkerPolicy.__call__

    def call(self, requests):
        if self.iteration == 1 and self.worker.handle.name == "mgrpo-sub":
            with once:  # the episodes of a collection call from several threads: one node lost
                if not lost:
                    victim = next(n for n in made.worker_nodes if n.node_id == actor_node(self.worker.handle))
                    lost.append(cluster["add_node"](made, "spare", num_cpus=1, resources={"sub_node": 1}))
                    made.remove_node(victim, allow_graceful=False)
                    lost.append(victim)
        return real_call(self, requests)

    monkeypatch.setattr(WorkerPolicy, "__call__", call)
    with Trainer(cluster_config(tmp_path, small_scenario, cluster, "lost", 2)) as trainer:
        history = trainer.run()
        spare = actor_node(trainer.handles["sub"])
    assert len(lost) == 2 and spare == lost[0].node_id  # the worker now lives on the spare node
    assert [(r["role"], r["during"], r["iteration"], r["status"]["restored"]) for r in trainer.restarts] == [
        ("sub", "collect", 1, True)]
    assert trainer.restarts[0]["status"]["last_applied"] == 0  # restored from iteration 0's checkpoint
    assert [h["restarts"] for h in history] == [0.0, 1.0]
    assert comparable(history) == expected
    same_parameters(reference_state, tmp_path / "shared")
    assert state_outside(tmp_path, tmp_path / "shared") == []
    assert state_outside(cluster["nodes"], tmp_path / "shared") == []
