"""Training soak: ``mgrpo train`` for many iterations, sampled every iteration, with faults injected
at random moments (issue 44; outside ``make test``).

The run is a child process (``python -m mgrpo_algo train``). Every time its ``metrics.jsonl`` gains a
line (an iteration committed), the loop process, each role worker's process (``--placement
processes``) and all their descendants are sampled: RSS, open file descriptors, threads, child
processes, and the run folder's size (all of it, and per top-level entry). ``--faults`` takes a
schedule (benchmarks/soak_faults.py): a role worker SIGKILLed, the Redis store's server SIGKILLed
and restarted (``--redis``), Chromium or a served vLLM engine SIGKILLed, the loop SIGKILLed and resumed
with ``--resume``, the run folder's disk
filled (``--disk-mb``: a tmpfs of its own, needs root) and freed again.

Checked at the end (the exit status says whether all hold):
- ``metrics.jsonl`` has iterations 0..N-1, each exactly once (none lost or applied twice by a fault);
- the main learner's ``step`` advances by the same amount every iteration (an update applied twice
  or lost would break the run of ``step - iteration``), and the sub-agent applied each iteration once;
- a full disk stopped the run in one line (no traceback), and the run resumed once space returned;
- with ``--reference``, the same config without faults gives the same metrics, line by line
  (timings and per-process byte counters aside);
- growth after warm-up, per process lifetime: RSS slope per 1,000 iterations (target < 10%), open
  files, threads and children first -> last, the folder's size.

    PYTHONPATH=. .venv/bin/python benchmarks/train_soak.py --iterations 300 --kill-at 120
    PYTHONPATH=. .venv/bin/python benchmarks/train_soak.py --iterations 1000 --placement processes --redis \
        --disk-mb 400 --reference --faults worker-kill:sub@150,redis-restart@300,worker-kill:main@450,loop-kill@600,disk-full@750
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS, report  # noqa: E402
from soak_common import growth, plot_samples, tree_sample  # noqa: E402
from soak_faults import (  # noqa: E402
    Fault,
    WorkerProcesses,
    fill_disk,
    kill_chromium,
    kill_engines,
    kill_tree,
    parse_faults,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from redis_server import RedisServer  # noqa: E402  (the tests' loopback redis-server, restartable)

from mgrpo_env import strict_json  # noqa: E402

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


@dataclass
class Context:
    """What the faults act on: the run folder's own disk, the Redis server, the workers' roles."""
    run: Path
    roles: tuple[str, ...]
    disk: Path | None = None
    redis: Any = None
    events: list[dict[str, Any]] = field(default_factory=list)


def fire(fault: Fault, ctx: Context, proc: psutil.Process, workers: WorkerProcesses) -> bool:
    """Inject ``fault`` now, print its one line; True when the loop process is expected to end."""
    event: dict[str, Any] = {"fault": fault.label, "iteration": fault.after, "time": time.time()}
    if fault.kind == "loop-kill":
        kill_tree(proc)
        event["done"] = "the loop and its children SIGKILLed; restarted with --resume"
    elif fault.kind == "worker-kill":
        pid = workers.kill(fault.arg)
        event["done"] = (f"the {fault.arg} worker (pid {pid}) SIGKILLed; the loop restarts it" if pid
                         else f"no {fault.arg} worker process found (placement processes?)")
        event["pid"] = pid
    elif fault.kind == "redis-restart":
        down = float(fault.arg or 2)
        ctx.redis.stop(kill=True)
        time.sleep(down)
        ctx.redis.start()
        event["done"] = f"redis-server SIGKILLed, down {down:.1f} s, started again on port {ctx.redis.port} from its AOF"
    elif fault.kind == "chromium-kill":
        victims = kill_chromium(proc)
        event["done"] = (f"{len(victims)} Chromium processes SIGKILLed; the browser tool starts a new one when next needed"
                         if victims else "no Chromium process was running (pages prerendered?)")
        event["pids"] = victims
    elif fault.kind == "engine-kill":
        victims = kill_engines(proc, fault.arg)
        which = f"the {fault.arg} role's" if fault.arg else "every"
        event["done"] = (f"{which} vLLM server SIGKILLed (process groups {victims}); the run restarts it at its next request"
                         if victims else f"no vLLM server of {fault.arg or 'any role'} under the loop (served.launch?)")
        event["pids"] = victims
    elif fault.kind == "disk-full":
        ballast, size = fill_disk(ctx.disk)
        event["done"] = f"the run folder's disk filled ({size / 2**20:.0f} MiB ballast); waiting for the run to stop"
        event["ballast"] = str(ballast)
    print(f"  fault: {fault.label}: {event['done']}", flush=True)
    ctx.events.append(event)
    return fault.kind in ("loop-kill", "disk-full")


def run_segment(cmd: list[str], ctx: Context, until: int, pending: list[Fault], samples: list[dict[str, Any]],
                segment: int, rng: random.Random, log: Path) -> tuple[int, Fault | None]:
    """Run ``cmd`` until ``until`` iterations are committed or it exits, firing the ``pending`` faults
    (removed from the list as they fire). Returns (exit status, the fault that ended it or None)."""
    metrics = ctx.run / "metrics.jsonl"
    with log.open("a") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    ps = psutil.Process(proc.pid)
    workers = WorkerProcesses(ps, ctx.roles)
    state = ctx.run / "loop_state.json"
    # what is committed (a resumed run first cuts the lines of an iteration the fault left uncommitted)
    seen = json.loads(state.read_text())["iteration"] + 1 if state.exists() else 0
    fire_at: float | None = None
    last_duration, last_commit = 1.0, time.monotonic()
    while proc.poll() is None:
        time.sleep(0.05)
        done = committed_lines(metrics)
        if done > seen:
            now = time.monotonic()
            last_duration, last_commit = (now - last_commit) / (done - seen), now
            seen = done
            row = {"iteration": done - 1, "segment": segment, **tree_sample(ps)}
            for role, pid in workers.refresh().items():
                with contextlib.suppress(psutil.Error):
                    row[f"{role}_worker_rss_mb"] = psutil.Process(pid).memory_info().rss / 2**20
                    row[f"{role}_worker_pid"] = pid
            row["folder_mb"], row["folder_by_entry_mb"] = folder_mb(ctx.run)
            samples.append(row)
            if pending and fire_at is None and done >= pending[0].after:
                fire_at = now + rng.uniform(0.1, 0.9) * last_duration  # somewhere inside the next iteration
        if fire_at is not None and time.monotonic() >= fire_at:
            fault, fire_at = pending.pop(0), None
            if fire(fault, ctx, ps, workers):
                return proc.wait(), fault
            if pending and pending[0].after <= seen:
                fire_at = time.monotonic() + rng.uniform(0.1, 0.9) * last_duration
        if seen >= until:
            break
    return proc.wait(), None


def check_iterations(run: Path, iterations: int) -> dict[str, Any]:
    """No iteration lost or applied twice: iterations 0..N-1 once each, steps advancing evenly."""
    lines = read_metrics(run / "metrics.jsonl")
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
    parser.add_argument("--kill-at", type=int, default=0, help="shorthand for --faults loop-kill@K (0: never)")
    parser.add_argument("--faults", default="", help="KIND[:ARG]@K,... (benchmarks/soak_faults.py)")
    parser.add_argument("--placement", default="", help="placement.kind (processes: a process per role)")
    parser.add_argument("--redis", action="store_true", help="a redis-server of the soak's own as the store")
    parser.add_argument("--disk-mb", type=int, default=0, help="the run folder on a tmpfs of this size (root)")
    parser.add_argument("--reference", action="store_true",
                        help="then the same run without faults, compared by value with the faulted one")
    parser.add_argument("--reference-of", default="", metavar="WORK",
                        help="only the reference: run WORK's config (a finished soak's --out) without faults for "
                             "--reference-iterations and compare with --faulted-metrics; the result joins --name's json")
    parser.add_argument("--reference-iterations", type=int, default=0, help="with --reference-of: how many")
    parser.add_argument("--faulted-metrics", default="", help="with --reference-of: the faulted run's metrics.jsonl "
                        "(default WORK/run/metrics.jsonl; a --disk-mb run's tmpfs is gone at its end: copy it first)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config field (dotted, the value parsed as YAML), e.g. scenario_kwargs.prerender=false")
    parser.add_argument("--warmup", type=int, default=20, help="iterations of each process before growth is judged")
    parser.add_argument("--out", default="", help="folder for the run (default: a temporary one)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default="train_soak")
    args = parser.parse_args()
    if args.reference_of:
        return reference_only(args)

    work = Path(args.out or tempfile.mkdtemp(prefix="mgrpo-train-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load(Path(args.config).read_text())
    if not args.no_tiny:
        config.update(TINY)
    for pair in args.set:
        key, _, value = pair.partition("=")
        *parents, leaf = key.split(".")
        target = config
        for parent in parents:
            target = target.setdefault(parent, {})
        target[leaf] = yaml.safe_load(value)
    roles = ("main", "sub") if config.get("mode", "mgrpo") != "single-agent" else ("single",)
    faults = parse_faults(",".join(filter(None, [args.faults, f"loop-kill@{args.kill_at}" if args.kill_at else ""])), roles)
    if any(f.kind == "disk-full" for f in faults) and not args.disk_mb:
        raise SystemExit("train_soak: disk-full needs --disk-mb (the run folder on a tmpfs of its own)")
    if any(f.kind == "redis-restart" for f in faults) and not args.redis:
        raise SystemExit("train_soak: redis-restart needs --redis")
    with contextlib.ExitStack() as stack:
        disk = mount_tmpfs(work / "disk", args.disk_mb, stack) if args.disk_mb else None
        redis = stack.enter_context(RedisServer(persist_dir=work / "redis")) if args.redis else None
        ctx = Context(run=(disk or work) / "run", roles=roles, disk=disk, redis=redis)
        config.update({"stages": [{"split": config.get("stages", [{}])[0].get("split", "stage1/train"),
                                   "iterations": args.iterations}],
                       "out_dir": str(ctx.run), "models_dir": str(work / "models"), "seed": args.seed})
        placement = dict(config.get("placement") or {})
        if args.placement:
            placement["kind"] = args.placement
        if redis is not None:
            placement["store"] = redis.url
        config["placement"] = placement
        (work / "config.yaml").write_text(yaml.safe_dump(config))
        cmd = [sys.executable, "-m", "mgrpo_algo", "train", "--config", str(work / "config.yaml")]
        rng = random.Random(args.seed)
        samples: list[dict[str, Any]] = []
        started = time.perf_counter()
        pending, segment, log = list(faults), 0, work / "train.log"
        status, ended_by = run_segment(cmd, ctx, args.iterations, pending, samples, segment, rng, log)
        while ended_by is not None:
            if ended_by.kind == "disk-full":
                last = log.read_text().strip().splitlines()[-1] if log.exists() else ""
                ctx.events[-1].update({"exit_status": status, "last_line": last,
                                       "one_line": status == 1 and " is full (" in last and "Traceback" not in log_tail(log)})
                Path(ctx.events[-1]["ballast"]).unlink()
                print(f"  the run stopped with exit status {status}: {last[:160]}", flush=True)
                print("  space freed; resuming with --resume", flush=True)
            segment += 1
            status, ended_by = run_segment([*cmd, "--resume"], ctx, args.iterations, pending, samples, segment, rng, log)
        wall = time.perf_counter() - started
        ctx.events.extend(restart_lines(log))
        check = check_iterations(ctx.run, args.iterations)
        reference = compare_with_reference(work, config, read_metrics(ctx.run / "metrics.jsonl"), args.iterations, redis) if args.reference else None
        return finish(args, samples, check, ctx.events, status, wall, work, reference)


def reference_only(args: argparse.Namespace) -> int:
    """``--reference-of WORK``: a finished soak's config run again without faults for its first
    ``--reference-iterations``, compared line by line; the comparison is added to ``--name``'s json."""
    work = Path(args.reference_of)
    config = yaml.safe_load((work / "config.yaml").read_text())
    metrics = Path(args.faulted_metrics or work / "run" / "metrics.jsonl")
    faulted = read_metrics(metrics)
    iterations = args.reference_iterations or len(faulted)
    if len(faulted) < iterations:
        raise SystemExit(f"train_soak: {metrics} has {len(faulted)} iterations, fewer than {iterations}")
    with contextlib.ExitStack() as stack:
        store = str((config.get("placement") or {}).get("store", ""))
        # the soak's own Redis is gone: a new one (compare_with_reference points the run at its database 1)
        redis = stack.enter_context(RedisServer(persist_dir=work / "reference-redis")) if store.startswith("redis") else None
        result = compare_with_reference(work, config, faulted, iterations, redis)
    path = RESULTS / f"{args.name}.json"
    data = json.loads(path.read_text()) if path.exists() else {"benchmark": args.name}
    data["reference"] = {**result, "command": " ".join(sys.argv), "faulted_metrics": str(metrics)}
    path.write_text(strict_json.dumps(data, indent=2) + "\n")
    differing = result["iterations_that_differ"]
    print(f"reference: exit status {result['exit_status']}, {result['iterations_compared']} iterations compared, "
          f"{len(differing)} differ "
          f"{differing[:10]}; keys {result['keys_that_differ']}; {result['wall_s']:.0f} s -> {path}")
    return 0 if result["exit_status"] == 0 and not differing else 1


