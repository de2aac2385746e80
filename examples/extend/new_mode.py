"""A new training mode, registered from outside the package: frozen-main (only the sub-agents learn).

A mode is one entry of the mode table (``mgrpo_algo.core.modes.MODES``): the roles it runs, the
roles whose learner updates, its env, and the mode the report compares it against. Registered, its
name is a valid ``mode`` (checked when the config loads) and a valid ``mgrpo compare --modes``
entry; the trainer, the role workers, the start models ``compare`` resolves for it and the report's
paired differences all read the table.

frozen-main is the mirror of the paper's frozen-sub baseline: the main agent keeps its start and only
the sub-agents train, which isolates what sub-agent training alone buys. This file is the whole
change. It runs ``run_compare`` (what ``mgrpo compare`` runs) on mgrpo and frozen-main for one short
iteration of the oracle clone's tiny models, evaluated on 4 held-out questions, and prints the
report's table and the paired difference the new entry adds.

    python examples/extend/new_mode.py [OUT_DIR]
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
#: The oracle clone's tiny models (``configs/oracle-warm-start``) on the world they were trained for
#: (the wiki-hops tiny profile): their rewards vary within a group. One short iteration.
SETTING = [*(f"{role}.model={ROOT / 'configs' / 'oracle-warm-start' / role}" for role in ("main", "sub")),
           "scenario_kwargs={num_entities: 300, seed: 0, profile: tiny, prerender: true}",
           "limits={max_main_turns: 5, max_sub_turns: 3, max_delegations: 3}",
           "questions_per_iteration=2", "group_size=4", "stages=[{split: stage2/train, iterations: 1}]"]

MODES.register("frozen-main", ModeSpec(roles=("main", "sub"), trained=("sub",), compare_to="mgrpo"))


def main(out: Path) -> None:
    config = load_config(None, [
        *SETTING,
        f"models_dir={out / 'models'}",
        "eval={split: stage2/test, limit: 4, samples: 1, temperature: 0.0, every: 0}",
    ])
    summary = run_compare(config, seeds=1, out_dir=out / "compare", modes=["mgrpo", "frozen-main"], progress=False)
    print(format_table(summary))
    print("modes:", summary["modes"], "| paired differences:", sorted(summary["intervals"]))
    frozen = [json.loads(line) for line in (out / "compare" / "seed0" / "frozen-main" / "metrics.jsonl").open()]
    learned = sorted({k.split("/")[0] for k in frozen[-1] if k.endswith("/grad_norm")})
    print("frozen-main: roles whose learner stepped:", learned)
    assert learned == ["sub"] and "after: frozen-main - mgrpo" in summary["intervals"]


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="mgrpo-frozen-main-")))
