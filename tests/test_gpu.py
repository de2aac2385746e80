"""CUDA-only checks (``pytest -m gpu``; deselected by default, skipped without a CUDA device):
bf16 / fp16 autocast and LoRA learners train on the GPU, and benchmarks/gpu.py runs its quick mode."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mgrpo_algo.core.config import LearnerConfig
from mgrpo_algo.core.sequences import TokenSequence
from mgrpo_algo.learning.learner import RoleLearner

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=512, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, intermediate_size=256, tie_word_embeddings=True))


def _batch(n=8, length=64):
    g = torch.Generator().manual_seed(0)
    return [TokenSequence(torch.randint(0, 512, (length,), generator=g).tolist(), [0] * 8 + [1] * (length - 8),
                          advantage=1.0 if i % 2 else -1.0) for i in range(n)]


@pytest.mark.parametrize("autocast", ["bfloat16", "float16"])
@pytest.mark.parametrize("lora_rank", [0, 8])
def test_cuda_learner_updates_with_autocast(autocast, lora_rank, tmp_path):
    if lora_rank:
        pytest.importorskip("peft")
    config = LearnerConfig(lr=1e-3, device="cuda", autocast_dtype=autocast, lora_rank=lora_rank,
                           gradient_checkpointing=True)
    learner = RoleLearner("main", _model(), config)
    seqs = _batch()
    before = torch.tensor(learner.logprobs(seqs)[0])
    for _ in range(2):
        metrics = learner.update(seqs)
    assert metrics["main/nonfinite_steps"] == 0 and metrics["main/grad_norm"] > 0
    assert not torch.equal(before, torch.tensor(learner.logprobs(seqs)[0]))
    assert (learner.scaler is not None) == (autocast == "float16")
    loaded = RoleLearner.load(learner.save(tmp_path / "ckpt"))
    assert loaded.step == 2 and next(loaded.model.parameters()).is_cuda


def test_gpu_benchmark_quick_runs():
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, str(root / "benchmarks" / "gpu.py"), "--quick"], cwd=root,
                         capture_output=True, text=True, timeout=480)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "learner full: MFU" in out.stdout and "M-GRPO iteration update" in out.stdout


def test_sampler_reads_the_last_cpu_tokens_against_cuda_logprobs():
    # generate() hands the sequences back on the CPU while the recorded log-probs live on the GPU
    from mgrpo_algo.policies.hf_policy import _Sampler

    sampler = _Sampler(1.0, 1.0, "processed")
    scores = torch.randn(2, 10, device="cuda")
    sampler(torch.zeros(2, 1, dtype=torch.long, device="cuda"), scores)
    logprobs = sampler.finish(torch.tensor([[3], [4]]))
    expected = torch.log_softmax(scores.float(), dim=-1).cpu()
    assert logprobs.shape == (2, 1) and torch.allclose(logprobs[:, 0], torch.stack([expected[0, 3], expected[1, 4]]))
