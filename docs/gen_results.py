"""The demo's result in the README and on the site, generated from the committed summary.

    python docs/gen_results.py           # rewrite the README's block between the demo-result markers
    python docs/gen_results.py --check   # exit 1 when the README's block is not what the summary gives

`make docs` runs the first; tests/test_docs_names.py runs the second, so a regenerated demo
(benchmarks/results/demo_seed0/summary.json) cannot leave the README's table behind. The site's demo page
is the summary's own report (``mgrpo_algo.experiments.report.markdown``), put in by docs/hooks.py.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "benchmarks" / "results" / "demo_seed0"
START, END = "<!-- demo-result:start (python docs/gen_results.py) -->", "<!-- demo-result:end -->"


def load_summary(folder: Path = DEMO) -> dict[str, Any]:
    """The committed demo's summary.json (a figure not measured is null: None here)."""
    return json.loads((folder / "summary.json").read_text())


def _pct(x: float | None) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}"


def _signed(iv: dict[str, float] | None) -> str:
    if not iv:
        return "-"
    return f"{100 * iv['diff']:+.1f} [{100 * iv['low']:+.1f}, {100 * iv['high']:+.1f}]"


def _mistake(summary: dict[str, Any], mode: str, key: str) -> str:
    rates = summary.get("mistakes", {}).get(mode, {})
    start, after = rates.get("start", {}).get(key), rates.get("after", {}).get(key)
    return "-" if start is None or after is None else f"{_pct(start)} -> {_pct(after)}"


def _figure(figures: str) -> str:
    """A check's figure up to its interval (``+7.6 [+4.1, +11.2]`` of ``+7.6 [+4.1, +11.2] points, 224 ...``)."""
    found = re.match(r"[^\]]*\]", figures)
    return found.group(0) if found else figures.split(",")[0]


def readme_block(summary: dict[str, Any]) -> str:
    """The README's table (the modes, start -> after mean@k with its interval, the two decision mistakes,
    the episodes that never answer) and one line of what report.md's checks say."""
    k = summary["eval"]["samples"]
    lines = [f"| mode | held-out mean@{k}: start -> after | after - start [95% CI] | main answers early "
             "(per decision) | sub-agents report without a visit | episodes that never answer |",
             "|---|---|---|---|---|---|"]
    for mode in summary["modes"]:
        mean = summary["results"][mode]["mean"]
        iv = summary["intervals"].get(f"{mode}: after - start")
        early = _mistake(summary, mode, "answer_early")
        if early == "-" and mode == "single-agent":
            early = f"(per episode) {_mistake(summary, mode, 'answer_early_episodes')}"
        lines.append(f"| {mode} | {_pct(mean['before_em'])} -> **{_pct(mean['after_em'])}** | {_signed(iv)} | "
                     f"{early} | {_mistake(summary, mode, 'report_without_visit')} | "
                     f"{_mistake(summary, mode, 'turn_limit_episodes')} |")
    checks = summary["verdict"]["checks"]
    failed = [c for c in checks if not c["passed"]]
    words = "; ".join(f"{c['check']}: {_figure(c['figures'])}" for c in failed)
    lines += ["", f"`report.md`'s checks, each from its paired 95% interval: {len(checks) - len(failed)} of "
              f"{len(checks)} pass" + (f"; not met: {words}." if failed else ".")]
    return "\n".join(lines)


def replace_block(text: str, block: str) -> str:
    """``text`` with the part between the markers replaced by ``block``."""
    pattern = re.compile(re.escape(START) + r".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise ValueError(f"no {START} ... {END} block")
    return pattern.sub(lambda _: f"{START}\n{block}\n{END}", text, count=1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check that README.md is current")
    args = parser.parse_args(argv)
    readme = ROOT / "README.md"
    text = readme.read_text()
    new = replace_block(text, readme_block(load_summary()))
    if args.check:
        if new != text:
            print("README.md's demo table is not the committed summary's: run python docs/gen_results.py",
                  file=sys.stderr)
            return 1
        return 0
    if new != text:
        readme.write_text(new)
        print("README.md: demo table regenerated from benchmarks/results/demo_seed0/summary.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
