"""Decoupled training: role workers in each placement, synchronized and stale modes, faults survived."""

from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path

import pytest
from redis_server import persistent_redis_server_fixture  # noqa: F401

from mgrpo_algo.core.config import PlacementConfig, load_config
from mgrpo_algo.distributed.store import open_store
from mgrpo_algo.training.trainer import Trainer

B, K, ITERATIONS = 2, 2, 3
WARM = Path(__file__).resolve().parents[1] / "configs" / "demo-warm-start"


def config_overrides(tmp_path, scenario, out: str, iterations: int = ITERATIONS, mode: str = "mgrpo", extra=()) -> list[str]:
    """The ``--set`` overrides of a small run (what :func:`make_config` loads)."""
    return [
        f"mode={mode}", f"out_dir={tmp_path / out}", f"models_dir={tmp_path / 'models'}", "warm_start.epochs=0",
        f"scenario_kwargs={{num_entities: 300, data_dir: {scenario.data_dir}}}",
        f"questions_per_iteration={B}", f"group_size={K}", f"stages=[{{split: stage2/train, iterations: {iterations}}}]",
        "model_sizes={main: {hidden_size: 32, num_layers: 1, num_heads: 2, num_kv_heads: 1}, "
        "sub: {hidden_size: 32, num_layers: 1, num_heads: 2, num_kv_heads: 1}}",
        "main.generation.max_new_tokens=16", "sub.generation.max_new_tokens=16",
        "limits={max_main_turns: 3, max_sub_turns: 2, max_delegations: 2}", *extra,
    ]


def make_config(tmp_path, scenario, out: str, iterations: int = ITERATIONS, mode: str = "mgrpo", extra=()):
    return load_config(None, config_overrides(tmp_path, scenario, out, iterations, mode, extra))


def DecoupledTrainer(config, *, placement="local", store=None, staleness=0, resources=None, log=None):  # noqa: N802
    """The one Trainer with ``config.placement`` set (what ``mgrpo train --placement`` does)."""
    config.placement = PlacementConfig(kind=placement, store=store or "", staleness=staleness, resources=dict(resources or {}))
    return Trainer(config, log=log)


def check_store(spec: str, iterations: int, mode: str = "mgrpo") -> None:
    """Every iteration's statistics are there exactly once, and both roles applied every iteration
    (the store's sets cannot show an iteration applied twice: :func:`check_steps` counts updates)."""
    with open_store(spec) as store:
        for it in range(iterations):
            stats = store.get_main_stats(it, expected=B * K, timeout_s=1)
            assert sorted((s.query, s.rollout) for s in stats) == [(q, r) for q in range(B) for r in range(K)]
        assert store.done_iterations("main") == set(range(iterations))
        if mode == "mgrpo":
            assert store.done_iterations("sub") == set(range(iterations))
        assert store.latest_complete_iteration(B * K) == iterations - 1


def check_steps(status: dict, history: list[dict]) -> None:
    """Each learner stepped exactly once per iteration whose batch had something to train on: an
    iteration applied twice, or a server restarted without its checkpoint, changes the count."""
    for role in ("main", "sub"):
        stepped = sum(1 for h in history if h.get(f"{role}/skipped") == 0.0)
        assert status[role]["step"] == stepped, (role, status[role]["step"], stepped)


@pytest.mark.parametrize("placement", ["local", "processes"])
def test_synchronized_run_in_each_placement(placement, small_scenario, tmp_path):
    with DecoupledTrainer(make_config(tmp_path, small_scenario, placement), placement=placement) as trainer:
        history = trainer.run()
        status = {role: trainer.handles[role].call("status") for role in ("main", "sub")}
    assert [h["iteration"] for h in history] == list(range(ITERATIONS))
    assert all(h["sub/lag"] == 0 for h in history if "sub/lag" in h)
    assert status["main"]["last_applied"] == status["sub"]["last_applied"] == ITERATIONS - 1
    check_steps(status, history)
    if placement == "processes":
        assert status["main"]["pid"] != os.getpid() != status["sub"]["pid"]
    check_store(f"sqlite:{tmp_path / placement / 'stats.sqlite'}", ITERATIONS)
    # only statistics cross: a few hundred bytes per iteration
    written = history[-1]["main/store_bytes_written"] / ITERATIONS
    assert 0 < written < 2000


