"""The committed demo still gives its committed numbers: ``benchmarks/demo_fingerprint.py --check`` recomputes
the fingerprint beside ``benchmarks/results/demo_seed0`` (the first 3 M-GRPO iterations of configs/demo.yaml
and the start evaluation of 12 held-out questions x 4, under the pinned kernels) and compares it exactly.
A change that moves the demo fails here until it regenerates the results and the fingerprint in the same
commit (the script's docstring says how). ~30 s on an idle core."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "demo_fingerprint.py"
COMMITTED = ROOT / "benchmarks" / "results" / "demo_seed0" / "fingerprint.json"
sys.path.insert(0, str(SCRIPT.parent))
from demo_fingerprint import differences  # noqa: E402


def test_the_demo_gives_its_committed_fingerprint(tmp_path):
    committed = json.loads(COMMITTED.read_text())
    assert committed["pin"] == "avx2" and committed["computed_on"]["torch_capability"] == "AVX2"
    assert len(committed["train"]) == committed["iterations"] == 3
    assert len(committed["start"]["episodes"]) == committed["questions"] * committed["samples"] == 48
    # a fresh process: the pin must be in its environment before torch loads (this one has torch already);
    # a world of its own, so the check does not lean on the user's cache
    done = subprocess.run([sys.executable, str(SCRIPT), "--check", "--data-dir", str(tmp_path / "data")], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    said = [line for line in done.stderr.splitlines() if line.startswith(("fingerprint", "  ", "mgrpo"))]
    assert done.returncode == 0, "\n".join(said) or done.stderr[-4000:]
    assert "fingerprint: identical" in done.stdout


def test_the_comparison_is_exact_but_for_float_rounding_and_names_what_moved():
    old = {"train": [{"metrics": {"main/loss": 0.5, "main/kl": float("nan"), "n": 3}, "texts": "ab"}]}
    assert differences(old, json.loads(json.dumps(old))) == []  # NaN equal to NaN, floats through JSON exactly
    # an Intel / AMD rounding (grad_norm 0.893933 -> 0.893937 measured: 4.7e-6 relative) is no change
    rounded = {"train": [{"metrics": {"main/loss": 0.5 * (1 + 9e-5), "main/kl": float("nan"), "n": 3}, "texts": "ab"}]}
    assert differences(old, rounded) == []
    moved = {"train": [{"metrics": {"main/loss": 0.5 * (1 + 1.1e-4), "main/kl": float("nan"), "n": 3}, "texts": "ab"}]}
    assert differences(old, moved) == [f"train[0].metrics.main/loss: 0.5 -> {0.5 * (1 + 1.1e-4)!r}"]
    assert differences(old, {"train": [{**old["train"][0], "texts": "ac"}]}) == ["train[0].texts: 'ab' -> 'ac'"]
    assert differences({"n": 3}, {"n": 4}) == ["n: 3 -> 4"]  # counts exactly
    assert differences({"x": float("nan")}, {"x": 0.5}) == ["x: nan -> 0.5"]
    assert differences(old, {"train": [*old["train"], old["train"][0]]}) != []  # another iteration count
    assert differences({"a": 1}, {"a": 1, "b": 2}) == ["b: None -> 2"]
