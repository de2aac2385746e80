"""The committed demo still gives its committed numbers: ``benchmarks/demo_fingerprint.py --check`` recomputes
the fingerprint beside ``benchmarks/results/demo_seed0`` (the first 3 M-GRPO iterations of configs/demo.yaml
and the start evaluation of 12 held-out questions x 4, under the pinned kernels) and compares it exactly
(on a CPU of another vendor: up to the first draw its rounding flips, ``compared``).
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
from demo_fingerprint import compared, differences  # noqa: E402


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


def _fingerprint(vendor: str, texts: list[str], losses: list[float]) -> dict:
    return {"start": {"em": 0.25, "episodes": [{"text": "s0"}]},
            "train": [{"metrics": {"sub/loss": loss}, "texts": text} for text, loss in zip(texts, losses, strict=True)],
            "computed_on": {"cpu": {"model": "whatever", "vendor": vendor}}}


def test_another_vendor_compares_up_to_the_first_draw_its_rounding_flips():
    intel = _fingerprint("GenuineIntel", ["a", "b", "c"], [0.5, 0.4, 0.3])
    # the same vendor: every iteration counts
    same = _fingerprint("GenuineIntel", ["a", "B", "C"], [0.5, 0.41, 0.3])
    diff, skipped = compared(intel, same)
    assert skipped == "" and diff == ["train[1].metrics.sub/loss: 0.4 -> 0.41", "train[1].texts: 'b' -> 'B'",
                                      "train[2].texts: 'c' -> 'C'"]
    # another vendor, iteration 1's draw flipped: iterations 1.. named as not compared, nothing fails
    amd = _fingerprint("AuthenticAMD", ["a", "B", "C"], [0.5, 0.41, 0.3])
    diff, skipped = compared(intel, amd)
    assert diff == [] and "iterations 1.. not compared" in skipped and "GenuineIntel" in skipped
    # ... but iteration 0 and the start still count whole, whatever comes after
    assert compared(intel, _fingerprint("AuthenticAMD", ["A", "B", "c"], [0.5, 0.4, 0.3]))[0] == ["train[0].texts: 'a' -> 'A'"]
    moved = _fingerprint("AuthenticAMD", ["a", "B", "c"], [0.6, 0.4, 0.3])
    assert compared(intel, moved)[0] == ["train[0].metrics.sub/loss: 0.5 -> 0.6"]
    start = {**amd, "start": {"em": 0.5, "episodes": [{"text": "s0"}]}}
    assert compared(intel, start)[0] == ["start.em: 0.25 -> 0.5"]
    # no flip on the other vendor: everything counts (a float that moved with every draw equal is a change)
    flat = _fingerprint("AuthenticAMD", ["a", "b", "c"], [0.5, 0.4, 0.35])
    assert compared(intel, flat) == (["train[2].metrics.sub/loss: 0.3 -> 0.35"], "")
    # an old record without the vendor is read by its model name
    old = {**intel, "computed_on": {"cpu": {"model": "Intel(R) Xeon(R) Processor"}}}
    assert compared(old, same)[1] == "" and compared(old, amd)[0] == []
