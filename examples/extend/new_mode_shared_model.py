"""The shared-model baseline, registered from outside the package: one LLM plays the main agent and
the sub-agents (the setting M-GRPO argues against: one policy for roles with different jobs).

A mode is one entry of the mode table (``mgrpo_algo.core.modes.MODES``); ``shares=(("sub", "main"),)``
says the sub-agents are played by the main agent's model. The trainer then runs one role worker
(main's): it samples every turn of both roles, scores the sub side as M-GRPO does (R_S from the main
statistics in the store, aligned to d slots, A_S pooled), and takes one learner update a step over the
main and the sub sequences together. ``mgrpo compare`` evaluates its own start and pairs it with
M-GRPO in the report. This file is the whole change.

Its start (``start=``, the owner's model, so both roles) is the fair one, ``configs/shared-warm-start``:
one model fine-tuned from the oracle clone's main model on both roles' imperfect-teacher demonstrations
with the recipe of M-GRPO's per-role start (``configs/demo-warm-start``), built by
``mgrpo warm-start --config configs/demo.yaml --from configs/oracle-warm-start --shared --out
configs/shared-warm-start``. The oracle clone's main model alone never learned the sub-agent's turns
(held-out turn exact match 0.00 as a sub-agent, against 0.97 for the shared start: its README).

It runs ``run_compare`` on mgrpo (from ``configs/demo-warm-start``) and shared-model for one short
iteration of these tiny models, evaluated on 4 held-out questions, and prints the report's table.
Importing it only registers the mode (``benchmarks/shared_model.py`` runs ``mgrpo compare`` with it).

    python examples/extend/new_mode_shared_model.py [OUT_DIR]
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from mgrpo_algo.core.config import load_config
from mgrpo_algo.core.modes import MODES, ModeSpec
from mgrpo_algo.experiments.compare import run_compare
from mgrpo_algo.experiments.report import format_table

ROOT = Path(__file__).resolve().parents[2]
FAIR_START = ROOT / "configs" / "shared-warm-start" / "main"  # one model for both roles (mgrpo warm-start --shared)
SETTING = [*(f"{role}.model={ROOT / 'configs' / 'demo-warm-start' / role}" for role in ("main", "sub")),
           "scenario_kwargs={num_entities: 300, seed: 0, profile: tiny, prerender: true}",
           "limits={max_main_turns: 5, max_sub_turns: 3, max_delegations: 3}",
           "questions_per_iteration=2", "group_size=4", "stages=[{split: stage2/train, iterations: 1}]"]

MODES.register("shared-model", ModeSpec(roles=("main", "sub"), trained=("main", "sub"), compare_to="mgrpo",
                                        shares=(("sub", "main"),), start=(("main", str(FAIR_START)),)))


def main(out: Path) -> None:
    config = load_config(None, [
        *SETTING,
        f"models_dir={out / 'models'}",
        "eval={split: stage2/test, limit: 4, samples: 1, temperature: 0.0, every: 0}",
    ])
    summary = run_compare(config, seeds=1, out_dir=out / "compare", modes=["mgrpo", "shared-model"], progress=False)
    print(format_table(summary))
    print("start models:", {name.split("@")[0]: "/".join(paths["sub"].split("/")[-2:])
                            for name, paths in summary["start_models"].items()})
    run = out / "compare" / "seed0" / "shared-model"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").open()][-1]
    learners = sorted({k.split("/")[0] for k in metrics if k.endswith("/grad_norm")})
    print("shared-model: learners", learners, "| workers", sorted(p.name for p in (run / "workers").iterdir()),
          "| samples in its one update", int(metrics["main/samples"]), "| sub scored:", "sub/reward_mean" in metrics)
    assert learners == ["main"] and "after: shared-model - mgrpo" in summary["intervals"]


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="mgrpo-shared-model-")))
