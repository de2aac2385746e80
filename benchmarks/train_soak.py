"""Training soak: ``mgrpo train`` for many iterations, sampled every iteration, with the loop SIGKILLed
once and resumed (issue 44, a first part of it; outside ``make test``).

The run is a child process (``python -m mgrpo_algo train``, local placement). Every time its
``metrics.jsonl`` gains a line (an iteration committed), the loop process and its descendants are
sampled: RSS, open file descriptors, threads, child processes, and the run folder's size (all of it,
and per top-level entry). With ``--kill-at K`` the loop is SIGKILLed at a random moment of iteration
K (after K iterations committed, within the next one), then started again with ``--resume``.

Checked at the end (the exit status says whether all hold):
- ``metrics.jsonl`` has iterations 0..N-1, each exactly once (none lost or applied twice by the kill);
- the main learner's ``step`` advances by the same amount every iteration (an update applied twice
  or lost would break the run of ``step - iteration``), and the sub-agent applied each iteration once;
- growth after warm-up, per process lifetime (before and after the kill): RSS slope per 1,000
  iterations (target < 10%), open files, threads and children first -> last, the folder's size.

    PYTHONPATH=. .venv/bin/python benchmarks/train_soak.py --iterations 300 --kill-at 120
    PYTHONPATH=. .venv/bin/python benchmarks/train_soak.py --iterations 1000 --config configs/demo.yaml
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS, report  # noqa: E402
from soak_common import growth, plot_samples, tree_sample  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
# A fast loop: the tiny world and models, two questions of two samples per iteration.
TINY = {
    "questions_per_iteration": 2, "group_size": 2,
    "limits": {"max_main_turns": 4, "max_sub_turns": 3, "max_delegations": 2},
    "model_sizes": {role: {"hidden_size": 64, "num_layers": 2} for role in ("main", "sub", "single")},
    "warm_start": {"epochs": 1, "max_tasks": 20, "noise": 0.2},
    **{role: {"generation": {"max_new_tokens": 32, "temperature": 1.0}, "learner": {"lr": 1.0e-4}}
       for role in ("main", "sub", "single")},
}


def folder_mb(path: Path) -> tuple[float, dict[str, float]]:
    """Size of ``path`` in MB, and per top-level entry (files that vanish while it is walked, such as
    a checkpoint being pruned, are skipped)."""
    per: dict[str, float] = {}
    for entry in os.scandir(path) if path.exists() else []:
        size = 0
        with contextlib.suppress(OSError):
            size = entry.stat().st_size if entry.is_file() else 0
        for folder, _dirs, files in os.walk(entry.path) if entry.is_dir() else []:  # os.walk skips vanished folders
            for name in files:
                with contextlib.suppress(OSError):
                    size += os.stat(os.path.join(folder, name)).st_size
        per[entry.name] = size / 2**20
    return sum(per.values()), per


def committed_lines(path: Path) -> int:
    if not path.exists():
        return 0
    with path.open("rb") as fh:
        return sum(1 for line in fh if line.endswith(b"\n"))


def run_segment(cmd: list[str], run: Path, until: int, kill_at: int | None, samples: list[dict[str, Any]],
                segment: int, rng: random.Random, log: Path) -> tuple[int, float | None]:
    """Run ``cmd`` until ``until`` iterations are committed or it exits; SIGKILL it during iteration
    ``kill_at`` if given. Returns (exit status or -9, the time of the kill)."""
    metrics = run / "metrics.jsonl"
    with log.open("a") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    ps = psutil.Process(proc.pid)
    state = run / "loop_state.json"
    # what is committed (a resumed run first cuts the lines of an iteration the kill left uncommitted)
    seen = json.loads(state.read_text())["iteration"] + 1 if state.exists() else 0
    kill_time: float | None = None
    last_duration = 1.0
    last_commit = time.monotonic()
    while proc.poll() is None:
        time.sleep(0.05)
        done = committed_lines(metrics)
        if done > seen:
            now = time.monotonic()
            last_duration, last_commit = (now - last_commit) / (done - seen), now
            seen = done
            row = {"iteration": done - 1, "segment": segment, **tree_sample(ps)}
            row["folder_mb"], row["folder_by_entry_mb"] = folder_mb(run)
            samples.append(row)
            if kill_at is not None and done == kill_at:
                kill_time = now + rng.uniform(0.1, 0.9) * last_duration  # somewhere inside the next one
        if kill_time is not None and time.monotonic() >= kill_time:
            for victim in [*ps.children(recursive=True), ps]:
                with contextlib.suppress(psutil.Error):
                    victim.send_signal(signal.SIGKILL)
            proc.wait()
            return -9, kill_time
        if seen >= until:
            break
    return proc.wait(), None


def check_iterations(run: Path, iterations: int) -> dict[str, Any]:
    """No iteration lost or applied twice: iterations 0..N-1 once each, steps advancing evenly."""
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    its = [int(line["iteration"]) for line in lines]
    offsets = {float(line["main/step"]) - int(line["iteration"]) for line in lines if "main/step" in line}
    sub_ok = all(int(line.get("sub/applied_iteration", line["iteration"])) == int(line["iteration"]) for line in lines)
    return {
        "iterations_logged": len(its), "unique": len(set(its)),
        "in_order_once": its == list(range(iterations)),
        "main_step_minus_iteration": sorted(offsets), "sub_applied_each_once": sub_ok,
        "ok": its == list(range(iterations)) and len(offsets) == 1 and sub_ok,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(ROOT / "configs/tiny.yaml"), help="the run's base config")
    parser.add_argument("--no-tiny", action="store_true", help="keep the config's sizes (default: TINY overrides)")
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--kill-at", type=int, default=0, help="SIGKILL the loop during this iteration (0: never)")
    parser.add_argument("--warmup", type=int, default=20, help="iterations of each process before growth is judged")
    parser.add_argument("--out", default="", help="folder for the run (default: a temporary one)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default="train_soak")
    args = parser.parse_args()

    work = Path(args.out or tempfile.mkdtemp(prefix="mgrpo-train-soak-"))
    run, models = work / "run", work / "models"
    config = yaml.safe_load(Path(args.config).read_text())
    if not args.no_tiny:
        config.update(TINY)
    config.update({"stages": [{"split": "stage1/train", "iterations": args.iterations}], "out_dir": str(run),
                   "models_dir": str(models), "seed": args.seed})
    work.mkdir(parents=True, exist_ok=True)
    (work / "config.yaml").write_text(yaml.safe_dump(config))
    cmd = [sys.executable, "-m", "mgrpo_algo", "train", "--config", str(work / "config.yaml")]
    rng = random.Random(args.seed)
    samples: list[dict[str, Any]] = []
    started = time.perf_counter()
    kill_at = args.kill_at if 0 < args.kill_at < args.iterations else None
    status, killed = run_segment(cmd, run, args.iterations, kill_at, samples, 0, rng, work / "train.log")
    faults = []
    if killed is not None:
        faults.append({"fault": "SIGKILL of the loop", "after_committed": kill_at, "then": "--resume"})
        print(f"  fault: SIGKILL of the training loop during iteration {kill_at}; resuming with --resume", flush=True)
        status, _ = run_segment([*cmd, "--resume"], run, args.iterations, None, samples, 1, rng, work / "train.log")
    wall = time.perf_counter() - started
    check = check_iterations(run, args.iterations)
    return finish(args, samples, check, faults, status, wall, work)


def finish(args: argparse.Namespace, samples: list[dict[str, Any]], check: dict[str, Any],
           faults: list[dict[str, Any]], status: int, wall: float, work: Path) -> int:
    judged: dict[str, Any] = {}
    for segment in sorted({row["segment"] for row in samples}):
        rows = [row for row in samples if row["segment"] == segment]
        start = rows[0]["iteration"] + args.warmup
        xs = [row["iteration"] for row in rows]
        judged[f"process {segment}"] = {
            key: growth(xs, [row[key] for row in rows], start)
            for key in ("rss_mb", "fds", "threads", "children", "children_rss_mb", "folder_mb")}
    table: list[tuple[str, Any, str]] = [
        ("iterations", len(samples), f"asked {args.iterations}; exit status {status}"),
        ("iterations lost or applied twice", 0 if check["ok"] else "yes", json.dumps(check)),
        ("faults injected", len(faults), "; ".join(f"{f['fault']} after {f['after_committed']} committed" for f in faults)),
        ("wall time", wall, "s"),
    ]
    for name, figures in judged.items():
        rss = figures["rss_mb"]
        if rss:
            table.append((f"{name}: RSS after warm-up", f"{rss['first']:.0f} -> {rss['last']:.0f}",
                          f"MB, iterations {rss['from_x']}-{rss['to_x']}; slope {rss['slope_per_1000']:.1f} MB "
                          f"per 1,000 iterations ({rss['projected_pct_per_10000'] / 10:.1f}% per 1,000; target < 10)"))
        for key in ("fds", "threads", "children", "folder_mb"):
            if figures[key]:
                table.append((f"{name}: {key} after warm-up", f"{figures[key]['first']:.1f} -> {figures[key]['last']:.1f}",
                              f"max {figures[key]['max']:.1f}"))
    if samples:
        table.append(("run folder at the end", samples[-1]["folder_mb"],
                      "MB: " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(samples[-1]["folder_by_entry_mb"].items()))))
    xs = [row["iteration"] for row in samples]
    plot = plot_samples(RESULTS / f"{args.name}.png", xs, {
        "training loop (RSS)": [row["rss_mb"] for row in samples],
        "run folder": [row["folder_mb"] for row in samples],
    }, xlabel="iterations committed", title="training soak", warmup=args.warmup) if samples else None
    report(args.name, table, {"check": check, "faults": faults, "growth_after_warmup": judged, "samples": samples,
                              "plot": str(plot) if plot else None, "work": str(work), "command": " ".join(sys.argv)})
    ok = check["ok"] and status == 0 and len(samples) >= args.iterations - (1 if faults else 0)
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
