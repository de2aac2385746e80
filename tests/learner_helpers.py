"""Helpers shared by the learner tests: per-sample lists padded into [B, T] tensors."""

from __future__ import annotations

import torch

from mgrpo_algo.core.sequences import TokenSequence
from mgrpo_algo.learning.learner import RoleLearner


def padded_logprobs(learner: RoleLearner, seqs: list[TokenSequence]) -> torch.Tensor:
    """[B, T] log-probs under the learner's current weights, right-padded with 0."""
    rows = learner.logprobs(seqs)
    length = max(len(r) for r in rows)
    return torch.tensor([r + [0.0] * (length - len(r)) for r in rows])


def padded_loss_mask(seqs: list[TokenSequence]) -> torch.Tensor:
    """[B, T] loss mask of the samples, right-padded with 0."""
    length = max(s.num_tokens for s in seqs)
    return torch.tensor([s.loss_mask + [0] * (length - s.num_tokens) for s in seqs], dtype=torch.float32)


def adamw_first_step_tolerance(grad: torch.Tensor, weight: torch.Tensor, *, lr: float, eps: float,
                               grad_atol: float, grad_rtol: float) -> torch.Tensor:
    """Per element, how far two first AdamW steps from the same weights may land apart when their
    gradients agree to ``grad_atol + grad_rtol * |grad|`` (the tolerance the caller checked them at).

    torch's AdamW, step 1 (bias-corrected, any betas): ``w1 = w0 * (1 - lr * wd) - lr * u(g)`` with
    ``u(g) = g / (|g| + eps)``. ``u`` is increasing with slope ``eps / (|g| + eps)^2``, so a gradient
    moved by at most ``d`` moves the update by at most ``lr * max(u(g + d) - u(g), u(g) - u(g - d))``:
    ~``lr * d * eps / g^2`` (nothing) where |g| >> d, but up to ``2 lr`` where |g| is itself at the rounding
    level (a gradient that is 0 in exact arithmetic: the sign of its rounding decides the step). This is
    why an AVX-512 machine, whose kernels round the gradients otherwise, failed a fixed ``atol`` on the
    weights while the gradients agreed (issue 55). On top: the float32 rounding of the step itself
    (a few ulps of the weight and of ``lr``).
    """
    g = grad.double()
    d = grad_atol + grad_rtol * g.abs()

    def u(x: torch.Tensor) -> torch.Tensor:
        return x / (x.abs() + eps)

    moved = lr * torch.maximum(u(g + d) - u(g), u(g) - u(g - d))
    ulp = torch.finfo(weight.dtype).eps
    return (moved + 4 * ulp * (weight.double().abs() + lr)).to(weight.dtype)


def record_steps(learner: RoleLearner) -> list[list[torch.Tensor]]:
    """Each optimiser step's gradients as AdamW sees them (clipped), appended as the learner steps."""
    seen: list[list[torch.Tensor]] = []
    step = learner.optimizer.step

    def recording(*args, **kwargs):
        seen.append([p.grad.detach().clone() for p in learner.params])
        return step(*args, **kwargs)

    learner.optimizer.step = recording
    return seen


def first_step_grads(learner: RoleLearner) -> list[torch.Tensor]:
    """The (clipped) gradients of a learner's first AdamW step, read back from ``exp_avg = (1 - beta1) g``."""
    beta1 = learner.optimizer.param_groups[0]["betas"][0]
    return [learner.optimizer.state[p]["exp_avg"] / (1 - beta1) for p in learner.params]


def assert_adamw_first_steps_close(learner_a: RoleLearner, learner_b: RoleLearner, grads: list[torch.Tensor], *,
                                   grad_atol: float, grad_rtol: float, grad_atol_of_max: float = 0.0) -> None:
    """The two learners' weights after one AdamW step from the same start, within
    :func:`adamw_first_step_tolerance` of the step's gradients ``grads`` (learner_a's, in ``params`` order),
    which the caller found equal to ``grad_atol + grad_atol_of_max * max|g| + grad_rtol * |g|`` per tensor."""
    names = {id(p): n for n, p in learner_a.model.named_parameters()}
    group = learner_a.optimizer.param_groups[0]
    for a, b, g in zip(learner_a.params, learner_b.params, grads, strict=True):
        tol = adamw_first_step_tolerance(g, a.detach(), lr=group["lr"], eps=group["eps"], grad_rtol=grad_rtol,
                                         grad_atol=grad_atol + grad_atol_of_max * float(g.abs().max()))
        apart = (b.detach() - a.detach()).abs()
        worst = int((apart - tol).flatten().argmax())
        assert bool((apart <= tol).all()), (
            f"{names.get(id(a))}: weights {float(apart.flatten()[worst]):.3g} apart where one step of "
            f"gradient {float(g.flatten()[worst]):.3g} allows {float(tol.flatten()[worst]):.3g}")


def adamw_steps_tolerance(steps: list[torch.Tensor], other: list[torch.Tensor], weight: torch.Tensor, *, lr: float,
                          eps: float, betas: tuple[float, float]) -> torch.Tensor:
    """Per element, how far two runs of AdamW steps (no weight decay, or the same on both) from the same
    weights may land apart, given each step's gradients in both runs (``steps``, ``other``: as AdamW saw
    them, one tensor a step).

    Step t moves a weight by ``lr * u`` with ``u = M / (V + eps)``, ``M`` the bias-corrected first moment and
    ``V`` the root of the second. Gradients apart by ``d_s`` (here ``|g - g'|`` plus float32 rounding) put
    ``M`` at most ``D_m`` apart, the same average of the ``d_s``, and ``V`` at most ``D_v``, their
    root-mean-square under the same weights (the triangle inequality of that weighted norm), so
    ``|u' - u| <= D_m / (V' + eps) + |M| D_v / ((V' + eps)(V + eps))`` with ``V' >= V - D_v``, and never more
    than ``|u| + |u'|``; the steps' differences add up. Where the gradients are well above their
    differences this is ~``2 lr d / |g|`` a step; where one is at the rounding level (``|g| <~ d``), up to
    ~``2 lr``: the sign of a rounding error decides such a step, on any CPU.
    """
    beta1, beta2 = betas
    total = torch.zeros_like(weight, dtype=torch.float64)
    m = v = dm = dv2 = torch.zeros_like(total)
    for t, (grad, grad_other) in enumerate(zip(steps, other, strict=True), start=1):
        g = grad.double()
        d = (g - grad_other.double()).abs() + 2 * torch.finfo(grad.dtype).eps * g.abs()
        m, v = beta1 * m + (1 - beta1) * g, beta2 * v + (1 - beta2) * g * g
        dm, dv2 = beta1 * dm + (1 - beta1) * d, beta2 * dv2 + (1 - beta2) * d * d
        big_m, d_m = m / (1 - beta1**t), dm / (1 - beta1**t)
        big_v, d_v = (v / (1 - beta2**t)).sqrt(), (dv2 / (1 - beta2**t)).sqrt()
        low = (big_v - d_v).clamp(min=0) + eps
        u = big_m.abs() / (big_v + eps)
        moved = d_m / low + big_m.abs() * d_v / (low * (big_v + eps))
        total += lr * torch.minimum(moved, u + (big_m.abs() + d_m) / low)
    ulp = torch.finfo(weight.dtype).eps
    return (total + 4 * len(steps) * ulp * (weight.double().abs() + lr)).to(weight.dtype)
