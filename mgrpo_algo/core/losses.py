"""The clipped policy-gradient loss of M-GRPO and the one aggregation helper behind it.

Per token, with ``ratio = exp(logp - old_logp)``::

    pg = -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A)     # clip-higher (DAPO)
    loss_tok = pg + kl_coef * k3(ref || new) - entropy_coef * entropy

and the loss is ``aggregate(loss_tok, loss_mask, aggregation, sample_weight)``. Paper defaults:
eps 0.2 / 0.28, kl_coef 0, entropy_coef 0, aggregation "seq-mean-token-mean".

Aggregations (registry :data:`AGGREGATIONS`, weights ``w_b`` default 1, ``n_b`` = masked tokens of b)::

    "seq-mean-token-mean": sum_b w_b * mean_t(x_b)  / sum_b w_b [n_b > 0]    (the paper code's choice)
    "token-mean":          sum_b w_b * sum_t(x_b)   / sum_b w_b * n_b
    "seq-mean-token-sum":  sum_b w_b * sum_t(x_b)   / sum_b w_b [n_b > 0]

A weight acts as a multiplicity (weight 2 == the sample present twice); weight 0 drops a sample (a
masked alignment slot). A sample with no masked tokens adds nothing to any numerator or denominator.

Policy losses (registry :data:`POLICY_LOSSES`, chosen by ``LearnerConfig.policy_loss``): a loss is
one function ``fn(logp, old_logp, advantages, loss_mask, *, aggregation, sample_weight, ref_logp,
entropy, global_normalizer, **options) -> (loss, metrics)`` registered with
:func:`register_policy_loss` under a name, with an options dataclass (its own keyword arguments,
filled from the role's ``LearnerConfig``: a field of the same name, or ``loss_options``) and how its
metrics merge across micro-batches (token means by default; ``maxima``; ``normalised``: aggregated
with the call's own normaliser). The learner calls it and merges what it returns; adding a loss is
that function, its options and its name (examples/extend/new_policy_loss.py).

Gradient accumulation: every numerator is a sum over samples, so for micro-batches split along the
batch axis, pass ``global_normalizer=loss_normalizer(full_mask, mode, full_weight)`` (the full batch's
denominator) to each micro-batch call: the micro-batch losses (and their gradients) then sum exactly
to the full-batch loss. Without it each call normalises by its own micro-batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

import torch
from torch import Tensor

from mgrpo_tools.registry import Registry

__all__ = [
    "AGGREGATIONS",
    "Aggregation",
    "register_aggregation",
    "get_aggregation",
    "aggregate",
    "loss_normalizer",
    "clipped_pg_loss",
    "POLICY_LOSSES",
    "PolicyLoss",
    "ClippedOptions",
    "NoOptions",
    "register_policy_loss",
    "get_policy_loss",
]

#: ``fn(values [B, T], mask [B, T] float 0/1) -> (numerator [B], denominator [B])`` per sample, unweighted.
#: The denominator must depend on the mask only (so the normaliser of a batch is known before its values).
Aggregation = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]

#: Aggregations by name (``LearnerConfig.aggregation``, checked when the config loads).
AGGREGATIONS: Registry[Aggregation] = Registry("aggregation")
register_aggregation = AGGREGATIONS.register
get_aggregation = AGGREGATIONS.get

# log-ratios beyond this are clamped before exp: avoids inf (and inf * 0 = NaN) on wild tokens.
_MAX_LOG_RATIO = 20.0


@dataclass(frozen=True)
class NoOptions:
    """The options of a loss that takes none beyond the batch's."""


@dataclass(frozen=True)
class ClippedOptions:
    """The options of :func:`clipped_pg_loss` (each a ``LearnerConfig`` field of the same name)."""

    eps_low: float = 0.2
    eps_high: float = 0.28
    kl_coef: float = 0.0
    entropy_coef: float = 0.0


