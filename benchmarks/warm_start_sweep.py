"""Warm-start sweep: how many supervised steps and tokens tiny models need to imitate the oracle.

    .venv/bin/python benchmarks/warm_start_sweep.py --quick                 # smoke run, < 1 min on CPU
    python benchmarks/warm_start_sweep.py --device cuda --parallel 12 \\
        --roles main,sub,single --sizes 128x4,256x4 --lrs 1e-3,3e-3 --epochs 16   # on a GPU
    .venv/bin/python benchmarks/warm_start_sweep.py --summarize benchmarks/results/warm_start_sweep_gpu*.jsonl

What it measures: per (role, size, learning rate, batch tokens), tiny Qwen2 models
(``build_tiny_model``) are fitted by cross-entropy on the oracle's demonstrations of stage1/train +
stage2/train (``demonstrations`` + ``sft_sequences``, noise 0 by default) by the warm start's own
``sft_train`` (length-sorted packing under a padded-token budget, shuffled batches, right padding
without attention mask, AdamW, clip 1.0), evaluated from its ``on_epoch`` callback.
At checkpoint epochs the held-out turn exact match on stage1/test and stage2/test demonstrations
(``turn_exact_match``: share of assistant turns that greedy decoding reproduces exactly) is
appended as one JSON line per checkpoint; a table and results/warm_start_sweep.json follow.

Why: the demo's warm start (configs/demo.yaml) must fit a 2-core CPU budget, and a policy that
reproduces almost no turn gives RL little to reinforce. The sweep finds the steps and tokens where
held-out turn EM takes off, and ``--summarize`` converts them into CPU hours at a measured CPU
throughput (``--cpu-tokens-per-s``, the same unit as ``tokens``: non-padding tokens, prompt and
completion, fed per second; default 4865, hidden 128 x 4 layers, 2 threads, 8,000-token batches).

On a GPU: ``--device cuda`` trains in bf16 autocast (loss in float32); ``--parallel P`` runs P
configs in separate processes, which share one GPU well (tiny models leave it mostly idle). The
committed GPU results are results/warm_start_sweep_gpu.jsonl (batch 8192) and
results/warm_start_sweep_gpu_small_batches.jsonl (batches 1024/2048), from an earlier throwaway
script with the same data, batching and metric (there the MLP was 4 x hidden, here it is the
project's 8/3 x hidden).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import pickle
import random
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import RESULTS, report  # noqa: E402

from mgrpo_algo.core.config import Limits, WarmStartConfig  # noqa: E402
from mgrpo_algo.learning.warmstart import (  # noqa: E402
    Relabeled,
    demonstrations,
    sft_sequences,
    sft_train,
    token_groups,
    turn_exact_match,
)
from mgrpo_algo.policies.chat_tokens import load_tokenizer  # noqa: E402
from mgrpo_algo.policies.models import ROLES, build_role_models, build_tiny_model, count_parameters  # noqa: E402
from mgrpo_env import strict_json  # noqa: E402

LIMITS = Limits(max_main_turns=6, max_sub_turns=4, max_delegations=4)
TRAIN_SPLITS = ["stage1/train", "stage2/train"]
HELD_OUT = {"stage1": "stage1/test", "stage2": "stage2/test"}
CHECKPOINTS = "1,2,3,4,6,8,10,12,16,20,24,32"
THRESHOLDS = (0.10, 0.25)


# --------------------------------------------------------------------------- data


def prepare(args: argparse.Namespace, work: Path) -> dict[str, Path]:
    """Tokenised demonstrations per role (train, stage1, stage2), pickled under ``work``; {role: file}."""
    from mgrpo_scenarios.wiki_hops import WikiHops

    scenario = WikiHops(seed=0, num_entities=args.entities, data_dir=args.data_dir or work / "data", profile=args.profile)
    build_role_models(scenario, work / "models", {}, roles=())  # the shared tokenizer only
    tok_dir = work / "models" / "tokenizer"
    tokenizer = load_tokenizer(tok_dir)
    roles = args.roles.split(",")
    files = {}
    with scenario.open() as world:
        for single in sorted({role == "single" for role in roles}):
            train = demonstrations(scenario, world, args.train_splits.split(","), args.max_tasks, single=single,
                                   limits=LIMITS)
            held = {name: demonstrations(scenario, world, [split], args.eval_tasks, single=single, limits=LIMITS)
                    for name, split in HELD_OUT.items()}
            for role in train:
                if role not in roles:
                    continue
                blob: dict[str, Any] = {"tokenizer": str(tok_dir), "pad": tokenizer.pad_token_id or 0,
                                        "groups": token_groups(scenario, tokenizer)}
                blob["train"], blob["counts"] = sft_sequences(
                    tokenizer, train[role], role=role, noise=args.noise, rng=random.Random(0),
                    max_seq_tokens=args.max_seq_tokens)
                for name, chats in held.items():
                    blob[name], _ = sft_sequences(tokenizer, chats[role], role=role, noise=0.0, rng=random.Random(0),
                                                  max_seq_tokens=args.max_seq_tokens)
                files[role] = work / f"{role}.pkl"
                files[role].write_bytes(pickle.dumps(blob))
                print(f"  {role}: {len(blob['train'])} train sequences "
                      f"({sum(len(s) for s, _ in blob['train']):,} tokens), held out {len(blob['stage1'])} stage1 + "
                      f"{len(blob['stage2'])} stage2, {blob['counts']}", flush=True)
    return files


# --------------------------------------------------------------------------- one config


def run_config(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Train one (role, size, lr, batch) config with the project's ``sft_train``; one record per
    checkpoint epoch (held-out turn exact match), appended to ``spec['out']``."""
    torch.set_num_threads(spec["threads"])
    blob = pickle.loads(Path(spec["data"]).read_bytes())
    train, pad = blob["train"], blob["pad"]
    model = build_tiny_model(load_tokenizer(blob["tokenizer"]), None, hidden_size=spec["hidden"],
                             num_layers=spec["layers"], seed=ROLES.index(spec["role"]))
    cfg = WarmStartConfig(epochs=spec["epochs"], lr=spec["lr"], batch_tokens=spec["batch_tokens"], device=spec["device"],
                          seed=0, warmup_steps=spec["warmup"], min_lr_ratio=spec["min_lr_ratio"], beta2=spec["beta2"])
    records: list[dict[str, Any]] = []
    started = time.perf_counter()

    def checkpoint(stats: dict[str, float]) -> None:
        epoch = int(stats["epoch"])
        if epoch not in spec["checkpoints"] and epoch != spec["epochs"]:
            return
        train_s = stats["train_s"]
        record = {
            "role": spec["role"], "hidden": spec["hidden"], "layers": spec["layers"], "lr": spec["lr"],
            "batch_tokens": spec["batch_tokens"], "params": count_parameters(model), "device": spec["device"],
            "threads": spec["threads"], "profile": spec["profile"], "warmup": spec["warmup"],
            "min_lr_ratio": spec["min_lr_ratio"], "beta2": spec["beta2"], "relabel": spec["relabel"], "epoch": epoch, "steps": stats["steps"], "tokens": stats["tokens"],
            "loss_tokens": stats["loss_tokens"], "train_seqs": len(train), "loss": round(stats["loss"], 4),
            "train_s": round(train_s, 1), "tokens_per_s": round(stats["tokens"] / train_s, 1) if train_s else None,
        }
        for name in HELD_OUT:
            em = turn_exact_match(model, blob[name], pad_id=pad)
            record[name] = {"turn_em": em["turn_exact_match"], "token_acc": em["token_accuracy"], "turns": em["turns"]}
        record["wall"] = round(time.perf_counter() - started, 1)
        with open(spec["out"], "a") as f:
            f.write(strict_json.dumps(record) + "\n")
        print(f"  {label(record)} epoch {epoch}: stage-2 turn EM {record['stage2']['turn_em']:.3f}, "
              f"loss {record['loss']}, {record['wall']} s", flush=True)
        records.append(record)

    shown = Relabeled(train, blob["groups"], seed=0) if spec["relabel"] else train
    sft_train(model, shown, cfg, pad_id=pad, progress=False, on_epoch=checkpoint)
    return records


