"""benchmarks/mutation.py's bookkeeping of kept survivors: a reason in KEPT that no survivor bears any more
(mutmut renumbers a function's mutants when code above them changes) is reported, so a reason cannot sit
unnoticed on another, real mutant."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def _mutation():
    sys.path.insert(0, str(BENCH))
    try:
        return importlib.import_module("mutation")
    finally:
        sys.path.remove(str(BENCH))


def test_stale_kept_names_reasons_of_killed_or_vanished_mutants_of_the_module_only():
    mutation = _mutation()
    mod = "mgrpo_algo.core.scoring"
    kept = {f"{mod}.x_score_sub_side__mutmut_58": "zip", f"{mod}.x_score_sub_side__mutmut_98": "zip",
            f"{mod}.x_score_main__mutmut_14": "dtype", f"{mod}.x__digest__mutmut_9": "gone",
            "mgrpo_env.align.x__subset__mutmut_5": "another module's"}
    codes = {f"{mod}.x_score_sub_side__mutmut_58": 1,   # killed: its reason is stale
             f"{mod}.x_score_sub_side__mutmut_98": 0,   # survived: the reason stands
             f"{mod}.x_score_main__mutmut_14": 36}      # timed out (detected): stale too
    assert mutation.stale_kept("mgrpo_algo/core/scoring.py", codes, kept=kept) == [
        f"{mod}.x__digest__mutmut_9", f"{mod}.x_score_main__mutmut_14", f"{mod}.x_score_sub_side__mutmut_58"]
    # a scoped module: only its scope's functions are judged
    assert mutation.stale_kept("mgrpo_algo/core/scoring.py", codes, scope={"score_sub_side"}, kept=kept) == [
        f"{mod}.x_score_sub_side__mutmut_58"]
    # tools/ is the package mgrpo_tools (mutmut's names follow the import name)
    assert mutation.stale_kept("tools/render_cache.py", {}, kept={"mgrpo_tools.render_cache.x_f__mutmut_1": "r"}) == [
        "mgrpo_tools.render_cache.x_f__mutmut_1"]


def test_every_kept_reason_names_a_mutant_of_a_target_module():
    mutation = _mutation()
    prefixes = tuple(mutation.module_name(p) + "." for p in mutation.TARGETS)
    assert [name for name in mutation.KEPT if not name.startswith(prefixes)] == []