def test_stale_mode_lags_by_at_most_n(small_scenario, tmp_path):
    with DecoupledTrainer(make_config(tmp_path, small_scenario, "stale"), placement="local", staleness=1) as trainer:
        history = trainer.run()
        status = trainer.handles["sub"].call("status")
    applied = [h.get("sub/applied_iteration") for h in history]
    assert applied[0] is None  # iteration 0's statistics are not in when the sub server is asked
    assert applied[1:] == [0.0, 1.0] and all(h["sub/lag"] == 1 for h in history[1:])
    assert status["last_applied"] == ITERATIONS - 1 and status["pending"] == []  # flushed at the end
    check_store(f"sqlite:{tmp_path / 'stale' / 'stats.sqlite'}", ITERATIONS)


def test_frozen_sub_only_the_main_learns(small_scenario, tmp_path):
    cfg = make_config(tmp_path, small_scenario, "frozen", iterations=2, mode="frozen-sub")
    with DecoupledTrainer(cfg, placement="local") as trainer:
        trainer.run()
        assert trainer.handles["sub"].call("status")["step"] == 0
        assert trainer.handles["main"].call("status")["step"] >= 1


@pytest.mark.slow  # kills between iterations only; test_sigkill_at_every_point_... covers it and more, by value
def test_sigkilled_role_server_resumes_without_losing_or_doubling(small_scenario, tmp_path, caplog):
    kills = []

    def kill_after_first(metrics):
        if metrics["iteration"] in (0, 1):
            role = "sub" if metrics["iteration"] == 0 else "main"
            pid = trainer.handles[role].pid
            os.kill(pid, signal.SIGKILL)
            kills.append((role, pid))

    trainer = DecoupledTrainer(make_config(tmp_path, small_scenario, "faults"), placement="processes", log=kill_after_first)
    with trainer:
        history = trainer.run()
        status = {role: trainer.handles[role].call("status") for role in ("main", "sub")}
    assert [h["iteration"] for h in history] == list(range(ITERATIONS))
    assert [r["role"] for r in trainer.restarts] == ["sub", "main"]
    assert all(r["status"]["restored"] for r in trainer.restarts)  # resumed from its checkpoint
    assert {r["status"]["pid"] for r in trainer.restarts}.isdisjoint({pid for _, pid in kills})
    # each restart is one line a user sees: which worker, when, what was done
    lines = [r.getMessage() for r in caplog.records if r.name == "mgrpo_algo.training.workers"]
    assert len(lines) == 2 and all(" worker died during " in line and "restarted from its checkpoint" in line for line in lines)
    assert lines[0].startswith("mgrpo: the sub worker died during begin_collect of iteration 1 (")
    assert lines[1].startswith("mgrpo: the main worker died during begin_collect of iteration 2 (")
    assert status["main"]["last_applied"] == status["sub"]["last_applied"] == ITERATIONS - 1
    check_steps(status, history)
    check_store(f"sqlite:{tmp_path / 'faults' / 'stats.sqlite'}", ITERATIONS)


def test_a_restarted_run_continues_where_it_stopped(small_scenario, tmp_path):
    with DecoupledTrainer(make_config(tmp_path, small_scenario, "resume", iterations=2), placement="local") as first:
        first.run()
    again = make_config(tmp_path, small_scenario, "resume", iterations=3, extra=["resume=true"])
    with DecoupledTrainer(again, placement="local") as second:
        assert second.iteration == 2
        history = second.run()
    assert [h["iteration"] for h in history] == [2]
    check_store(f"sqlite:{tmp_path / 'resume' / 'stats.sqlite'}", 3)


class _RestartOnOutage(logging.Handler):
    """Starts Redis again from inside the first store call that finds it down (the store logs one
    warning per outage, then retries): the outage is certain to be seen, with no timing involved."""

    def __init__(self, server) -> None:
        super().__init__(logging.INFO)
        self.server, self.guard, self.down, self.outages, self.recoveries = server, threading.Lock(), False, [], 0

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        with self.guard:  # not self.lock: that is logging.Handler's own, held around emit
            if "unreachable" in message and self.down:
                self.outages.append(threading.current_thread().name)
                self.server.start()  # the blocked call's next retry finds it up
                self.down = False
            elif "reachable again" in message:
                self.recoveries += 1


