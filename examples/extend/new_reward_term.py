"""A new reward term, registered from outside the package: the sub-agents are paid for short reports.

A term is one function of an agent's reward inputs (``mgrpo_env.rewards``: the components the env
emits at episode end: ``format_ok``, ``turns``, ``format_errors``; the root's ``correct``, ``score``,
``delegations``; a called agent's ``main_correct``, ``expert``, ``report_chars``), registered in
``mgrpo_env.rewards.REWARD_TERMS``. A run names the terms it pays per role with their weights
(``reward_terms: {sub: {brevity: 0.2}}``); the env pays ``weight x term(inputs)`` on top of the role's pay
on a well-formed trajectory, and the role's worker, which scores its own side from the main statistics
in the store, recomputes the same sum (``mgrpo_env.rewards.called_pay``). This file is the whole change.
It trains two short M-GRPO iterations with the term and checks each sub-agent's pay, in the episodes
and in its worker's kept advantages, against the formula computed here.

    python examples/extend/new_reward_term.py [OUT_DIR]
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
from pathlib import Path

from mgrpo_algo.core.config import load_config
from mgrpo_algo.training.trainer import Trainer
from mgrpo_env.rewards import REWARD_TERMS, paid_sub_reward

ROOT = Path(__file__).resolve().parents[2]
ORACLE = ROOT / "configs" / "oracle-warm-start"
WEIGHT = 0.2


def brevity(inputs: dict) -> float:
    """1 for a report of 200 characters or fewer, falling to 0 at 1,200 (a wall of text earns nothing)."""
    return min(1.0, max(0.0, (1200 - inputs["report_chars"]) / 1000))


if "brevity" not in REWARD_TERMS:  # registered once per process (a worker process imports this file too)
    REWARD_TERMS.register("brevity", brevity)


def main(out: Path) -> dict[str, float]:
    config = load_config(None, [
        *(f"{role}.model={ORACLE / role}" for role in ("main", "sub")),
        "scenario_kwargs={num_entities: 300, seed: 0, profile: tiny, prerender: true}",
        "limits={max_main_turns: 5, max_sub_turns: 3, max_delegations: 3}", "questions_per_iteration=2",
        "group_size=4", "stages=[{split: stage2/train, iterations: 2}]", f"reward_terms={{sub: {{brevity: {WEIGHT}}}}}",
        f"out_dir={out / 'run'}", f"models_dir={out / 'models'}",
    ])
    with Trainer(config) as trainer:
        history = trainer.run()
    paid, checked, moved = {}, 0, 0
    for line in (out / "run" / "episodes.jsonl").open():
        episode = json.loads(line)
        for sub in episode["subs"]:
            c = episode["components"][sub["agent"]]
            base = paid_sub_reward(c["format_ok"], c["main_correct"], c["expert"], config.sub_weights)
            want = base + (WEIGHT * brevity(c) if c["format_ok"] else 0.0)
            assert math.isclose(c["reward"], want, abs_tol=1e-12), (sub["agent"], c, want)
            paid[(episode["trajectory_key"]["iteration"], episode["trajectory_key"]["index"], sub["agent"])] = c["reward"]
            moved += want != base
            checked += 1
    kept = 0  # the sub worker scored its side itself, from the store's main statistics: the same pay
    for path in sorted((out / "run" / "workers" / "sub" / "advantages").glob("*.json")):
        for row in json.loads(path.read_text()):
            assert math.isclose(row["reward"], paid[(int(path.stem), row["index"], row["agent"])], abs_tol=1e-12)
            kept += 1
    print(f"trained {len(history)} iterations with reward_terms={{sub: {{brevity: {WEIGHT}}}}}")
    print(f"env pay = R_S + {WEIGHT} x brevity on {checked} sub-agents ({moved} paid a term); "
          f"the sub worker's {kept} kept slots carry the same pay")
    return {"checked": checked, "moved": moved, "kept": kept, "sub/reward_mean": history[-1]["sub/reward_mean"]}


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="mgrpo-new-reward-term-")))
