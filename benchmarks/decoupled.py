"""Decoupled training figures: iteration time per placement, bytes through the store, fault recovery.

    .venv/bin/python benchmarks/decoupled.py [--quick]

The same tiny run (300-entity world, B=2 x K=4, tiny random models, 3 iterations) in-process
(``Trainer``), then decoupled with the role servers ``local``, as ``processes`` and as ``ray``
actors; median iteration time and its ratio to in-process. Bytes written+read through the store
per iteration, against what shipping the sub-agent token trajectories would cost
(``shipped_trajectory_bytes``). Recovery: SIGKILL of a role server (restart + checkpoint load) and a
Redis restart (the run waits). Writes benchmarks/results/decoupled.json.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from common import report  # noqa: E402

from mgrpo_algo.core.config import PlacementConfig, load_config  # noqa: E402
from mgrpo_algo.distributed.store import shipped_trajectory_bytes  # noqa: E402
from mgrpo_algo.training.trainer import Trainer  # noqa: E402


def DecoupledTrainer(cfg, *, placement: str, store: str = "", log=None) -> Trainer:  # noqa: N802
    """The one Trainer on role workers placed by ``placement`` (what ``mgrpo train --placement`` does)."""
    cfg.placement = PlacementConfig(kind=placement, store=store)
    return Trainer(cfg, log=log)


def config(tmp: str, out: str, iterations: int):
    return load_config(None, [
        f"out_dir={tmp}/{out}", f"models_dir={tmp}/models", "warm_start.epochs=0",
        f"scenario_kwargs={{num_entities: 300, data_dir: {tmp}/data}}", "questions_per_iteration=2", "group_size=4",
        f"stages=[{{split: stage2/train, iterations: {iterations}}}]",
        "model_sizes={main: {hidden_size: 64, num_layers: 2}, sub: {hidden_size: 64, num_layers: 2}}",
        "main.generation.max_new_tokens=32", "sub.generation.max_new_tokens=32",
        "limits={max_main_turns: 4, max_sub_turns: 3, max_delegations: 3}",
    ])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    iterations = 2 if args.quick else 4
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        with Trainer(config(tmp, "inproc", iterations)) as inproc:
            base = inproc.run()
        base_s = statistics.median(h["time/iteration"] for h in base[1:] or base)
        rows.append(("iteration, in-process Trainer", base_s, "s (median)"))
        placements = ["local", "processes"] if args.quick else ["local", "processes", "ray"]
        for placement in placements:
            if placement == "ray":
                import ray

                ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
            with DecoupledTrainer(config(tmp, placement, iterations), placement=placement) as trainer:
                history = trainer.run()
            if placement == "ray":
                ray.shutdown()
            seconds = statistics.median(h["time/iteration"] for h in history[1:] or history)
            rows.append((f"iteration, decoupled {placement}", seconds, f"s ({seconds / base_s:.2f}x in-process)"))
            if placement == "local":
                last = history[-1]
                store_bytes = (last["main/store_bytes_written"] + last["main/store_bytes_read"]
                               + last.get("sub/store_bytes_written", 0) + last.get("sub/store_bytes_read", 0)) / iterations
                # random tiny models rarely delegate, so size the alternative like the oracle's episodes:
                # 2.7 sub-agents per rollout (benchmarks/env_throughput.py), 1,500 tokens each
                rollouts = 2 * 4
                shipped = shipped_trajectory_bytes([[0] * 1500] * round(2.7 * rollouts))
                rows.append(("store bytes per iteration (both roles, r+w)", store_bytes, "bytes"))
                rows.append(("shipping sub trajectories instead (2.7/rollout x 1,500 tok)", float(shipped),
                             f"bytes ({shipped / store_bytes:.0f}x the store)"))
        # fault: SIGKILL the sub server after iteration 0
        def kill(metrics):
            if metrics["iteration"] == 0:
                os.kill(trainer.handles["sub"].pid, signal.SIGKILL)

        with DecoupledTrainer(config(tmp, "fault", 2), placement="processes", log=kill) as trainer:
            t0 = time.perf_counter()
            history = trainer.run()
            total = time.perf_counter() - t0
        restart = trainer.restarts[0]
        rows.append(("SIGKILL sub server: restart + checkpoint load", restart["recovery_s"], "s"))
        rows.append(("SIGKILL sub server: iteration with the failure", history[1]["time/iteration"],
                     f"s (vs {history[0]['time/iteration']:.2f} s before; run total {total:.1f} s)"))
        # fault: Redis down for 2 s mid-run
        from redis_server import RedisServer

        with RedisServer(persist_dir=Path(tmp) / "redis") as server:
            timer = []

            def bounce(metrics):
                if metrics["iteration"] == 0:
                    server.stop()
                    timer.append(threading.Timer(2.0, server.start))
                    timer[0].start()

            with DecoupledTrainer(config(tmp, "redis", 3), placement="local", store=server.url, log=bounce) as trainer:
                history = trainer.run()
            timer[0].join()
        rows.append(("Redis down 2 s: update of the iteration that waited", history[1]["time/update"],
                     f"s (vs {history[2]['time/update']:.2f} s normally)"))
    report("decoupled", rows)


if __name__ == "__main__":
    main()
