"""The learner's log-prob kernel (mgrpo_algo.learning.logits) and batching helpers
(mgrpo_algo.learning.batching) on numbers worked out by hand (issue 34: their mutation survivors).

The softmax of logits log([1, 2, 5]) is [1/8, 2/8, 5/8]: every log-prob, entropy and gradient below
is written from those three probabilities.
"""

from __future__ import annotations

import math

import pytest
import torch

from mgrpo_algo.core.sequences import TokenSequence
from mgrpo_algo.learning.batching import advantages, pack_micro_batches, scatter_columns
from mgrpo_algo.learning.logits import target_logprobs

P = [1 / 8, 2 / 8, 5 / 8]
H = -sum(p * math.log(p) for p in P)  # 0.9003...


def logits_158(rows: int = 1, requires_grad: bool = True) -> torch.Tensor:
    """[rows, 3] rows of log([1, 2, 5]) shifted by the row index (a shift leaves the softmax unchanged)."""
    base = torch.log(torch.tensor([1.0, 2.0, 5.0], dtype=torch.float64))
    out = torch.stack([base + r for r in range(rows)])
    return out.requires_grad_(requires_grad)


@pytest.mark.parametrize("entropy", [True, False])
def test_fused_log_probs_entropy_and_gradient_by_hand(entropy: bool) -> None:
    logits = logits_158(3)
    targets = torch.tensor([2, 0, 1])
    logp, ent = target_logprobs(logits, targets, entropy=entropy)
    assert torch.allclose(logp, torch.tensor([math.log(P[2]), math.log(P[0]), math.log(P[1])], dtype=torch.float64))
    if entropy:
        assert ent is not None and not ent.requires_grad  # a metric: no gradient through it
        assert torch.allclose(ent, torch.full((3,), H, dtype=torch.float64))
    else:
        assert ent is None
    weights = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    (logp * weights).sum().backward()
    # d log p_t / d z_i = [i == t] - p_i, times the row's weight
    expected = torch.tensor([[-P[0], -P[1], 1 - P[2]],
                             [-2 * (1 - P[0]), 2 * P[1], 2 * P[2]],
                             [-0.5 * P[0], 0.5 * (1 - P[1]), -0.5 * P[2]]], dtype=torch.float64)
    assert torch.allclose(logits.grad, expected)


def test_fused_kernel_on_a_batch_of_sequences_matches_autograd() -> None:
    """[B, T, V] logits with a target per position: the fused forward and backward are autograd's."""
    gen = torch.Generator().manual_seed(0)
    raw = torch.randn(2, 4, 11, generator=gen, dtype=torch.float64)
    targets = torch.randint(0, 11, (2, 4), generator=gen)
    upstream = torch.randn(2, 4, generator=gen, dtype=torch.float64)
    fused = raw.clone().requires_grad_(True)
    plain = raw.clone().requires_grad_(True)
    logp, _ = target_logprobs(fused, targets)
    (logp * upstream).sum().backward()
    reference = torch.log_softmax(plain, -1).gather(-1, targets[..., None])[..., 0]
    (reference * upstream).sum().backward()
    assert torch.allclose(logp, reference) and torch.allclose(fused.grad, plain.grad)


def test_the_fused_kernel_refuses_a_second_backward() -> None:
    """Its backward turns the kept softmax into the gradient in place: a second backward through the
    same graph fails loudly (autograd's version check) instead of reusing a wrong gradient."""
    logits = logits_158(2)
    logp, _ = target_logprobs(logits, torch.tensor([0, 2]))
    logp.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        logp.sum().backward()


def test_without_a_gradient_the_plain_path_gives_the_same_numbers() -> None:
    with torch.no_grad():
        logp, ent = target_logprobs(logits_158(2), torch.tensor([1, 2]), entropy=True)
    assert torch.allclose(logp, torch.tensor([math.log(P[1]), math.log(P[2])], dtype=torch.float64))
    assert ent is not None and torch.allclose(ent, torch.full((2,), H, dtype=torch.float64))
    assert not logp.requires_grad and not ent.requires_grad
    logp, ent = target_logprobs(logits_158(1, requires_grad=False), torch.tensor([0]))
    assert ent is None and torch.allclose(logp, torch.tensor([math.log(P[0])], dtype=torch.float64))


