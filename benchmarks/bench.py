"""Run every benchmark and print one combined table.

    .venv/bin/python benchmarks/bench.py [--quick] [--only vs_trl,scaling]

Each benchmark runs in its own subprocess (``--quick`` passed on), writes its
benchmarks/results/<name>.json, and its figures are gathered here into one table, prefixed by the
benchmark's name. A benchmark that fails is listed with its exit status and the run goes on.
``--quick`` is the small preset (tiny sizes, fewer repeats, a few minutes on 2 CPU cores); TRL is
skipped, and said so, when it is not installed (``pip install -e '.[bench]'``).
Writes benchmarks/results/bench.json: ``{"quick", "benchmarks": {name: {"ok", "seconds",
"returncode"}}, "figures": {"<name>: <label>": {"value", "unit"}}}``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import RESULTS, report  # noqa: E402

BENCHMARKS = ("world_and_tools", "env_throughput", "learner", "decoupled", "vs_trl", "rollout_vs_generate", "scaling",
              "kv_reuse", "demo_iteration", "generation", "live_decode", "fit_train")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="small preset of every benchmark")
    parser.add_argument("--only", default="", help="comma-separated subset of " + ", ".join(BENCHMARKS))
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n] or list(BENCHMARKS)
    unknown = set(names) - set(BENCHMARKS)
    if unknown:
        parser.error(f"unknown benchmarks {sorted(unknown)}; valid: {', '.join(BENCHMARKS)}")
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "TRANSFORMERS_VERBOSITY": "error"}
    runs, rows = {}, []
    for name in names:
        t0 = time.perf_counter()
        started = time.time()
        print(f"== {name}", flush=True)
        proc = subprocess.run([sys.executable, str(HERE / f"{name}.py"), *(["--quick"] if args.quick else [])],
                              cwd=HERE.parent, env=env)
        seconds = time.perf_counter() - t0
        path = RESULTS / f"{name}.json"
        fresh = path.exists() and path.stat().st_mtime >= started
        runs[name] = {"ok": proc.returncode == 0 and fresh, "seconds": seconds, "returncode": proc.returncode}
        if not runs[name]["ok"]:
            rows.append((f"{name}: FAILED", f"rc {proc.returncode}", "no fresh results"))
            continue
        for label, fig in json.loads(path.read_text())["figures"].items():
            rows.append((f"{name}: {label}", fig["value"], fig["unit"]))
        rows.append((f"{name}: (wall)", seconds, "s"))
    report("bench", rows, {"quick": args.quick, "benchmarks": runs})
    if not all(r["ok"] for r in runs.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
