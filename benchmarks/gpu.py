"""GPU figures for one CUDA machine, no downloads, under 8 minutes on one H100/H200-class GPU.

    .venv/bin/python benchmarks/gpu.py [--quick] [--device cuda]

1. Learner: a ~0.5B Qwen2-architecture model built locally (Qwen2-0.5B's shape: hidden 896, 24
   layers, 14 heads / 2 KV heads, MLP 4864, vocabulary 151,936; random weights) updated by
   ``RoleLearner`` with bf16 autocast (fp32 parameters and AdamW) and gradient checkpointing, full
   fine-tuning and LoRA rank 32: median seconds per update, tokens/s and MFU.
   MFU = 6 * N * tokens / seconds / peak bf16 dense FLOP/s: "model FLOPs" (forward + backward; the
   forward that gradient checkpointing recomputes and attention's own FLOPs are not counted), peak
   from ``--peak-tflops`` or the GPU name (H100/H200 989, A100 312, L40S 362, else 100). N counts
   every matmul parameter (embedding lookup excluded, tied LM head included).
2. Generation: transformers ``generate`` (bf16, KV cache, sampling) of 16 prompts x 128 new tokens
   on the GPU: new tokens/s.
3. One full M-GRPO iteration, both roles (main and sub learners and policies) on the GPU, with
   tiny role models built from the scenario's corpus (B=4 questions, K=4 rollouts), bf16 autocast:
   the iteration's time split (generation, tools, scoring, update).

Prints a table and writes benchmarks/results/gpu.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).parent))
from common import report  # noqa: E402

from mgrpo_algo.core.config import LearnerConfig, load_config  # noqa: E402
from mgrpo_algo.core.sequences import TokenSequence  # noqa: E402
from mgrpo_algo.learning.learner import RoleLearner  # noqa: E402

QWEN2_05B = {
    "vocab_size": 151936, "hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
    "num_key_value_heads": 2, "intermediate_size": 4864, "tie_word_embeddings": True,
    "max_position_embeddings": 32768, "rope_theta": 1000000.0,
}
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0, "L4": 121.0}


def build_model(device: str, layers: int | None = None) -> transformers.PreTrainedModel:
    cfg = dict(QWEN2_05B)
    if layers:
        cfg["num_hidden_layers"] = layers
    config = transformers.Qwen2Config(**cfg)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        return transformers.Qwen2ForCausalLM(config)


def matmul_params(model: torch.nn.Module) -> int:
    """Parameters that take part in matmuls: all but the input embedding lookup; a tied LM head is a
    matmul with the embedding matrix, so with tied weights every parameter counts."""
    total = sum(p.numel() for p in model.parameters())  # a tied matrix is counted once
    return total if model.config.tie_word_embeddings else total - model.get_input_embeddings().weight.numel()


def batch(n: int, length: int, sampled: int, vocab: int) -> list[TokenSequence]:
    g = torch.Generator().manual_seed(length)
    out = []
    for i in range(n):
        ids = torch.randint(0, vocab, (length,), generator=g).tolist()
        out.append(TokenSequence(ids, [0] * (length - sampled) + [1] * sampled, advantage=1.0 if i % 2 else -1.0))
    return out


def peak_tflops(arg: float | None) -> float:
    if arg:
        return arg
    name = torch.cuda.get_device_name()
    return next((v for k, v in PEAK_TFLOPS.items() if k in name), 100.0)


def learner_rows(args: argparse.Namespace, peak: float) -> list[tuple[str, object, str]]:
    rows: list[tuple[str, object, str]] = []
    n, length = (8, 1024) if args.quick else (16, 2048)
    seqs = batch(n, length, length // 4, QWEN2_05B["vocab_size"])
    tokens = sum(s.num_tokens for s in seqs)
    for label, extra in (("full", {}), ("lora r32", {"lora_rank": 32, "lora_alpha": 64.0, "lr": 1e-5})):
        model = build_model(args.device, layers=4 if args.quick else None)
        n_params = matmul_params(model)
        config = LearnerConfig(
            **{"lr": 1e-6, "device": args.device, "autocast_dtype": "bfloat16", "gradient_checkpointing": True,
               "micro_batch_tokens": 16384, **extra}
        )
        learner = RoleLearner("main", model, config)
        learner.update(seqs)  # warm-up (allocator, kernels)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(2 if args.quick else 3):
            t0 = time.perf_counter()
            metrics = learner.update(seqs)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        seconds = statistics.median(times)
        mfu = 6 * n_params * tokens / seconds / (peak * 1e12)
        rows += [
            (f"learner {label}: update ({n} x {length} tok)", seconds, f"s, {n_params / 1e6:,.0f}M matmul params"),
            (f"learner {label}: tokens/s", tokens / seconds, "tokens/s (bf16 autocast, checkpointing)"),
            (f"learner {label}: MFU", 100 * mfu, f"% of {peak:.0f} TFLOP/s (6N per token)"),
            (f"learner {label}: peak memory", torch.cuda.max_memory_allocated() / 2**30, "GiB"),
            (f"learner {label}: grad_norm finite", bool(metrics["main/nonfinite_steps"] == 0), ""),
        ]
        del learner, model
        torch.cuda.empty_cache()
    return rows


def generation_rows(args: argparse.Namespace) -> list[tuple[str, object, str]]:
    model = build_model(args.device, layers=4 if args.quick else None).to(torch.bfloat16).eval()
    prompts, prompt_len, new = 16, 256, 64 if args.quick else 128
    ids = torch.randint(0, QWEN2_05B["vocab_size"], (prompts, prompt_len), device=args.device)

    def run(model: torch.nn.Module) -> int:
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                                 min_new_tokens=new, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                 pad_token_id=0)
        torch.cuda.synchronize()
        return int(out.shape[1] - prompt_len) * prompts

    run(model)
    t0 = time.perf_counter()
    produced = run(model)
    seconds = time.perf_counter() - t0
    del model
    torch.cuda.empty_cache()
    return [(f"generate {prompts} x {new} new tok (prompt {prompt_len})", seconds, "s"),
            ("generate tokens/s", produced / seconds, "new tokens/s (bf16, transformers, KV cache)")]


def iteration_rows(args: argparse.Namespace) -> list[tuple[str, object, str]]:
    from mgrpo_algo.training.trainer import Trainer

    with tempfile.TemporaryDirectory() as tmp:
        role = [f"{r}.learner.{k}={v}" for r in ("main", "sub")
                for k, v in (("device", args.device), ("autocast_dtype", "bfloat16"))]
        cfg = load_config(None, [
            f"out_dir={tmp}/run", f"models_dir={tmp}/models", "warm_start.epochs=0", "checkpoint=false",
            f"scenario_kwargs={{num_entities: 300, data_dir: {tmp}/data}}",
            "stages=[{split: stage2/train, iterations: 2}]", "questions_per_iteration=4", "group_size=4",
            "torch_threads=4", *role,
        ])
        t0 = time.perf_counter()
        history = Trainer(cfg).run()
        total = time.perf_counter() - t0
    last = history[-1]
    rows: list[tuple[str, object, str]] = [("M-GRPO 2 iterations incl. setup", total, "s (both roles on GPU)")]
    for key in ("time/generation", "time/tools", "time/env_steps", "time/scoring", "time/update", "time/iteration"):
        if key in last:
            rows.append((f"M-GRPO iteration {key[5:]}", float(last[key]), "s (second iteration)"))
    for key in ("main/loss", "sub/loss"):
        if key in last:
            rows.append((f"M-GRPO {key}", float(last[key]), "finite" if last[key] == last[key] else "NaN"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="4-layer model and small batches (a smoke run)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--peak-tflops", type=float, default=None)
    parser.add_argument("--skip", nargs="*", default=[], choices=["learner", "generation", "iteration"])
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("benchmarks/gpu.py needs a CUDA device")
    transformers.utils.logging.disable_progress_bar()
    torch.backends.cuda.matmul.allow_tf32 = True
    peak = peak_tflops(args.peak_tflops)
    start = time.perf_counter()
    rows: list[tuple[str, object, str]] = [("device", torch.cuda.get_device_name(), f"torch {torch.__version__}")]
    for name, fn in (("learner", lambda: learner_rows(args, peak)), ("generation", lambda: generation_rows(args)),
                     ("iteration", lambda: iteration_rows(args))):
        if name in args.skip:
            continue
        t0 = time.perf_counter()
        rows += fn()
        print(f"[gpu.py] {name} done in {time.perf_counter() - t0:.1f} s", flush=True)
    rows.append(("total wall time", time.perf_counter() - start, "s"))
    report("gpu" + ("-quick" if args.quick else ""), rows)


if __name__ == "__main__":
    main()
