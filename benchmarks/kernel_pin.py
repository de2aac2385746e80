"""What the pinned kernels (``kernels.pin: avx2``) cost in speed on this machine, side by side.

    .venv/bin/python benchmarks/kernel_pin.py [--rounds 3] [--iterations 4] [--warmup 1]

M-GRPO iterations of ``configs/demo.yaml`` (its start models, B = 4 x K = 4, one torch thread, no
checkpoints) in fresh processes, one per side and round, the sides alternating (uncapped, pinned,
uncapped, ...) so that a busy machine slows both alike: **uncapped** runs torch's own kernels for the
CPU (AVX-512 here), **pinned** the demo's ``kernels.pin`` (``ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2``, set
before torch loads). Each process runs ``--warmup`` uncounted iterations, then ``--iterations`` timed
ones (the same seeds on both sides: the same iterations, up to the rounding the pin changes). Reported:
seconds per iteration, generation and update summed over rounds per side, and pinned / uncapped as a
ratio of sums (> 1: the pin is slower). Writes benchmarks/results/kernel_pin.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import report  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
KEYS = ("time/iteration", "time/generation", "time/update")


def side(pinned: bool, iterations: int, warmup: int) -> dict[str, float]:
    """One process's timings (run in a child whose environment the parent set)."""
    import torch

    from mgrpo_algo.core.config import load_config
    from mgrpo_algo.core.kernels import check_in_force
    from mgrpo_algo.training.trainer import Trainer

    check_in_force()
    pin = "avx2" if pinned else '""'  # the config's, as the environment the parent gave this process
    with tempfile.TemporaryDirectory() as tmp:
        config = load_config(str(ROOT / "configs" / "demo.yaml"), [
            f"kernels.pin={pin}", "mode=mgrpo", f"out_dir={tmp}/run", "checkpoint=false",
            f"stages=[{{split: stage2/train, iterations: {warmup + iterations}}}]"])
        torch.set_num_threads(config.torch_threads)
        totals = dict.fromkeys(KEYS, 0.0)
        with Trainer(config) as trainer:
            for metrics in trainer.run():
                if metrics["iteration"] >= warmup:
                    for key in KEYS:
                        totals[key] += float(metrics[key])
    return {**totals, "capability": torch.backends.cpu.get_cpu_capability()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="processes per side, alternating")
    parser.add_argument("--iterations", type=int, default=4, help="timed iterations per process")
    parser.add_argument("--warmup", type=int, default=1, help="uncounted iterations per process first")
    parser.add_argument("--side", choices=("pinned", "uncapped"), help=argparse.SUPPRESS)  # a child's
    args = parser.parse_args()
    if args.side:
        print(json.dumps(side(args.side == "pinned", args.iterations, args.warmup)))
        return
    from mgrpo_algo.core.kernels import MARKER, PINS, cpu_info, pin_env

    clean = {k: v for k, v in os.environ.items() if k not in (*PINS["avx2"], MARKER)}
    sides: dict[str, list[dict[str, float]]] = {"uncapped": [], "pinned": []}
    t0 = time.perf_counter()
    for _ in range(args.rounds):
        for label in sides:
            env = {**clean, **(pin_env("avx2") if label == "pinned" else {})}
            done = subprocess.run([sys.executable, __file__, "--side", label, "--iterations", str(args.iterations),
                                   "--warmup", str(args.warmup)], env=env, cwd=ROOT, capture_output=True, text=True,
                                  check=True)
            sides[label].append(json.loads(done.stdout.strip().splitlines()[-1]))
    sums = {label: {key: sum(r[key] for r in runs) for key in KEYS} for label, runs in sides.items()}
    n = args.rounds * args.iterations
    rows = []
    for key in KEYS:
        name = key.split("/")[1]
        rows.append((f"{name} s/iteration uncapped", sums["uncapped"][key] / n,
                     f"torch reports {sides['uncapped'][0]['capability']}"))
        rows.append((f"{name} s/iteration pinned", sums["pinned"][key] / n,
                     f"torch reports {sides['pinned'][0]['capability']}"))
        rows.append((f"{name} pinned / uncapped", sums["pinned"][key] / sums["uncapped"][key],
                     f"ratio of sums over {args.rounds} alternating processes x {args.iterations} iterations a side"))
    report("kernel_pin", rows, {
        "cpu": cpu_info(), "pin": PINS["avx2"], "rounds": args.rounds, "iterations": args.iterations,
        "warmup": args.warmup, "per_process": sides, "seconds": time.perf_counter() - t0,
        "note": "M-GRPO iterations of configs/demo.yaml (B=4 x K=4, 1 torch thread), uncapped and pinned in "
                "alternating fresh processes on a 2-core machine shared with other work"})


if __name__ == "__main__":
    main()
