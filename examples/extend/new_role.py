"""A new role, registered from outside the package: a reader sub-agent with its own model and learner.

A role is one spec (``mgrpo_env.roles.RoleSpec``): the env it acts in, its prompt words and final
tag, its default tools, the main-agent tool that calls it, its turn budget and its reward.
Registered with ``register_role``, the episode core starts an agent of it when the main agent calls
that tool (and pays it by its reward), the prompts, the action spaces and the protocol read it, the
run config takes its section under ``roles:`` (model, generation, learner), and a mode that lists
it gives it a role worker of its own: its own policy and learner, which scores its own side from the
main statistics in the store (R_S by the spec's reward), aligns it and computes its own
group-relative advantages (A_S over its own agents only), as M-GRPO does for the sub-agents.

The reader here shares the main agent's ``delegate`` tool with the sub-agents: it takes the main
agent's odd-numbered delegations of an episode (``takes``), the sub-agents the others, so the oracle
clone's main agent, which delegates one hop at a time, calls both. It starts from a model of its own
that the role brings itself (``RoleSpec.start_model``: a copy of the run's sub-agent start model, made in a
folder of its own) and holds only ``visit`` and ``search``.
A role called by a tool of its own gives ``called_by`` and ``call_tool`` (a ``ToolSpec``) instead;
``tests/test_new_role.py`` steps such a verifier by hand. This file is the whole change. It trains
two short iterations of M-GRPO with the three roles and prints what the reader's worker learned.

With ``--without-sub`` it trains a mode of the main agent and the reader alone, no sub-agent (the
reader, alone on ``delegate``, takes every call): two iterations with the role workers in this process
and two in processes of their own, which must give the same numbers, then a held-out evaluation of
the models it ended with.

    python examples/extend/new_role.py [OUT_DIR] [--without-sub]
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

from mgrpo_algo.core.config import load_config
from mgrpo_algo.core.modes import MODES, ModeSpec
from mgrpo_algo.training.trainer import Trainer
from mgrpo_env.roles import ROLE_TABLE, RoleSpec, register_role

ROOT = Path(__file__).resolve().parents[2]
ORACLE = ROOT / "configs" / "oracle-warm-start"
#: The oracle clone's tiny models on the world they were trained for (the wiki-hops tiny profile):
#: their rewards vary within a group. Two short iterations.
SETTING = [*(f"{role}.model={ORACLE / role}" for role in ("main", "sub")),
           "scenario_kwargs={num_entities: 300, seed: 0, profile: tiny, prerender: true}",
           "limits={max_main_turns: 5, max_sub_turns: 3, max_delegations: 3}",
           "questions_per_iteration=2", "group_size=4", "stages=[{split: stage2/train, iterations: 2}]"]

def reader_start(built: dict, folder: str) -> str:
    """The reader's start model: a copy of the run's sub-agent start model (made once, then reused)."""
    if not Path(folder).exists():
        shutil.copytree(built["sub"], folder)
    return folder


READER = RoleSpec(
    env="hierarchy", final_tag="result", sample_seed=2, eval_seed=3,
    intro=("You are a reader of a research team. Read the pages the subtask needs, then report the "
           "facts found to the main agent."),
    compact_intro="Sub-agent.",  # the oracle sub-agent's words: the reader starts from its model
    final_text="<result>your report: the facts found, with their sources</result>",
    tools=("search", "visit"), called_by="delegate", takes=lambda n, arguments: n % 2 == 1, max_turns=3,
    start_model=reader_start,
)
#: How the reader scores its own side (the config's ``roles.reader.called``): the paper's R_S weights, its
#: expert score ungated, A_S pooled per query over its own aligned slots (the sub-agents' defaults, said here).
CALLED = "{weights: [0.1, 0.4, 0.5], format_gate: false, estimator: grpo_pooled_masked, outcome_groups: query}"
if "reader" not in ROLE_TABLE:  # registered once per process (the test imports this file)
    register_role("reader", READER)
    MODES.register("mgrpo-reader", ModeSpec(roles=("main", "sub", "reader"), trained=("main", "sub", "reader")))
    MODES.register("main-reader", ModeSpec(roles=("main", "reader"), trained=("main", "reader")))


def main(out: Path) -> dict[str, float]:
    config = load_config(None, [  # no roles.reader.model: the role brings its start (reader_start)
        *SETTING, "mode=mgrpo-reader", f"roles={{reader: {{learner: {{lr: 1.0e-4}}, called: {CALLED}}}}}",
        f"out_dir={out / 'run'}", f"models_dir={out / 'models'}",
    ])
    with Trainer(config) as trainer:
        history = trainer.run()
    episodes = [json.loads(line) for line in (out / "run" / "episodes.jsonl").open()]
    agents = sorted({s["agent"].rsplit("_", 1)[0] for e in episodes for s in e["subs"]})
    last = history[-1]
    # a learner that moved its weights: a gradient step of nonzero norm in some iteration
    stepped = sorted({k.split("/")[0] for m in history for k, v in m.items() if k.endswith("/grad_norm") and v > 0})
    folder = out / "run" / "workers" / "reader" / "advantages"
    kept = {int(p.stem): json.loads(p.read_text()) for p in folder.glob("*.json")}
    print(f"trained {len(history)} iteration(s) of mode mgrpo-reader; called agents: {agents}")
    print("roles whose learner stepped:", stepped)
    assert stepped == ["main", "reader", "sub"] and agents == ["reader", "sub"]
    print("reader metrics:", {k: round(v, 3) for k, v in sorted(last.items())
                              if k.startswith("reader/") and not k.endswith(("_s", "bytes_written", "bytes_read"))})
    print("reader advantages kept per iteration:", {t: len(rows) for t, rows in sorted(kept.items())},
          "agents:", sorted({row["agent"] for rows in kept.values() for row in rows}))
    return last


def without_sub(out: Path) -> dict[str, float]:
    """The main agent and the reader, no sub-agent: trained in both placements (the same numbers), then evaluated."""
    import mgrpo_scenarios
    from mgrpo_algo.experiments.units import evaluate_policies, evaluation_policies

    runs = {}
    for placement in ("local", "processes"):
        config = load_config(None, [
            *SETTING, "mode=main-reader", f"roles={{reader: {{called: {CALLED}}}}}", f"placement.kind={placement}",
            f"out_dir={out / placement}", f"models_dir={out / 'models'}", "eval.samples=2",
        ])
        with Trainer(config) as trainer:
            runs[placement] = trainer.run()
    keep = ("reward_mean", "adv_mean", "grad_norm", "loss")
    figures = [{k: v for k, v in m.items() if k.startswith(("main/", "reader/")) and k.endswith(keep)}
               for m in runs["local"]]
    assert figures == [{k: m[k] for k in f} for f, m in zip(figures, runs["processes"], strict=True)]
    episodes = [json.loads(line) for line in (out / "local" / "episodes.jsonl").open()]
    agents = sorted({s["agent"].rsplit("_", 1)[0] for e in episodes for s in e["subs"]})
    stepped = sorted({k.split("/")[0] for m in runs["local"] for k, v in m.items() if k.endswith("/grad_norm") and v > 0})
    print(f"trained {len(runs['local'])} iteration(s) of mode main-reader; called agents: {agents}; "
          f"roles whose learner stepped: {stepped}; local and processes placements: the same numbers")
    final = {role: str(out / "local" / "final" / role) for role in ("main", "reader")}
    scenario = mgrpo_scenarios.get(config.scenario, **config.scenario_kwargs)
    report, records = evaluate_policies(config, scenario, evaluation_policies(config, final, final, config.seed),
                                        limit=2, seed=config.seed, progress=False, name="main-reader")
    called = sorted({s.role for r in records for s in r.subs})
    print(f"evaluated {len(records)} held-out episodes (2 questions x {config.eval.samples}): "
          f"EM {report.exact_match:.3f}, called roles {called}")
    return {**figures[-1], "eval/em": report.exact_match}


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--without-sub"]
    out = Path(args[0]) if args else Path(tempfile.mkdtemp(prefix="mgrpo-new-role-"))
    without_sub(out) if "--without-sub" in sys.argv[1:] else main(out)