def role_growth(samples: list[dict[str, Any]], warmup: int) -> dict[str, dict[str, Any]]:
    """Each role's worker RSS over the whole run after warm-up, restarts included: a life of 50-100
    iterations projects the band of a random-moment sample (+-50 MB) as a slope of +-20% per 1,000;
    the role's trend over the run says whether its memory grows."""
    out = {}
    for key in sorted({k for row in samples for k in row if k.endswith("_worker_rss_mb")}):
        rows = [row for row in samples if row.get(key) is not None]
        out[f"{key.removesuffix('_worker_rss_mb')} worker, all lives"] = {
            "rss_mb": growth([r["iteration"] for r in rows], [r[key] for r in rows], rows[0]["iteration"] + warmup)}
    return out


def log_tail(log: Path, lines: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def restart_lines(log: Path) -> list[dict[str, Any]]:
    """The loop's own one-line reports of worker restarts and store outages, from its log."""
    keep = (" worker died during ", "redis at ", " is full (", "Chromium is gone", ": the vLLM server at ")
    return [{"logged": line.strip()} for line in log.read_text(errors="replace").splitlines()
            if any(k in line for k in keep)]


def mount_tmpfs(folder: Path, size_mb: int, stack: contextlib.ExitStack) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(folder)],
                          capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"train_soak: cannot mount a tmpfs at {folder} (needs root): {done.stderr.strip()}")
    stack.callback(subprocess.run, ["umount", "-l", str(folder)], check=False)
    return folder


