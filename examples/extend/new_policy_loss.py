"""A new policy loss, registered from outside the package: CISPO (clipped importance-sampling weights).

CISPO (MiniMax-M1, arXiv 2506.13585) keeps every token's gradient and clips the importance weight
instead of the update: ``loss_tok = -sg(min(ratio, eps_max)) * A * logp``, where ``sg`` stops the
gradient. PPO-style clipping drops the gradient of tokens whose ratio left the trust region; CISPO
bounds their weight.

A loss is one function ``fn(logp, old_logp, advantages, loss_mask, *, aggregation, sample_weight,
ref_logp, entropy, global_normalizer, **options) -> (loss, metrics)`` registered with an options
dataclass: its own keyword arguments with their defaults. The learner builds the options once from
the role's ``LearnerConfig`` (a field of the same name, else ``loss_options``; an unknown key is
refused when the config loads) and hands them to every call. ``aggregate`` (the project's one
aggregation helper) turns token losses into the loss with the full batch's normaliser, so
micro-batches sum to the batch.

This file is the whole change. It trains one short iteration of the oracle clone's tiny models
with ``main.learner.policy_loss=cispo`` and ``loss_options: {eps_max: 1.5}`` and prints the loss's
own metrics from ``metrics.jsonl``.

    python examples/extend/new_policy_loss.py [OUT_DIR]
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from mgrpo_algo.core.config import load_config
from mgrpo_algo.core.losses import aggregate, register_policy_loss
from mgrpo_algo.training.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]
#: The oracle clone's tiny models (``configs/oracle-warm-start``) on the world they were trained for
#: (the wiki-hops tiny profile): their rewards vary within a group. One short iteration.
SETTING = [*(f"{role}.model={ROOT / 'configs' / 'oracle-warm-start' / role}" for role in ("main", "sub")),
           "scenario_kwargs={num_entities: 300, seed: 0, profile: tiny, prerender: true}",
           "limits={max_main_turns: 5, max_sub_turns: 3, max_delegations: 3}",
           "questions_per_iteration=2", "group_size=4", "stages=[{split: stage2/train, iterations: 1}]"]


@dataclass(frozen=True)
class CISPOOptions:
    eps_max: float = 5.0
    """Upper clip of the importance weight (MiniMax-M1 leaves the lower side open)."""


@register_policy_loss("cispo", options=CISPOOptions, maxima=("is_weight_max",), normalised=("pg_loss",))
def cispo_loss(logp, old_logp, advantages, loss_mask, *, aggregation="seq-mean-token-mean", sample_weight=None,
               ref_logp=None, entropy=None, global_normalizer=None, eps_max: float = 5.0):
    """logp, old_logp, loss_mask: [B, T]; advantages: [B] or [B, T]. Returns (loss, metrics)."""
    adv = torch.as_tensor(advantages, device=logp.device).to(logp.dtype)
    adv = (adv[:, None] if adv.ndim == 1 else adv).expand_as(logp)
    mask = loss_mask != 0
    ratio = torch.exp(torch.where(mask, logp - old_logp.detach(), torch.zeros_like(logp)).clamp(-20, 20))
    weight = ratio.clamp(max=eps_max).detach()
    token_loss = -weight * adv * logp
    loss = aggregate(token_loss, mask, aggregation, sample_weight, global_normalizer=global_normalizer)
    with torch.no_grad():
        live = mask if bool(mask.any()) else torch.ones_like(mask)
        metrics = {
            "pg_loss": float(aggregate(token_loss.detach(), mask, aggregation, sample_weight)),
            "is_clipfrac": float(aggregate((ratio > eps_max).float(), mask, "token-mean", sample_weight)),
            "is_weight_max": float(weight[live].max()),
            "eps_max": float(eps_max),  # the option as the loss received it
        }
    return loss, metrics


def main(out: Path) -> None:
    config = load_config(None, [
        *SETTING,
        "main.learner.policy_loss=cispo", "main.learner.loss_options={eps_max: 1.5}",
        "main.learner.ppo_epochs=2",  # a second pass, where the ratio leaves 1 and the clip can act
        "questions_per_iteration=4",  # with 2, the refreshed oracle clone's 8 rollouts all paid alike: no update
        f"out_dir={out / 'run'}", f"models_dir={out / 'models'}",
    ])
    with Trainer(config) as trainer:
        trainer.run()
    metrics = json.loads((out / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    mine = {k: round(v, 4) for k, v in metrics.items() if k.startswith("main/") and
            k.split("/", 1)[1] in ("pg_loss", "is_clipfrac", "is_weight_max", "eps_max", "loss")}
    print(f"main learner with policy_loss={config.main.learner.policy_loss}: {mine}")
    assert abs(metrics["main/eps_max"] - 1.5) < 1e-9 and 0 < metrics["main/is_weight_max"] <= 1.5
    print("sub learner (the default clipped loss):", {k: round(v, 4) for k, v in metrics.items()
                                                       if k in ("sub/clipfrac", "sub/pg_loss")})


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="mgrpo-cispo-")))