def test_redis_store_restart_mid_run(small_scenario, tmp_path, persistent_redis_server):
    handler = _RestartOnOutage(persistent_redis_server)
    store_logger = logging.getLogger("mgrpo_algo.distributed.store")
    old_level = store_logger.level
    store_logger.setLevel(logging.INFO)
    store_logger.addHandler(handler)

    def stop_redis(metrics):
        if metrics["iteration"] == 0:  # the next iteration's first store call finds it down
            with handler.guard:
                persistent_redis_server.stop()
                handler.down = True

    cfg = make_config(tmp_path, small_scenario, "redis")
    try:
        with DecoupledTrainer(cfg, placement="local", store=persistent_redis_server.url, log=stop_redis) as trainer:
            history = trainer.run()
            status = {role: trainer.handles[role].call("status") for role in ("main", "sub")}
    finally:
        store_logger.removeHandler(handler)
        store_logger.setLevel(old_level)
    assert len(handler.outages) == 1 and not handler.down  # a store call was blocked, and Redis came back
    assert handler.recoveries >= 1  # ... and that call went through after retrying
    assert [h["iteration"] for h in history] == list(range(ITERATIONS))
    check_steps(status, history)
    check_store(persistent_redis_server.url, ITERATIONS)


def test_ray_placement(small_scenario, tmp_path):
    ray = pytest.importorskip("ray")
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        cfg = make_config(tmp_path, small_scenario, "ray", iterations=1)
        resources = {"main": {"num_cpus": 1}, "sub": {"num_cpus": 1}}
        with DecoupledTrainer(cfg, placement="ray", resources=resources) as trainer:
            history = trainer.run()
            assert trainer.handles["main"].placement == "ray"
        assert [h["iteration"] for h in history] == [0]
        check_store(f"sqlite:{tmp_path / 'ray' / 'stats.sqlite'}", 1)
    finally:
        if started_here:
            ray.shutdown()


def test_bad_arguments(small_scenario, tmp_path):
    with pytest.raises(ValueError, match="placement"):
        DecoupledTrainer(make_config(tmp_path, small_scenario, "y"), placement="cluster")


def worker_parameters(out: Path, role: str) -> dict:
    """The parameters of ``role``'s newest checkpoint (its worker's commit point)."""
    from safetensors.torch import load_file

    folders = sorted((out / "workers" / role / "checkpoints").glob("iter-*"), key=lambda p: int(p.name[5:]))
    return load_file(str(folders[-1] / "model" / "model.safetensors"))


def test_decoupled_processes_equals_in_process(small_scenario, tmp_path):
    """One loop and one worker, the placement swapped underneath: same seed -> same metrics (the sub
    side scored from the store in both, the store's byte counts included) and same parameters."""
    import torch

    from mgrpo_algo.training.trainer import Trainer

    def config(out: str):
        # the demo's warm-started models: they delegate, so the sub learner has slots to train on
        return make_config(tmp_path, small_scenario, out, extra=[
            f"scenario_kwargs={{num_entities: 300, data_dir: {small_scenario.data_dir}, profile: tiny}}",
            f"main.model={WARM}/main", f"sub.model={WARM}/sub", "limits={max_main_turns: 4, max_sub_turns: 3, max_delegations: 2}",
            "main.generation.max_new_tokens=64", "sub.generation.max_new_tokens=64"])

    with Trainer(config("in-process")) as in_process:
        history_a = in_process.run()
        local = {role: w.learner for role, w in in_process.workers.items()}
    with DecoupledTrainer(config("decoupled"), placement="processes") as trainer:
        history_b = trainer.run()
    assert len(history_a) == len(history_b) == ITERATIONS

    def clocked(key: str) -> bool:  # the store's byte counts include time stamps (a digit more or less)
        return key.startswith("time/") or key.endswith(("/seconds", "/tokens_per_s")) or "/store_bytes_" in key

    for a, b in zip(history_a, history_b, strict=True):
        shared = {k for k in a if not clocked(k)}
        assert {k for k in b if not clocked(k)} == shared
        assert {k: a[k] for k in shared} == {k: b[k] for k in shared}
    assert sum(h["sub/samples"] for h in history_a) > 0  # the sub learner did update
    assert all(h["sub/reward_mean"] > 0 for h in history_a)  # R_S computed on the sub side
    for role in ("main", "sub"):
        served = worker_parameters(tmp_path / "decoupled", role)
        state = local[role].model.state_dict()
        assert local[role].step == ITERATIONS
        for name, tensor in served.items():
            assert torch.equal(state[name], tensor), f"{role}: {name} differs"