def test_entropy_grad_backpropagates_the_entropy() -> None:
    """dH/dz_i = -p_i (log p_i + H); the log-prob's own gradient is still onehot - p."""
    logits = logits_158(1)
    logp, ent = target_logprobs(logits, torch.tensor([1]), entropy=True, entropy_grad=True)
    assert ent is not None and ent.requires_grad and torch.allclose(ent, torch.tensor([H], dtype=torch.float64))
    assert torch.allclose(logp, torch.tensor([math.log(P[1])], dtype=torch.float64))
    ent.sum().backward()
    expected = torch.tensor([[-p * (math.log(p) + H) for p in P]], dtype=torch.float64)
    assert torch.allclose(logits.grad, expected)
    logits.grad = None
    logp, _ = target_logprobs(logits, torch.tensor([1]), entropy=True, entropy_grad=True)
    logp.sum().backward()
    assert torch.allclose(logits.grad, torch.tensor([[-P[0], 1 - P[1], -P[2]]], dtype=torch.float64))


def test_entropy_without_entropy_grad_is_a_metric_on_the_plain_path() -> None:
    """Gradients enabled but logits without grad (the plain path): the entropy carries no graph."""
    logits = logits_158(1, requires_grad=False)
    with torch.enable_grad():
        _, ent = target_logprobs(logits, torch.tensor([0]), entropy=True)
    assert ent is not None and not ent.requires_grad and torch.allclose(ent, torch.tensor([H], dtype=torch.float64))


def seq(n: int, advantage: float = 0.0, token_advantages: list[float] | None = None) -> TokenSequence:
    return TokenSequence(list(range(n)), [1] * n, advantage, token_advantages=token_advantages)


def test_micro_batches_are_packed_longest_first_under_the_budget() -> None:
    samples = [seq(n) for n in (3, 5, 2, 5, 4)]
    # longest first (ties in index order): 1, 3 (5 x 2 = 10 fits), then 4 alone would make 5 x 3 = 15:
    # a new batch headed by 4 (length 4): 4, 0 (4 x 2 = 8), 2 would make 4 x 3 = 12: a batch of its own
    assert pack_micro_batches(samples, 10) == [[1, 3], [4, 0], [2]]
    assert pack_micro_batches(samples, 9) == [[1], [3], [4, 0], [2]]  # 5 x 2 > 9; 4 x 2 = 8 fits
    assert pack_micro_batches([seq(12), seq(1)], 10) == [[0], [1]]  # over the budget: alone
    assert pack_micro_batches(samples, 100) == [[1, 3, 4, 0, 2]]
    assert pack_micro_batches([], 10) == []


def test_sample_advantages_and_per_token_ones_shifted_like_the_targets() -> None:
    plain = advantages([seq(3, 1.5), seq(2, -0.25)], 3, torch.device("cpu"))
    assert plain.dtype == torch.float32 and plain.tolist() == [1.5, -0.25]
    mixed = advantages([seq(3, 9.0, token_advantages=[1.0, 2.0, 3.0]), seq(2, 0.5)], 4, torch.device("cpu"))
    # rows [1, 2, 3, 0] and [0.5, 0.5, 0, 0] (padding 0), then position t holds token t + 1's
    assert mixed.dtype == torch.float32 and mixed.tolist() == [[2.0, 3.0, 0.0], [0.5, 0.0, 0.0]]


def test_scatter_columns_places_values_and_passes_their_gradient() -> None:
    values = torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    out = scatter_columns(values, torch.tensor([0, 2]), 4)
    assert out.tolist() == [[1.0, 0.0, 2.0, 0.0], [3.0, 0.0, 4.0, 0.0]]
    (out * torch.arange(8.0).view(2, 4)).sum().backward()
    assert values.grad.tolist() == [[0.0, 2.0], [4.0, 6.0]]


def test_advantages_are_float32_under_a_float64_default_dtype() -> None:
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        plain = advantages([seq(2, 1.0)], 2, torch.device("cpu"))
        mixed = advantages([seq(2, 1.0, token_advantages=[0.5, 0.25]), seq(2, 2.0)], 2, torch.device("cpu"))
    finally:
        torch.set_default_dtype(default)
    assert plain.dtype == mixed.dtype == torch.float32
    assert plain.tolist() == [1.0] and mixed.tolist() == [[0.25], [2.0]]
