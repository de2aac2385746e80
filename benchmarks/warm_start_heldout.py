"""Held-out turn exact match of a folder of start models, per role, on the oracle's stage-2 test turns.

    .venv/bin/python benchmarks/warm_start_heldout.py [--models configs/demo-warm-start] [--split stage2/test]
    .venv/bin/python benchmarks/warm_start_heldout.py --models configs/shared-warm-start --shared
    .venv/bin/python benchmarks/warm_start_heldout.py --models runs/noreason-start --set 'tools={main: [delegate]}' \
        --name warm_start_heldout_no_reason

``--shared``: one model, ``MODELS/main``, plays the main agent and the sub-agents (the shared-model
baseline's start, ``mgrpo warm-start --shared``), measured on both roles' turns; it writes
``warm_start_heldout_shared.json`` (or ``--name``). ``--set`` changes the config as ``mgrpo`` does; its
``tools`` choose the tools the demonstrations show (measure a start on the prompts it was built with).

The metric of the warm-start sweep (``mgrpo_algo.learning.warmstart.turn_exact_match``: the share of
demonstrated turns that greedy decoding reproduces token for token), measured on questions no role
was trained on, through the demo's world (tiny profile) and limits. Writes
benchmarks/results/warm_start_heldout.json.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import report  # noqa: E402

from mgrpo_algo.core.config import load_config  # noqa: E402
from mgrpo_algo.learning.warmstart import demonstrations, sft_sequences, turn_exact_match  # noqa: E402
from mgrpo_algo.policies.chat_tokens import load_tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default=str(ROOT / "configs" / "demo-warm-start"))
    parser.add_argument("--config", default=str(ROOT / "configs" / "demo.yaml"), help="world and limits")
    parser.add_argument("--split", default="stage2/test")
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--shared", action="store_true", help="MODELS/main plays both the main and the sub role")
    parser.add_argument("--name", default="", help="results file name (default warm_start_heldout[_shared])")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="a config field (as mgrpo)")
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM

    import mgrpo_scenarios

    torch.set_num_threads(args.threads)
    config = load_config(args.config, args.set)
    scenario = mgrpo_scenarios.get(config.scenario, **config.scenario_kwargs)
    limits = config.limits
    folder = Path(args.models)
    # which model folder plays each role: its own, or (shared) the main one for main and sub
    plays = ({role: folder / "main" for role in ("main", "sub")} if args.shared
             else {role: folder / role for role in ("main", "sub", "single") if (folder / role).is_dir()})
    with scenario.open() as world:
        chats = demonstrations(scenario, world, [args.split], args.tasks, single=False, limits=limits, tools=config.tools)
        if "single" in plays:
            chats.update(demonstrations(scenario, world, [args.split], args.tasks, single=True, limits=limits,
                                        tools=config.tools))
    rows, raw = [], {}
    for role, model_dir in plays.items():
        tokenizer = load_tokenizer(str(model_dir))
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        sequences, _ = sft_sequences(tokenizer, chats[role], role=role, noise=0.0, rng=random.Random(0),
                                     max_seq_tokens=4096)
        raw[role] = turn_exact_match(model, sequences, pad_id=tokenizer.pad_token_id or 0)
        rows.append((f"{role} turn exact match", raw[role]["turn_exact_match"],
                     f"{raw[role]['turns']} turns of {args.split}; token accuracy {raw[role]['token_accuracy']:.3f}"))
    name = args.name or ("warm_start_heldout_shared" if args.shared else "warm_start_heldout")
    shared = {"shared": True, "plays": {role: str(path) for role, path in plays.items()}} if args.shared else {}
    chosen = {"tools": config.tools} if config.tools else {}
    report(name, rows, {"models": str(folder), "split": args.split, **shared, **chosen, "per_role": raw})


if __name__ == "__main__":
    main()