@dataclass(frozen=True)
class PolicyLoss:
    """A registered policy loss, its options and how the learner merges its metrics over micro-batches.

    The learner calls ``fn(logp, old_logp, advantages, loss_mask, **batch, **options)`` where ``batch``
    is what every loss gets (``aggregation``, ``sample_weight``, ``ref_logp``, ``entropy``,
    ``global_normalizer``) and ``options`` the fields of an ``options`` dataclass instance, built once
    from the role's ``LearnerConfig`` by :meth:`make_options`.
    """

    fn: Callable[..., tuple[Tensor, dict[str, float]]]
    options: type = NoOptions
    """A dataclass whose fields are the loss's own keyword arguments, with their defaults."""
    maxima: tuple[str, ...] = ()
    """Metrics merged by max (e.g. ``ratio_max``)."""
    normalised: tuple[str, ...] = ()
    """Metrics aggregated like the loss, with the call's own normaliser: merged by normaliser share."""
    name: str = ""

    def merge_kind(self, key: str) -> str:
        """"max", "normalised" or "token-mean" (every other metric: a mean over the call's tokens)."""
        return "max" if key in self.maxima else ("normalised" if key in self.normalised else "token-mean")

    def make_options(self, config: Any, where: str = "learner") -> Any:
        """The options instance for a learner config: each field from ``config.loss_options`` if set
        there, else from the config's field of the same name (``eps_low``, ...), else its default.
        A ``loss_options`` key the loss does not take raises ValueError naming ``where.loss_options.KEY``."""
        names = [f.name for f in fields(self.options)]
        given = dict(getattr(config, "loss_options", None) or {})
        unknown = sorted(set(given) - set(names))
        if unknown:
            raise ValueError(f"config field '{where}.loss_options.{unknown[0]}': not an option of policy loss {self.name!r}; "
                             f"valid: {', '.join(names) or '(none)'}")
        values = {n: given[n] if n in given else getattr(config, n) for n in names if n in given or hasattr(config, n)}
        try:
            return self.options(**values)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"config field '{where}.loss_options': {exc}") from None


#: Policy losses by name (``LearnerConfig.policy_loss``, checked when the config loads).
POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss")