def steady(metrics: dict[str, Any]) -> dict[str, Any]:
    """A metrics line without what differs between two runs of the same path: timings, throughput,
    the store's byte counters (per process since it started) and the restart count."""
    return {k: v for k, v in metrics.items() if not k.startswith("time/") and not k.endswith(("/seconds", "/tokens_per_s"))
            and "/store_bytes_" not in k and k != "restarts"}


def read_metrics(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def compare_with_reference(work: Path, config: dict[str, Any], faulted: list[dict[str, Any]], iterations: int,
                           redis: Any) -> dict[str, Any]:
    """The same config without faults for its first ``iterations`` (all of the faulted run's, or fewer:
    the lr is constant and no schedule reads the run's length), in its own folder (and Redis namespace),
    compared line by line with the faulted run's metrics lines."""
    ref_run = work / "reference"
    ref = {**config, "out_dir": str(ref_run),
           "stages": [{**config["stages"][0], "iterations": iterations}]}
    if redis is not None:
        ref["placement"] = {**ref["placement"], "store": redis.url.rsplit("/", 1)[0] + "/1"}  # another database
    (work / "reference.yaml").write_text(yaml.safe_dump(ref))
    shutil.rmtree(ref_run, ignore_errors=True)  # this benchmark's own folder: a rerun starts afresh
    t0 = time.perf_counter()
    with (work / "reference.log").open("w") as out:
        status = subprocess.run([sys.executable, "-m", "mgrpo_algo", "train", "--config", str(work / "reference.yaml")],
                                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT).returncode
    faulted = faulted[:iterations]
    clean = read_metrics(ref_run / "metrics.jsonl") if status == 0 else []
    differing = [m["iteration"] for m, c in zip(faulted, clean, strict=False) if steady(m) != steady(c)]
    keys: dict[str, int] = {}
    for m, c in zip(faulted, clean, strict=False):
        for k in set(steady(m)) | set(steady(c)):
            if m.get(k) != c.get(k):
                keys[k] = keys.get(k, 0) + 1
    return {"exit_status": status, "wall_s": time.perf_counter() - t0, "iterations_compared": min(len(faulted), len(clean)),
            "iterations_that_differ": differing, "keys_that_differ": dict(sorted(keys.items(), key=lambda kv: -kv[1])[:20]),
            "equal": status == 0 and len(clean) == iterations and not differing}


def finish(args: argparse.Namespace, samples: list[dict[str, Any]], check: dict[str, Any],
           events: list[dict[str, Any]], status: int, wall: float, work: Path, reference: dict[str, Any] | None) -> int:
    judged: dict[str, Any] = {}
    keys = ["rss_mb", "fds", "threads", "children", "children_rss_mb", "folder_mb",
            *sorted({k for row in samples for k in row if k.endswith("_worker_rss_mb")})]
    for segment in sorted({row["segment"] for row in samples}):
        rows = [row for row in samples if row["segment"] == segment]
        start = rows[0]["iteration"] + args.warmup
        xs = [row["iteration"] for row in rows]
        judged[f"loop {segment}"] = {key: growth(xs, [row.get(key) for row in rows], start)
                                     for key in keys if not key.endswith("_worker_rss_mb")}
    # each worker process over its own lifetime (a restarted worker starts afresh)
    for key in (k for k in keys if k.endswith("_worker_rss_mb")):
        role = key.removesuffix("_worker_rss_mb")
        for pid in dict.fromkeys(row[f"{role}_worker_pid"] for row in samples if f"{role}_worker_pid" in row):
            rows = [row for row in samples if row.get(f"{role}_worker_pid") == pid]
            judged[f"{role} worker {pid}"] = {"rss_mb": growth([r["iteration"] for r in rows], [r[key] for r in rows],
                                                               rows[0]["iteration"] + args.warmup)}
    judged.update(role_growth(samples, args.warmup))
    injected = [e for e in events if "fault" in e]
    table: list[tuple[str, Any, str]] = [
        ("iterations", len(samples), f"asked {args.iterations}; exit status {status}"),
        ("iterations lost or applied twice", 0 if check["ok"] else "yes", json.dumps(check)),
        ("faults injected", len(injected), "; ".join(e["fault"] for e in injected)),
        ("disk full: stopped in one line", sum(bool(e.get("one_line")) for e in injected if e["fault"].startswith("disk-full")),
         f"of {sum(e['fault'].startswith('disk-full') for e in injected)}"),
        ("lines the loop logged for faults", len([e for e in events if "logged" in e]), ""),
        ("wall time", wall, "s"),
    ]
    if reference is not None:
        table.append(("same metrics as an unfaulted run", "yes" if reference["equal"] else "no",
                      f"{reference['iterations_compared']} iterations compared; differing: "
                      f"{reference['iterations_that_differ'][:10]}{' ...' if len(reference['iterations_that_differ']) > 10 else ''}"))
    for name, figures in judged.items():
        rss = figures.get("rss_mb")
        if rss:
            table.append((f"{name}: RSS after warm-up", f"{rss['first']:.0f} -> {rss['last']:.0f}",
                          f"MB, iterations {rss['from_x']}-{rss['to_x']}; slope {rss['slope_per_1000']:.1f} MB "
                          f"per 1,000 iterations ({rss['projected_pct_per_10000'] / 10:.1f}% per 1,000; target < 10)"))
        for key in ("fds", "threads", "children", "folder_mb"):
            if figures.get(key):
                table.append((f"{name}: {key} after warm-up", f"{figures[key]['first']:.1f} -> {figures[key]['last']:.1f}",
                              f"max {figures[key]['max']:.1f}"))
    if samples:
        table.append(("run folder at the end", samples[-1]["folder_mb"],
                      "MB: " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(samples[-1]["folder_by_entry_mb"].items()))))
    xs = [row["iteration"] for row in samples]
    series = {"training loop (RSS)": [row["rss_mb"] for row in samples],
              **{f"{k.removesuffix('_rss_mb').replace('_', ' ')} (RSS)": [row.get(k) for row in samples]
                 for k in keys if k.endswith("_worker_rss_mb")},
              "run folder": [row["folder_mb"] for row in samples]}
    plot = plot_samples(RESULTS / f"{args.name}.png", xs, series, xlabel="iterations committed",
                        title="training soak", warmup=args.warmup) if samples else None
    report(args.name, table, {"check": check, "faults": events, "reference": reference, "growth_after_warmup": judged,
                              "samples": samples, "plot": str(plot) if plot else None, "work": str(work),
                              "command": " ".join(sys.argv)})
    ok = (check["ok"] and status == 0 and len({row["iteration"] for row in samples}) >= args.iterations - len(injected)
          and all(e.get("one_line", True) for e in injected) and (reference is None or reference["equal"]))
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
