"""Two sections of a run's config beside the training itself: the held-out evaluation (``eval``) and the CPU
kernels (``kernels``). Importable from ``mgrpo_algo.core.config`` with the rest of the tree."""

from __future__ import annotations

from dataclasses import dataclass

from .config_types import check as _check

__all__ = ["EvalConfig", "KernelsConfig"]


@dataclass
class EvalConfig:
    """Held-out evaluation of a training run (``mgrpo compare``: before and after training, and curves).

    Training accuracy is measured on the questions being trained on; held-out questions tell whether
    what was learned carries over.
    """

    split: str = "stage2/test"
    """Held-out split evaluated (the paper's stage-2 multi-hop questions, test part)."""
    limit: int = 100
    """Questions evaluated (the split's first ones, a fixed set); 0 = all of them. More questions
    narrow the error bar (binomial: ~5 points at 100 questions) at linear cost."""
    samples: int = 1
    """Rollouts per question; EM and F1 average over all of them. > 1 only helps with temperature > 0."""
    temperature: float = 0.0
    """Sampling temperature of the evaluated policies; 0 = greedy (deterministic). With ``samples`` k
    > 1 at the rollouts' temperature the headline is mean@k (DeepSeek-R1's and DAPO's report): far
    less noisy per question than one greedy answer, and it measures the policy RL trains."""
    greedy: bool = True
    """With ``temperature`` > 0, also evaluate greedily (one sample per question) and report greedy EM
    beside mean@k. Costs one more pass of ``limit`` episodes per evaluation."""
    max_new_tokens: int = 0
    """Tokens per turn at most; 0 = each role's ``generation.max_new_tokens``."""
    every: int = 0
    """Evaluate held-out accuracy every N training iterations on ``curve_limit`` questions (a learning
    curve); 0 = only before and after training. Each point costs one evaluation."""
    curve_limit: int = 32
    """Questions per curve point (``every`` > 0): fewer than ``limit`` to keep curves cheap."""
    reference: str = ""
    """A hierarchy start to evaluate beside the runs (a folder with ``main/`` and ``sub/``, e.g.
    ``configs/oracle-warm-start``, the oracle clone): compare reports M-GRPO after RL minus it. "" = none.
    Costs one more sampled evaluation (no greedy pass)."""

    def __post_init__(self) -> None:
        _check(isinstance(self.split, str) and bool(self.split), "eval.split", f"must name a split, got {self.split!r}")
        for name, low in (("limit", 0), ("samples", 1), ("max_new_tokens", 0), ("every", 0), ("curve_limit", 1)):
            value = getattr(self, name)
            _check(isinstance(value, int) and not isinstance(value, bool) and value >= low, f"eval.{name}",
                   f"must be an integer >= {low}, got {value!r}")
        _check(isinstance(self.temperature, (int, float)) and self.temperature >= 0, "eval.temperature",
               f"must be >= 0, got {self.temperature!r}")
        self.temperature = float(self.temperature)


@dataclass
class KernelsConfig:
    """Which CPU kernels torch runs (:mod:`mgrpo_algo.core.kernels`): the same figures on one vendor's x86 machines.

    Applied by ``mgrpo train`` / ``compare`` / ``eval`` before torch loads, in every process of the run."""

    pin: str = ""
    """"" (default): torch's fastest kernels for this CPU (AVX-512 where it has it), whose float rounding
    differs from an AVX2-only machine's, so a sampled run's figures differ between the two (a flipped
    draw at temperature 1 that RL carries). "avx2": ATen's and MKL's kernels capped to AVX2
    (``ATEN_CPU_CAPABILITY=avx2``, ``MKL_CBWR=AVX2``: the smallest set measured to give, on an AVX-512
    machine, the AVX2-only machine's figures), the same rounding on one vendor's x86 machines with AVX2 (an
    Intel Xeon and an AMD EPYC Zen 4 still round the backward apart, docs/guides/training.md): on in
    configs/demo.yaml, whose figures are committed. Costs speed on an AVX-512 machine (the demo: ~2% per
    iteration, benchmarks/results/kernel_pin.json; more where large matrix products dominate). A CPU
    without AVX2 (or not x86) runs unpinned with a one-line notice that its figures may differ."""

    def __post_init__(self) -> None:
        from .kernels import PINS

        _check(self.pin == "" or self.pin in PINS, "kernels.pin", f"must be one of {sorted(PINS)} or \"\", got {self.pin!r}")