def register_policy_loss(name: str, *, options: type = NoOptions, maxima: tuple[str, ...] = (),
                         normalised: tuple[str, ...] = ()) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator adding a policy loss under ``name`` with its options dataclass; a duplicate name raises."""
    if not is_dataclass(options):
        raise TypeError(f"policy loss {name!r}: options must be a dataclass, got {options!r}")

    def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
        POLICY_LOSSES.add(name, PolicyLoss(fn, options, tuple(maxima), tuple(normalised), name))
        return fn

    return decorator


get_policy_loss = POLICY_LOSSES.get


@register_aggregation("seq-mean-token-mean")
def _seq_mean_token_mean(values: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    n = mask.sum(-1)
    return (values * mask).sum(-1) / n.clamp_min(1.0), (n > 0).to(values.dtype)


@register_aggregation("token-mean")
def _token_mean(values: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    return (values * mask).sum(-1), mask.sum(-1)


@register_aggregation("seq-mean-token-sum")
def _seq_mean_token_sum(values: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    return (values * mask).sum(-1), (mask.sum(-1) > 0).to(values.dtype)


def _prepare(values: Tensor, mask: Tensor, sample_weight: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    if values.ndim != 2 or tuple(mask.shape) != tuple(values.shape):
        raise ValueError(
            f"values and mask must both be [B, T], got {tuple(values.shape)} and {tuple(mask.shape)}"
        )
    m = (mask != 0).to(values.dtype)
    # Masked positions may hold inf/NaN (padding): replace them so that 0 * inf never happens.
    values = torch.where(m > 0, values, torch.zeros_like(values))
    if sample_weight is None:
        w = torch.ones(values.shape[0], dtype=values.dtype, device=values.device)
    else:
        w = torch.as_tensor(sample_weight, device=values.device).detach().to(values.dtype)
        if tuple(w.shape) != (values.shape[0],):
            raise ValueError(f"sample_weight must be [B] = [{values.shape[0]}], got {tuple(w.shape)}")
        if bool((w < 0).any()):
            raise ValueError("sample_weight must be >= 0")
    return values, m, w


def loss_normalizer(
    mask: Tensor, mode: str = "seq-mean-token-mean", sample_weight: Tensor | None = None
) -> Tensor:
    """The denominator ``aggregate`` uses for this batch: a 0-dim tensor.

    Shapes: mask [B, T], sample_weight [B]. Sum it over micro-batches (or compute it on the full
    batch) and pass it as ``global_normalizer`` to get the exact full-batch loss by summation.
    """
    fn = get_aggregation(mode)
    zeros = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    values, m, w = _prepare(zeros, mask, sample_weight)
    return (w * fn(values, m)[1]).sum()


def aggregate(
    values: Tensor,
    mask: Tensor,
    mode: str = "seq-mean-token-mean",
    sample_weight: Tensor | None = None,
    *,
    global_normalizer: float | Tensor | None = None,
) -> Tensor:
    """Reduce per-token values to a scalar: the one helper used for the loss and every metric.

    Args:
        values: [B, T] per-token values.
        mask: [B, T] bool / 0-1; only True positions count (others may hold anything, even inf).
        mode: a name in :data:`AGGREGATIONS`.
        sample_weight: optional [B], >= 0; a multiplicity per sample, 0 drops it.
        global_normalizer: the denominator to use instead of this batch's own (see the module doc).

    Returns:
        0-dim tensor; 0 when nothing is left to average (never NaN).
    """
    fn = get_aggregation(mode)
    values, m, w = _prepare(values, mask, sample_weight)
    num, den = fn(values, m)
    numerator = (w * num).sum()
    if global_normalizer is None:
        denominator = (w * den).sum()
    else:
        denominator = torch.as_tensor(global_normalizer, dtype=values.dtype, device=values.device).detach()
    # Dividing by a safe 1 where the denominator is 0 (then the numerator is 0 too) keeps grads finite.
    safe = torch.where(denominator > 0, denominator, torch.ones_like(denominator))
    return numerator / safe


@register_policy_loss("clipped", options=ClippedOptions, maxima=("ratio_max",), normalised=("pg_loss",))
def clipped_pg_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    aggregation: str = "seq-mean-token-mean",
    sample_weight: Tensor | None = None,
    ref_logp: Tensor | None = None,
    kl_coef: float = 0.0,
    entropy: Tensor | None = None,
    entropy_coef: float = 0.0,
    global_normalizer: float | Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Clipped (clip-higher) policy-gradient loss with optional KL-to-reference and entropy terms.

    Args:
        logp: [B, T] log-probs of the taken tokens under the current policy (carries the gradient).
        old_logp: [B, T] log-probs under the policy that sampled (detached here).
        advantages: [B] (one per sample, as in GRPO) or [B, T]; detached here.
        loss_mask: [B, T] bool / 0-1, True on sampled tokens.
        eps_low, eps_high: the clip range is [1 - eps_low, 1 + eps_high].
        aggregation: a name in :data:`AGGREGATIONS`.
        sample_weight: optional [B] >= 0; 0 drops a sample (masked alignment slot).
        ref_logp: optional [B, T] log-probs under a frozen reference; its k3 KL is logged and, when
            ``kl_coef > 0``, added to the loss.
        kl_coef: weight of the KL term (paper: 0).
        entropy: optional [B, T] per-token entropy from the caller; logged and, when
            ``entropy_coef > 0``, subtracted from the loss (keep its graph to get its gradient).
        entropy_coef: weight of the entropy bonus (paper: 0).
        global_normalizer: full-batch denominator for gradient accumulation (see the module doc).

    Returns:
        ``(loss, metrics)``: the 0-dim loss and python floats. Metrics are means over this call's
        masked tokens of samples with weight > 0 ("token-mean"), except ``pg_loss``, which is the
        policy-gradient part of the loss under ``aggregation`` with this call's own normaliser.
        ``approx_kl`` is the k3 estimate of KL(old || new): mean of ``(ratio - 1) - log ratio``.
    """
    if logp.ndim != 2 or old_logp.shape != logp.shape or tuple(loss_mask.shape) != tuple(logp.shape):
        raise ValueError(
            f"logp, old_logp and loss_mask must be [B, T] alike, got {tuple(logp.shape)}, "
            f"{tuple(old_logp.shape)}, {tuple(loss_mask.shape)}"
        )
    if not (0.0 <= eps_low < 1.0 and eps_high >= 0.0):
        raise ValueError(f"need 0 <= eps_low < 1 and eps_high >= 0, got {eps_low}, {eps_high}")
    get_aggregation(aggregation)  # fail early on a bad name
    adv = torch.as_tensor(advantages, device=logp.device).detach().to(logp.dtype)
    if adv.ndim == 1 and adv.shape[0] == logp.shape[0]:
        adv = adv[:, None]
    elif tuple(adv.shape) != tuple(logp.shape):
        raise ValueError(
            f"advantages must be [B] or [B, T] for logp {tuple(logp.shape)}, got {tuple(adv.shape)}"
        )
    adv = adv.expand_as(logp)
    mask = loss_mask != 0

    # Masked positions get log-ratio 0 so padding values can neither overflow nor leak a NaN gradient.
    log_ratio = torch.where(mask, logp - old_logp.detach(), torch.zeros_like(logp))
    ratio = torch.exp(log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))
    pg_unclipped = -adv * ratio
    pg_clipped = -adv * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    pg = torch.maximum(pg_unclipped, pg_clipped)  # -min(rho A, clip(rho) A)
    token_loss = pg

    kl = None
    if ref_logp is not None:
        if tuple(ref_logp.shape) != tuple(logp.shape):
            raise ValueError(f"ref_logp must be {tuple(logp.shape)}, got {tuple(ref_logp.shape)}")
        d = torch.where(mask, ref_logp.detach() - logp, torch.zeros_like(logp))
        d = d.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
        kl = torch.exp(d) - d - 1.0  # k3: unbiased, always >= 0
        if kl_coef > 0:
            token_loss = token_loss + kl_coef * kl
    if entropy is not None:
        if tuple(entropy.shape) != tuple(logp.shape):
            raise ValueError(f"entropy must be {tuple(logp.shape)}, got {tuple(entropy.shape)}")
        if entropy_coef > 0:
            token_loss = token_loss - entropy_coef * entropy

    loss = aggregate(token_loss, mask, aggregation, sample_weight, global_normalizer=global_normalizer)

    with torch.no_grad():

        def tok_mean(x: Tensor) -> float:
            return float(aggregate(x.detach().float(), mask, "token-mean", sample_weight))

        # Strict inequality: on the boundary both terms are equal and the gradient still flows.
        clipped_low = (pg_clipped > pg_unclipped) & (adv < 0)
        clipped_high = (pg_clipped > pg_unclipped) & (adv > 0)
        live = (
            mask
            if sample_weight is None
            else mask & (torch.as_tensor(sample_weight, device=mask.device) > 0)[:, None]
        )
        metrics = {
            "pg_loss": float(aggregate(pg.detach(), mask, aggregation, sample_weight)),
            "clipfrac": tok_mean((clipped_low | clipped_high).float()),
            "clipfrac_low": tok_mean(clipped_low.float()),
            "clipfrac_high": tok_mean(clipped_high.float()),
            "approx_kl": tok_mean((ratio - 1.0) - log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)),
            "ratio_mean": tok_mean(ratio),
            "ratio_max": float(ratio[live].max()) if bool(live.any()) else 0.0,
            "adv_mean": tok_mean(adv),
        }
        if kl is not None:
            metrics["kl_ref"] = tok_mean(kl)
        if entropy is not None:
            metrics["entropy"] = tok_mean(entropy)
    return loss, metrics
