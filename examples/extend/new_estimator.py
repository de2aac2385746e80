"""A new advantage estimator, registered from outside the package: RLOO (leave-one-out baseline).

RLOO (Ahmadian et al. 2024, arXiv 2402.14740) scores each rollout against the mean of the *other*
rollouts of its group: ``A_i = R_i - mean_{j != i} R_j = K / (K - 1) * (R_i - mean)``, no division
by the std. An estimator takes the one shape every estimator takes (``mgrpo_algo.core.advantages``):
rewards ``[Q, ...]`` (a group per query: the main side's ``[Q, K]`` rollouts, the sub side's aligned
``[Q, K, d]`` slots), an optional mask of the same shape, and returns float32 advantages of that shape.

This file is the whole change: the function, one ``register_estimator`` line, and the config fields
that name it (``main_estimator`` / ``sub_estimator``, checked when the config loads). It trains one
short iteration of the oracle clone's tiny models with RLOO on both sides and checks, from ``episodes.jsonl``, that every main agent's
advantage is RLOO's of its group's rewards.

    python examples/extend/new_estimator.py [OUT_DIR]
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch

from mgrpo_algo.core.advantages import register_estimator
from mgrpo_algo.core.config import load_config
from mgrpo_algo.training.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]
#: The oracle clone's tiny models (``configs/oracle-warm-start``) on the world they were trained for
#: (the wiki-hops tiny profile): their rewards vary within a group. One short iteration.
SETTING = [*(f"{role}.model={ROOT / 'configs' / 'oracle-warm-start' / role}" for role in ("main", "sub")),
           "scenario_kwargs={num_entities: 300, seed: 0, profile: tiny, prerender: true}",
           "limits={max_main_turns: 5, max_sub_turns: 3, max_delegations: 3}",
           "questions_per_iteration=2", "group_size=4", "stages=[{split: stage2/train, iterations: 1}]"]


@register_estimator("rloo")
def rloo(rewards, mask=None, *, eps: float = 1e-6) -> torch.Tensor:
    """Leave-one-out advantages per group (the first axis is the query); masked entries get 0 and
    are left out of the baseline. A group with one present entry has no baseline: 0."""
    r = torch.as_tensor(rewards, dtype=torch.float64)
    m = torch.ones_like(r, dtype=torch.bool) if mask is None else torch.as_tensor(mask).bool()
    r = torch.where(m, r, torch.zeros_like(r))
    dims = tuple(range(1, r.ndim))
    n = m.sum(dim=dims, keepdim=True).to(r.dtype)
    total = r.sum(dim=dims, keepdim=True)
    baseline = (total - r) / (n - 1).clamp_min(1.0)  # the mean of the others
    adv = torch.where(m & (n > 1), r - baseline, torch.zeros_like(r))
    return adv.to(torch.float32)


def main(out: Path) -> None:
    config = load_config(None, [
        *SETTING,
        "main_estimator=rloo", "sub_estimator=rloo",  # the new name, checked when the config loads
        f"out_dir={out / 'run'}", f"models_dir={out / 'models'}",
    ])
    with Trainer(config) as trainer:
        history = trainer.run()
    print(f"trained {len(history)} iteration(s) with main_estimator={config.main_estimator}")
    records = [json.loads(line) for line in (out / "run" / "episodes.jsonl").read_text().splitlines()]
    k = config.group_size
    matched = 0
    for q in range(0, len(records), k):  # records are task-major: K rollouts of one question in a row
        group = records[q:q + k]
        rewards = [r["rewards"]["main_0"] for r in group]
        want = rloo([rewards])[0].tolist()
        got = [r["components"]["main_0"]["advantage"] for r in group]
        assert all(abs(a - b) < 1e-6 for a, b in zip(got, want, strict=True)), (rewards, got, want)
        matched += len(group)
        print(f"question {q // k}: rewards {[round(x, 3) for x in rewards]} -> RLOO advantages {[round(a, 3) for a in got]}")
    print(f"RLOO advantages of all {matched} main-agent rollouts match")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="mgrpo-rloo-")))
