"""``benchmarks/bench.py --quick`` runs every benchmark and writes the combined results file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_bench_quick_writes_results() -> None:
    proc = subprocess.run([sys.executable, "benchmarks/bench.py", "--quick"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    payload = json.loads((ROOT / "benchmarks" / "results" / "quick" / "bench.json").read_text())
    assert payload["benchmark"] == "bench" and payload["quick"] is True
    expected = {"world_and_tools", "env_throughput", "learner", "decoupled", "vs_trl", "rollout_vs_generate", "scaling",
                "kv_reuse", "demo_iteration", "generation", "live_decode", "fit_train"}
    assert set(payload["benchmarks"]) == expected
    assert all(run["ok"] for run in payload["benchmarks"].values())
    figures = payload["figures"]
    for key in ("rollout_vs_generate: ratio rollout/raw tokens/s", "rollout_vs_generate: share of rollout time outside the model",
                "scaling: exponent time ~ K^a", "scaling: exponent time ~ d^a", "vs_trl: ours update tokens/s",
                "live_decode: live / pure, after", "live_decode: update floor, rollouts/min"):
        assert key in figures, key
    try:
        import trl  # noqa: F401
    except ImportError:
        assert figures["vs_trl: trl"]["value"] == "skipped"
    else:
        assert "vs_trl: ratio trl/ours update" in figures