# --------------------------------------------------------------------------- tables


def _recipe(r: dict[str, Any]) -> str:
    """The levers beyond size / lr / batch, for records that have them (older records: the full profile,
    constant lr, beta2 0.999)."""
    parts = [r.get("profile", "full")]
    if r.get("warmup"):
        parts.append(f"wu{r['warmup']}")
    if r.get("min_lr_ratio", 1.0) != 1.0:
        parts.append(f"cos{r['min_lr_ratio']:g}")
    if r.get("beta2", 0.999) != 0.999:
        parts.append(f"b2 {r['beta2']:g}")
    if r.get("relabel"):
        parts.append("relabel")
    return " ".join(parts)


def label(r: dict[str, Any]) -> str:
    return f"{r['role']} {r['hidden']}x{r['layers']} lr {r['lr']:.0e} batch {r['batch_tokens']} {_recipe(r)}"


def _key(r: dict[str, Any]) -> tuple[Any, ...]:
    return (r["role"], r["hidden"], r["layers"], r["lr"], r["batch_tokens"], _recipe(r))


def _em(r: dict[str, Any], stage: str) -> float:
    value = r[stage]["turn_em"]
    return value if value == value else 0.0  # NaN (no turn) counts as 0


def checkpoint_table(records: list[dict[str, Any]]) -> None:
    print(f"\n{'role':<7}{'size':>6}{'lr':>7}{'batch':>7}{'epoch':>6}{'steps':>7}{'Mtokens':>9}{'EM s1':>8}{'EM s2':>8}{'loss':>8}")
    for r in sorted(records, key=lambda r: (_key(r), r["epoch"])):
        print(f"{r['role']:<7}{r['hidden']:>3}x{r['layers']:<2}{r['lr']:>7.0e}{r['batch_tokens']:>7}{r['epoch']:>6}"
              f"{r['steps']:>7}{r['tokens'] / 1e6:>9.2f}{_em(r, 'stage1'):>8.3f}{_em(r, 'stage2'):>8.3f}{r['loss']:>8}")


