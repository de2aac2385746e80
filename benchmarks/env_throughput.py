"""Env throughput with the scripted oracle and cached tools, and where the time goes.

    .venv/bin/python benchmarks/env_throughput.py [--entities 2000] [--k 4] [--quick]

Runs ``collect`` over every stage2/test task x K rollouts with the oracle policies twice: the first
pass fills the response cache, the second is measured (cached tools). Reports env steps/s and
episodes/s with 1 and 8 stepping threads, the share of wall time spent outside tool calls (1
thread, so tool latencies do not overlap), the policy share, and the distribution of d_k (sub-agents
per episode) under the oracle. Writes benchmarks/results/env_throughput.json.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import report  # noqa: E402

from mgrpo_env import align  # noqa: E402
from mgrpo_env.rollout import CollectStats, collect  # noqa: E402
from mgrpo_env.scripted import OraclePolicy  # noqa: E402
from mgrpo_scenarios.wiki_hops import WikiHops  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--entities", type=int, default=2000)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="300 entities, 20 tasks")
    args = parser.parse_args()
    n = 300 if args.quick else args.entities
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        scenario = WikiHops(seed=0, num_entities=n, data_dir=tmp, cache_path=Path(tmp) / "cache.sqlite")
        tasks = list(scenario.tasks("stage2/test"))[: 20 if args.quick else None]
        policies = {"main": OraclePolicy(scenario, "main"), "sub": OraclePolicy(scenario, "sub")}
        with scenario.open() as world:
            collect(scenario, tasks, args.k, policies, world=world)  # warm the cache (and Chromium)
            figures = {}
            for workers in (1, 8):
                stats = CollectStats()
                records = collect(scenario, tasks, args.k, policies, world=world, stats=stats, max_workers=workers)
                figures[workers] = (stats, records)
            stats1, records = figures[1]
            stats8, _ = figures[8]
    episodes = len(records)
    rows.append(("episodes (stage2/test x K)", episodes, f"K={args.k}, {n} entities"))
    rows.append(("oracle accuracy", sum(r.correct for r in records) / episodes, "exact match"))
    for workers, (stats, _) in sorted(figures.items()):
        rows.append((f"env steps/s ({workers} thread{'s' if workers > 1 else ''})", stats.env_steps / stats.wall_s, "steps/s"))
        rows.append((f"episodes/s ({workers} thread{'s' if workers > 1 else ''})", stats.episodes / stats.wall_s, "episodes/s"))
    rows.append(("share of wall time in tools (1 thread)", stats1.tool_s / stats1.wall_s, "cached tools"))
    rows.append(("share of wall time outside tools (1 thread)", 1 - stats1.tool_s / stats1.wall_s, "env + policy + collect"))
    rows.append(("share of wall time in the oracle policy", stats1.policy_s / stats1.wall_s, "1 thread"))
    counts = Counter(r.num_subs for r in records)
    dist = {str(d): counts[d] / episodes for d in sorted(counts)}
    rows.append(("d_k distribution", dist, "share of episodes with d_k sub-agents"))
    rows.append(("choose_d(q=0.99)", align.choose_d([r.num_subs for r in records]), "alignment width"))
    report("env_throughput", rows)


if __name__ == "__main__":
    main()
