"""The demo's fingerprint: exact figures of its first minutes, committed beside its results.

    .venv/bin/python benchmarks/demo_fingerprint.py            # compute it, write the JSON
    .venv/bin/python benchmarks/demo_fingerprint.py --check    # recompute it, compare exactly (exit 1 on a change)

Under ``configs/demo.yaml`` as ``make demo`` runs it (its pinned kernels, ``kernels.pin``, set before torch
loads; its committed start models, seed 0, one torch thread):

- **start**: the start models' held-out evaluation on the first ``--questions`` questions of
  ``eval.split`` (``eval.samples`` each at ``eval.temperature``, seeded as compare seeds the start
  evaluation): every episode's reward, EM, F1 and a SHA-256 of its text (every turn's output);
- **train**: the first ``--iterations`` M-GRPO training iterations (``mode=mgrpo``, the demo's B x K,
  seeds and learners): every metric except timings and memory, and a SHA-256 of each iteration's
  episode texts.

Texts, rewards, counts and hashes are compared exactly, so one flipped draw anywhere, a learning rate or a
reward weight changes them; floats within a relative ``FLOAT_RTOL`` (1e-4): the pin makes AVX2 and AVX-512
machines of one vendor round alike, but an Intel Xeon and an AMD EPYC under the same pin still differ in the
backward's last digits (measured: grad_norm up to 5e-6 relative, entropy 1e-7). On an older EPYC every text
stayed equal over 3 iterations; on an EPYC Zen 4 (AVX-512) one draw of iteration 1 flips, and RL carries it
(tried on top of the pin, no help: ``ONEDNN_MAX_CPU_ISA=AVX2``, ``MKL_ENABLE_INSTRUCTIONS=AVX2``,
``MKL_CBWR=AVX2,STRICT`` or ``COMPATIBLE``). So on a CPU of **another vendor** than the one that computed the
fingerprint (``computed_on.cpu``), the start evaluation and iteration 0 (drawn before any update) are still
compared whole, and the later iterations up to the first one whose drawn texts differ: that one and those after
it are named as not compared, not failed (:func:`compared`). On the vendor that computed it, everything is. The
committed figures
(``benchmarks/results/demo_seed0``) come from the same config: **a change that moves the demo must
regenerate those results and this fingerprint (``benchmarks/demo_fingerprint.py`` without ``--check``)
in the same commit**; ``tests/test_demo_fingerprint.py`` runs ``--check`` in the normal suite and fails
otherwise. The fingerprint is machine-independent only because the kernels are pinned: it records the
machine it was computed on, and a CPU that cannot honour the pin (no AVX2) cannot check it.
Writes (``--check``: reads) ``benchmarks/results/demo_seed0/fingerprint.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
CONFIG = ROOT / "configs" / "demo.yaml"
OUT = ROOT / "benchmarks" / "results" / "demo_seed0" / "fingerprint.json"
#: Metrics that measure the machine, not the run: left out.
MACHINE_KEYS = ("time/", "memory/", "perf/", "throughput/")
#: Relative tolerance of float metrics (module docstring: CPU vendors round the backward differently).
FLOAT_RTOL = 1e-4
MACHINE_WORDS = ("seconds", "per_second", "rss", "_mb", "tokens_per_s", "bytes")  # bytes: the store keys name the run folder


def _hash(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]


def _texts(record: Any) -> list[Any]:
    """What the agents wrote in an episode (each agent's actions, in order) and what they were paid."""
    data = record.to_dict() if hasattr(record, "to_dict") else record
    agents = [a for a in [data.get("main"), *data.get("subs", [])] if a]
    return [data.get("final_answer"), data.get("rewards"),
            [[a["agent"], [t["action"] for t in a["turns"]]] for a in agents]]


def _kept(key: str, value: Any) -> bool:
    return isinstance(value, (int, float)) and not key.startswith(MACHINE_KEYS) and not any(w in key for w in MACHINE_WORDS)


def _number(value: float) -> Any:
    return repr(value) if isinstance(value, float) and not math.isfinite(value) else value


def compute(*, iterations: int, questions: int, data_dir: str | None, unpinned: bool = False, mode: str = "mgrpo",
            placement: str | None = None) -> dict[str, Any]:
    """The fingerprint (see the module docstring) of ``mode`` (its role workers in ``placement``, default the
    config's); the pin must be in force already."""
    import torch
    import transformers

    from mgrpo_algo.core.config import load_config
    from mgrpo_algo.core.kernels import check_in_force, kernel_state
    from mgrpo_algo.experiments.compare import evaluate_policies, evaluation_policies
    from mgrpo_algo.training.trainer import Trainer, mode_model_paths

    with tempfile.TemporaryDirectory() as tmp:
        overrides = [*(['kernels.pin=""'] if unpinned else []), f"mode={mode}", f"out_dir={tmp}/run", f"stages=[{{split: stage2/train, iterations: {iterations}}}]",
                     "checkpoint=false", "eval.every=0"]
        if data_dir:
            overrides.append(f"scenario_kwargs.data_dir={data_dir}")
        if placement:
            overrides.append(f"placement.kind={placement}")
        config = load_config(str(CONFIG), overrides)
        torch.set_num_threads(config.torch_threads)
        check_in_force()
        transformers.utils.logging.disable_progress_bar()  # a bar per model load would bury the verdict
        import mgrpo_scenarios

        t0 = time.perf_counter()
        scenario = mgrpo_scenarios.get(config.scenario, **config.scenario_kwargs)
        paths = mode_model_paths(config, scenario, mode)
        # the start evaluation as compare runs it (seeded with the run's seed), on the first questions
        report, records = evaluate_policies(config, scenario, evaluation_policies(config, paths, paths, config.seed),
                                            limit=questions, seed=config.seed, progress=False, name="start")
        start = [{"task": o.task_id, "correct": o.correct, "f1": o.f1, "prediction": o.prediction}
                 for o in report.outcomes]
        episodes = [{"task": r.task.get("id"), "correct": r.correct, "score": r.score,
                     "rewards": {k: _number(v) for k, v in r.rewards.items()}, "text": _hash(_texts(r))} for r in records]
        t_eval = time.perf_counter() - t0
        with Trainer(config) as trainer:
            history = trainer.run()
        train = []
        lines = [json.loads(line) for line in (Path(tmp) / "run" / "episodes.jsonl").read_text().splitlines() if line]
        for metrics in history:
            it = metrics["iteration"]
            texts = [_texts(e) for e in lines if (e.get("trajectory_key") or {}).get("iteration") == it]
            train.append({"metrics": {k: _number(v) for k, v in sorted(metrics.items()) if _kept(k, v)},
                          "episodes": len(texts), "texts": _hash(texts)})
    return {
        "config": str(CONFIG.relative_to(ROOT)), "pin": config.kernels.pin, "iterations": iterations,
        "questions": questions, "samples": config.eval.samples, "split": config.eval.split,
        "start": {"em": report.exact_match, "f1": report.f1, "outcomes": start, "episodes": episodes},
        "train": train,
        # where it was computed (not compared): the machine, the kernels in force, the versions
        "computed_on": {**kernel_state(), "mode": mode, "placement": config.placement.kind,
                        "seconds": {"start": round(t_eval, 1), "total": round(time.perf_counter() - t0, 1)}},
    }


def differences(old: Any, new: Any, where: str = "") -> list[str]:
    """Every path where ``new`` differs from ``old``: exactly, but floats within ``FLOAT_RTOL`` (NaN equal to NaN)."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for k in sorted(set(old) | set(new)) for d in differences(old.get(k), new.get(k), f"{where}.{k}")]
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [d for i, (a, b) in enumerate(zip(old, new, strict=True)) for d in differences(a, b, f"{where}[{i}]")]
    if isinstance(old, float) and isinstance(new, float) and math.isfinite(old) and math.isfinite(new):
        same = math.isclose(old, new, rel_tol=FLOAT_RTOL, abs_tol=1e-12)
    else:
        same = json.dumps(old, sort_keys=True) == json.dumps(new, sort_keys=True)
    return [] if same else [f"{where.lstrip('.')}: {old!r} -> {new!r}"]


def compared(committed: dict[str, Any], new: dict[str, Any]) -> tuple[list[str], str]:
    """The differences that count (:func:`differences`) and a line naming what was not compared ("" when all was).

    On the CPU vendor that computed ``committed``, everything counts. On another vendor, the backward rounds
    differently (module docstring): the first training iteration after iteration 0 whose drawn texts differ ends
    the comparison; the start evaluation and iteration 0 always count whole, since no update precedes them."""
    from mgrpo_algo.core.kernels import cpu_vendor

    committed_on, new_on = (cpu_vendor(f.get("computed_on", {}).get("cpu", {})) for f in (committed, new))
    old_run, new_run = ({k: v for k, v in f.items() if k != "computed_on"} for f in (committed, new))
    if committed_on == new_on:
        return differences(old_run, new_run), ""
    flipped = next((i for i, (a, b) in enumerate(zip(old_run["train"], new_run["train"], strict=False)) if i > 0
                    and a.get("texts") != b.get("texts")), None)
    if flipped is None:
        return differences(old_run, new_run), ""
    old_run["train"], new_run["train"] = old_run["train"][:flipped], new_run["train"][:flipped]
    return differences(old_run, new_run), (
        f"computed on {committed_on}, checked on {new_on}: iterations {flipped}.. not compared (a draw of iteration "
        f"{flipped} differs after the first update, which the two vendors round differently; only the start and "
        f"iterations 0..{flipped - 1} are compared)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="recompute and compare with the committed fingerprint")
    parser.add_argument("--out", default=str(OUT), help="the fingerprint's JSON (written, or read with --check)")
    parser.add_argument("--iterations", type=int, default=3, help="training iterations fingerprinted")
    parser.add_argument("--questions", type=int, default=12, help="held-out questions of the start evaluation")
    parser.add_argument("--data-dir", default=None, help="where the world is built (default: the scenario's cache)")
    parser.add_argument("--mode", default="mgrpo", help="the training mode fingerprinted (another than the committed "
                        "fingerprint's: write it with --out, to compare a change field by field)")
    parser.add_argument("--placement", default=None, help="where the role workers run (default: the config's)")
    parser.add_argument("--no-pin", action="store_true",
                        help="run on the kernels the environment gives, not the config's pin (to measure which settings "
                        "matter: set them by hand; recorded in computed_on)")
    args = parser.parse_args(argv)
    from mgrpo_algo.core.kernels import ensure_pinned, pin_of_config

    notice = None if args.no_pin else ensure_pinned(pin_of_config(str(CONFIG)), reexec=argv is None)
    if notice:
        print(notice, file=sys.stderr)
    out = Path(args.out)
    committed = json.loads(out.read_text()) if args.check else None
    iterations, questions = (committed["iterations"], committed["questions"]) if committed else (args.iterations,
                                                                                               args.questions)
    new = compute(iterations=iterations, questions=questions, data_dir=args.data_dir, unpinned=args.no_pin,
                  mode=args.mode, placement=args.placement)
    seconds = new["computed_on"]["seconds"]["total"]
    if committed is None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(new, indent=1) + "\n")
        print(f"wrote {out} ({iterations} iterations, {questions} questions x {new['samples']}; {seconds:.0f} s)")
        return 0
    if notice:
        print("fingerprint: not checked (the pin cannot be honoured on this CPU)", file=sys.stderr)
        return 2
    diff, skipped = compared(committed, new)
    if skipped:
        print(f"fingerprint: {skipped}", file=sys.stderr)
    if diff:
        print(f"fingerprint: the demo moved ({len(diff)} differences; first ones below). A change that moves the demo "
              "regenerates benchmarks/results/demo_seed0 and this fingerprint in the same commit.", file=sys.stderr)
        for line in diff[:12]:
            print(f"  {line}", file=sys.stderr)
        return 1
    where = " where compared" if skipped else ""
    print(f"fingerprint: identical{where} ({iterations} iterations, {questions} questions x {new['samples']}; "
          f"{seconds:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