def _diverged(loss: Any) -> bool:
    """A loss that is not a number: null in the JSONL (strict JSON), NaN in lines written before."""
    return loss is None or (isinstance(loss, float) and math.isnan(loss))


def summary(records: list[dict[str, Any]], cpu_tokens_per_s: float) -> list[dict[str, Any]]:
    """Per config: the first checkpoint reaching each stage-2 EM threshold, and the best EMs; printed."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        groups[_key(r)].append(r)
    rows = []
    for _, group in sorted(groups.items()):
        group.sort(key=lambda r: r["epoch"])
        row: dict[str, Any] = {"config": label(group[0]), "epochs": group[-1]["epoch"],
                               "diverged": any(_diverged(r["loss"]) for r in group)}
        for threshold in THRESHOLDS:
            hit = next((r for r in group if _em(r, "stage2") >= threshold), None)
            row[f"em{threshold:.2f}"] = None if hit is None else {
                "epoch": hit["epoch"], "steps": hit["steps"], "tokens": hit["tokens"],
                "cpu_hours": hit["tokens"] / cpu_tokens_per_s / 3600}
        best = max(group, key=lambda r: _em(r, "stage2"))
        row["best_stage2"] = {"turn_em": _em(best, "stage2"), "epoch": best["epoch"]}
        row["best_stage1"] = max(_em(r, "stage1") for r in group)
        rows.append(row)
    head = "".join(f"{'EM>=' + f'{t:.2f}' + ': ep/steps/Mtok/CPU h':>34}" for t in THRESHOLDS)
    print(f"\n{'config':<34}{'epochs':>7}{head}{'best s2 (ep)':>14}{'best s1':>9}")
    for row in rows:
        cells = ""
        for threshold in THRESHOLDS:
            hit = row[f"em{threshold:.2f}"]
            cells += f"{'-':>34}" if hit is None else (
                f"{hit['epoch']:>12}{hit['steps']:>7}{hit['tokens'] / 1e6:>7.1f}{hit['cpu_hours']:>8.1f}")
        best = f"{row['best_stage2']['turn_em']:.3f} ({row['best_stage2']['epoch']})"
        print(f"{row['config'] + (' NaN' if row['diverged'] else ''):<34}{row['epochs']:>7}{cells}{best:>14}"
              f"{row['best_stage1']:>9.3f}")
    print(f"CPU hours: tokens (non-padding, prompt + completion) / {cpu_tokens_per_s:,.0f} tokens/s "
          f"(--cpu-tokens-per-s; measured for 128x4, larger models are slower). NaN: the loss diverged.")
    return rows


# --------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--roles", default="main,sub,single")
    parser.add_argument("--sizes", default="128x4,256x4", help="hidden x layers, comma separated")
    parser.add_argument("--lrs", default="1e-3")
    parser.add_argument("--batch-tokens", default="8192", help="padded tokens per step, comma separated")
    parser.add_argument("--epochs", type=int, default=16)
    parser.add_argument("--checkpoints", default=CHECKPOINTS, help="epochs to evaluate at (and the last)")
    parser.add_argument("--entities", type=int, default=300)
    parser.add_argument("--max-tasks", type=int, default=400, help="demonstrated tasks per train split")
    parser.add_argument("--eval-tasks", type=int, default=100, help="held-out tasks per test split")
    parser.add_argument("--max-seq-tokens", type=int, default=4096)
    parser.add_argument("--noise", type=float, default=0.0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    parser.add_argument("--parallel", type=int, default=1, help="configs trained at once, one process each")
    parser.add_argument("--threads", type=int, default=0, help="torch threads per config (0: CPUs / parallel on CPU, 1 on CUDA)")
    parser.add_argument("--data-dir", default=None, help="world cache (default: a temporary folder)")
    parser.add_argument("--out", default=None, help="JSONL to append to (default results/warm_start_sweep.jsonl)")
    parser.add_argument("--quick", action="store_true", help="tiny smoke run: main, 32x1, 1 epoch, few tasks")
    parser.add_argument("--summarize", nargs="+", metavar="FILE", help="only print the tables of these JSONL files")
    parser.add_argument("--cpu-tokens-per-s", type=float, default=4865.0)
    parser.add_argument("--profile", default="full", choices=["full", "tiny"], help="wiki-hops profile (observations, oracle, tokenizer)")
    parser.add_argument("--train-splits", default=",".join(TRAIN_SPLITS), help="demonstrated splits, comma separated")
    parser.add_argument("--warmup", type=int, default=0, help="linear warmup steps")
    parser.add_argument("--min-lr-ratio", type=float, default=1.0, help="cosine decay to lr x this (1: constant)")
    parser.add_argument("--beta2", type=float, default=0.999)
    parser.add_argument("--relabel", action="store_true", help="relabel world tokens in every demonstration shown")
    args = parser.parse_args()

    if args.summarize:
        records = [json.loads(line) for path in args.summarize for line in Path(path).read_text().splitlines() if line.strip()]
        print(f"{len(records)} checkpoints from {', '.join(args.summarize)}")
        summary(records, args.cpu_tokens_per_s)
        return
    if args.quick:
        args.roles, args.sizes, args.lrs, args.batch_tokens, args.epochs = "main", "32x1", "1e-3", "8192", 1
        args.max_tasks, args.eval_tasks, args.parallel = 4, 4, 1
    threads = args.threads or (1 if args.device == "cuda" else max(1, (os.cpu_count() or 1) // args.parallel))
    torch.set_num_threads(threads)
    out = Path(args.out) if args.out else RESULTS / "warm_start_sweep.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        print("demonstrations ...", flush=True)
        files = prepare(args, Path(tmp))
        prepared_s = time.perf_counter() - started
        specs = [
            {"role": role, "hidden": int(size.split("x")[0]), "layers": int(size.split("x")[1]), "lr": float(lr),
             "batch_tokens": int(bt), "epochs": args.epochs, "checkpoints": {int(e) for e in args.checkpoints.split(",")},
             "device": args.device, "threads": threads, "data": str(files[role]), "out": str(out),
             "profile": args.profile, "warmup": args.warmup, "min_lr_ratio": args.min_lr_ratio, "beta2": args.beta2,
             "relabel": args.relabel}
            for role in args.roles.split(",") for size in args.sizes.split(",") for lr in args.lrs.split(",")
            for bt in args.batch_tokens.split(",")
        ]
        print(f"{len(specs)} configs, {args.parallel} at a time, {threads} thread(s) each, on {args.device}", flush=True)
        if args.parallel > 1:
            with ProcessPoolExecutor(args.parallel, mp_context=multiprocessing.get_context("spawn")) as pool:
                records = [r for rs in pool.map(run_config, specs) for r in rs]
        else:
            records = [r for spec in specs for r in run_config(spec)]
    total_s = time.perf_counter() - started
    checkpoint_table(records)
    rows = summary(records, args.cpu_tokens_per_s)
    figures = [(f"{label(r)} epoch {r['epoch']}", _em(r, "stage2"),
                f"stage-2 held-out turn EM (stage-1 {_em(r, 'stage1'):.3f}), {r['steps']} steps, "
                f"{r['tokens'] / 1e6:.2f} Mtokens, {r['tokens_per_s']} tokens/s")
               for r in sorted(records, key=lambda r: (_key(r), r["epoch"]))]
    figures += [("demonstrations (world, tokenizer, oracle)", prepared_s, "s"), ("total", total_s, "s")]
    report("warm_start_sweep", figures, extra={"args": {k: v for k, v in vars(args).items() if k != "summarize"},
                                               "jsonl": str(out), "summary": rows, "records": records})


if __name__ == "__main__":
    main()
