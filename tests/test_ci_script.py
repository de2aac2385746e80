"""The CI script checks the demo's outputs by file name: those names must be the ones compare writes.

A renamed figure (curves.png became headline.png and four detail figures) once turned CI red after a
45-minute run while every test passed; this test reads the names out of ``.ci/run`` and fails in a second.
"""

from __future__ import annotations

import re
from pathlib import Path

from mgrpo_algo.experiments.plots import DETAILS, HEADLINE

CI_SCRIPT = Path(__file__).resolve().parents[1] / ".ci" / "run"


def _checked_figures(script: str) -> list[str]:
    loop = re.search(r"for figure in ([^;]+); do test -s \"runs/demo/\$figure\"", script)
    assert loop, "the CI script no longer checks the demo's figures in a `for figure in ...` loop"
    return loop.group(1).split()


def test_the_ci_script_checks_exactly_the_figures_compare_writes() -> None:
    script = CI_SCRIPT.read_text()
    assert _checked_figures(script) == [HEADLINE, *(name for name, _ in DETAILS)]
    # Nothing else under runs/demo/ is checked by a name compare does not write.
    named = set(re.findall(r"runs/demo/([\w.]+\.png)", script))
    assert named <= {HEADLINE, *(name for name, _ in DETAILS)}, named

