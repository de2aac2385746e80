"""Served (vLLM, CPU build) vs in-process rollouts per second, on the tiny model and on a larger one.

Side by side in one run, the same world, tasks, limits and token budget: ``collect()`` of B x K
hierarchy rollouts (main and sub agents) with
- in process: ``TransformersPolicy`` (the project's default fast decode, KV cache across turns),
- served: ``OpenAICompatiblePolicy`` on one vLLM server (``VLLMServer``, float32, eager) per model.

Models: the demo's warm start (128 hidden x 4 layers, a trained policy) and a 512 x 8 model of the same
tokenizer with random weights (its turns run to the token budget: it measures decode, not the policy).
One torch thread in process; the server pinned like this process (``taskset -c 1 python ...``).

    .venv/bin/python benchmarks/served.py            # benchmarks/results/served.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import torch

from mgrpo_env import strict_json

ROOT = Path(__file__).resolve().parents[1]


def rollouts_per_s(scenario, world, tasks, k: int, policies: dict, limits: dict, repeats: int) -> dict:
    from mgrpo_env.rollout import collect

    collect(scenario, tasks[:1], 1, policies, world=world, seed=0, env_kwargs=limits)  # warm-up
    times, tokens = [], 0
    for r in range(repeats):
        t0 = time.perf_counter()
        records = collect(scenario, tasks, k, policies, world=world, seed=100 + r, env_kwargs=limits)
        times.append(time.perf_counter() - t0)
        tokens += sum(len(t.extra.get("completion_ids", [])) for rec in records
                      for traj in [rec.main, *rec.subs] if traj is not None for t in traj.turns)
    best = min(times)
    return {"rollouts": len(tasks) * k, "seconds": times, "rollouts_per_s": len(tasks) * k / best,
            "tokens_per_s": tokens / repeats / (sum(times) / repeats)}


def main() -> None:
    from mgrpo_algo.policies.chat_tokens import load_tokenizer
    from mgrpo_algo.policies.hf_policy import TransformersPolicy
    from mgrpo_algo.policies.http_policy import OpenAICompatiblePolicy
    from mgrpo_algo.policies.models import build_tiny_model
    from mgrpo_algo.policies.vllm_server import VLLMServer, save_for_engine
    from mgrpo_scenarios.wiki_hops import WikiHops

    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "served.json"))
    parser.add_argument("--only", default="", help="run only the models whose name contains this")
    parser.add_argument("--log-dir", default="", help="keep the servers' logs here (default: a temporary folder)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    start = ROOT / "configs" / "demo-warm-start" / "main"
    scenario = WikiHops(seed=0, num_entities=300, profile="tiny")
    limits = {"max_main_turns": 3, "max_sub_turns": 2, "max_delegations": 1}
    results = []
    with tempfile.TemporaryDirectory() as tmp, scenario.open() as world:
        tasks = list(scenario.tasks("stage2/test"))[: args.tasks]
        big = Path(tmp) / "512x8"
        shutil.copytree(start, big, ignore=shutil.ignore_patterns("*.safetensors"))
        build_tiny_model(load_tokenizer(str(start)), big, hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=4, seed=0)
        for name, source in (("128x4 (demo warm start)", start), ("512x8 (random weights)", big)):
            if args.only not in name:
                continue
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
            served_dir = Path(tmp) / f"served-{len(results)}"
            shutil.copytree(source, served_dir)
            save_for_engine(model, served_dir)
            params = sum(p.numel() for p in model.parameters())
            local = {r: TransformersPolicy(model, str(source), role=r, max_new_tokens=args.max_new_tokens, seed=1)
                     for r in ("main", "sub")}
            row = {"model": name, "parameters": params,
                   "in_process": rollouts_per_s(scenario, world, tasks, args.k, local, limits, args.repeats)}
            with VLLMServer(served_dir, name="bench", log_path=Path(args.log_dir or tmp) / f"server-{len(results)}.log") as server:
                served = {r: OpenAICompatiblePolicy(server.url, server.served_model_name, role=r, tokenizer=str(source),
                                                    max_new_tokens=args.max_new_tokens, seed=1) for r in ("main", "sub")}
                row["served"] = rollouts_per_s(scenario, world, tasks, args.k, served, limits, args.repeats)
                row["server_start_s"] = server.start_s[0]
            row["served_over_in_process"] = row["served"]["rollouts_per_s"] / row["in_process"]["rollouts_per_s"]
            print(json.dumps(row), flush=True)
            results.append(row)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(strict_json.dumps({"settings": vars(args), "limits": limits, "results": results}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