WARM_EXTRA = ("limits={max_main_turns: 4, max_sub_turns: 3, max_delegations: 2}", f"main.model={WARM}/main",
              f"sub.model={WARM}/sub", "main.generation.max_new_tokens=64", "sub.generation.max_new_tokens=64")


def warm_overrides(tmp_path, scenario, out: str, iterations: int = ITERATIONS, extra=()) -> list[str]:
    """The ``--set`` overrides of :func:`warm_config`."""
    return config_overrides(tmp_path, scenario, out, iterations=iterations, extra=[
        f"scenario_kwargs={{num_entities: 300, data_dir: {scenario.data_dir}, profile: tiny}}", *WARM_EXTRA, *extra])


def warm_config(tmp_path, scenario, out: str, iterations: int = ITERATIONS, extra=()):
    """The demo's warm-started models on the tiny profile: they delegate, so both roles train."""
    return load_config(None, warm_overrides(tmp_path, scenario, out, iterations, extra))


# One kill at each point of an iteration, on both roles, over a 3-iteration run (markers in each
# server's folder make a restarted server go past the point that killed its predecessor).
KILLS = [
    ("act:role=sub:iteration=0:call=1", "sub"),            # collecting: both servers re-collect iteration 0
    ("after_checkpoint:role=sub:iteration=0", "sub"),      # checkpoint renamed, worker.json not: no re-apply
    ("after_store_write:role=main:iteration=1", "main"),   # statistics published, not yet applied
    ("after_update:role=sub:iteration=1", "sub"),          # stepped in memory, not saved: redone
    ("act:role=main:iteration=2:call=2", "main"),          # collecting, a few turns in
    ("after_checkpoint:role=main:iteration=2", "main"),
]


@pytest.mark.slow  # ~2 min of killed and restarted runs: CI runs the slow crash tests after make test
def test_sigkill_at_every_point_ends_with_the_uninterrupted_parameters(small_scenario, tmp_path, monkeypatch):
    """Role servers SIGKILLed at each kill point: same parameters (bitwise) and step counts as without."""
    import torch

    with DecoupledTrainer(warm_config(tmp_path, small_scenario, "clean"), placement="local") as clean:
        clean_history = clean.run()
        clean_status = {role: clean.handles[role].call("status") for role in ("main", "sub")}
    assert all(h["main/skipped"] == 0.0 and h["sub/skipped"] == 0.0 for h in clean_history)  # both train every iteration
    check_steps(clean_status, clean_history)

    monkeypatch.setenv("MGRPO_FAULT", ";".join(point for point, _ in KILLS))  # inherited by the server processes
    with DecoupledTrainer(warm_config(tmp_path, small_scenario, "killed"), placement="processes") as killed:
        history = killed.run()
        status = {role: killed.handles[role].call("status") for role in ("main", "sub")}
    assert [r["role"] for r in killed.restarts] == [role for _, role in KILLS]
    assert [h["iteration"] for h in history] == list(range(ITERATIONS))
    for role in ("main", "sub"):
        assert status[role]["step"] == clean_status[role]["step"] == ITERATIONS
        assert status[role]["last_applied"] == ITERATIONS - 1
        clean_params, params = worker_parameters(tmp_path / "clean", role), worker_parameters(tmp_path / "killed", role)
        assert clean_params.keys() == params.keys()
        for name, tensor in clean_params.items():
            assert torch.equal(tensor, params[name]), f"{role}: {name} differs after the kills"
    check_store(f"sqlite:{tmp_path / 'killed' / 'stats.sqlite'}", ITERATIONS)
