"""Mutation testing of the math, the scoring and the env's rewards and alignment (``make mutation``).

Runs mutmut 3 (configured in pyproject.toml, ``[tool.mutmut]``) from a clean ``mutants/`` folder,
then reads its verdicts and writes ``benchmarks/results/mutation.json`` and ``mutation.md``: per module
the mutants killed / survived / without a covering test / timed out, the share detected, the target,
and every survivor with its diff and the reason it is kept (:data:`KEPT`). A survivor that is not in
:data:`KEPT` is listed as "unexplained" and makes the script exit 1, as does a module under its target.

    .venv/bin/python benchmarks/mutation.py --max-children 2            # fresh run of every module
    .venv/bin/python benchmarks/mutation.py --max-children 2 --only M...  # rerun some, keep the others'
    .venv/bin/python benchmarks/mutation.py --no-run [--only M...]      # report the verdicts in mutants/

The wiring modules (compare.py, aec.py, core.py, kv_cache.py: 1,646 mutants) take about 14 min with two
workers on 2 shared cores. Each mutant is one pytest session; the fixtures' world, tokenizer and tiny
model are built once per mutation run, not per mutant (tests/_kept.py). mutmut's per-mutant limit is
its default, (estimated test time + 1 s) x 15 wall seconds (``timeout_multiplier`` / ``timeout_constant``
in ``[tool.mutmut]``); the tests stay far below it.

mutmut imports the copies in ``mutants/`` (it puts that folder first on sys.path and removes the
checkout), runs the selected tests once in process to learn which tests reach which function, then
forks once per mutant and runs only those tests: torch is imported once, not once per mutant.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results"

#: module -> share of mutants that must be detected (killed or timed out).
TARGETS = {
    "mgrpo_algo/core/advantages.py": 0.90,
    "mgrpo_algo/core/scoring.py": 0.90,
    "mgrpo_algo/core/losses.py": 0.90,
    "mgrpo_env/rewards.py": 0.80,
    "mgrpo_env/align.py": 0.80,
    # beyond the issue's targets: the role servers' recovery guards
    "mgrpo_algo/training/roles.py": 0.80,
    # issue 22: the wiring between the parts (compare's orchestration, the env's reward path, the KV cache)
    "mgrpo_algo/experiments/compare.py": 0.90,
    "mgrpo_env/aec.py": 0.90,
    "mgrpo_env/core.py": 0.90,
    "mgrpo_algo/policies/kv_cache.py": 0.90,
    # issue 34: the speed code (the decode step, the decode loop, the learner's shared prefix, log-probs and
    # batching, the browser's render cache)
    "mgrpo_algo/policies/fast_step.py": 0.90,
    "mgrpo_algo/policies/decode.py": 0.90,
    "mgrpo_algo/learning/prefix.py": 0.90,
    "mgrpo_algo/learning/logits.py": 0.90,
    "mgrpo_algo/learning/batching.py": 0.90,
    "tools/render_cache.py": 0.90,
}

#: Folders whose package has another name (pyproject's package-dir): mutmut names a mutant after its file's
#: path, the tests import the package, so the run sees ``tools/`` through a link named after the package.
PACKAGE_DIRS = {"tools/": "mgrpo_tools/"}

#: The first run (commit 04f434e, before the tests it prompted), same mutants: killed, survived, no test,
#: total. roles.py had no fast test then (tests/test_decoupled.py is slow); compare.py was not mutated. The
#: wiring modules: their first complete run (below).
BEFORE = {
    "mgrpo_algo/core/advantages.py": (154, 14, 0, 168),
    "mgrpo_algo/core/scoring.py": (79, 14, 218, 311),
    "mgrpo_algo/core/losses.py": (297, 55, 0, 352),
    "mgrpo_env/rewards.py": (140, 22, 0, 162),
    "mgrpo_env/align.py": (219, 28, 0, 247),
    # the wiring's first complete run (commit 1826326: the partial run's fake gaps closed, not yet the
    # tests its survivors prompted)
    "mgrpo_algo/experiments/compare.py": (931, 41, 0, 972),
    "mgrpo_env/aec.py": (318, 56, 0, 374),
    "mgrpo_env/core.py": (51, 3, 0, 54),
    "mgrpo_algo/policies/kv_cache.py": (223, 23, 0, 246),
}

#: Modules scored on some functions only (only their mutants are run; the others are left to the
#: slow end-to-end tests): roles.py's recovery path (not act / _sequences, which need sampled tokens, nor
#: the constructor); compare.py's orchestration (which models, seeds and metrics each figure comes from;
#: not check_compare's config validation nor the YAML dump); aec.py's reward path (the turns that end an
#: agent and the scoring, not reset / render / the PettingZoo plumbing that api_test covers); core.py's
#: tool call and verifier guard. kv_cache.py is mutated whole.
SCOPE = {
    # the recovery path: commit / read back / discard, the update guards, pending and lag, the checkpoint order
    "mgrpo_algo/training/roles.py": {f"RoleWorker.{m}" for m in (
        "commit", "discard", "_buffer", "update_main", "update_sub", "_apply_pending", "flush", "_apply_sub",
        "_applied", "_save_state", "rollback", "committed", "_adopt")} | {"write_json"},
    "mgrpo_algo/experiments/compare.py": {
        "aggregate", "log_scalars", "_roles", "evaluation_policies", "evaluate_policies", "eval_figures", "greedy_em",
        "_evaluate", "_full_evaluation", "_warm_record", "run_compare", "_train_and_evaluate", "_intervals",
        "_trained_policies", "_reproduce"},
    "mgrpo_env/aec.py": {f"MGRPOEnv.{m}" for m in (
        "_step_main", "_delegate", "_step_sub", "_return_to_main", "_expert", "_finish")},
    "mgrpo_env/core.py": {"call_tool", "safe_verify"},
}

# mutmut's exit-code verdicts (mutmut.stats.status_by_exit_code), folded into four columns.
_STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no_tests", 33: "no_tests", 36: "timeout",
           24: "timeout", -24: "timeout", 152: "timeout", 255: "timeout"}

_CPU = ("device only: the mutation and the original agree on CPU, where these tests run "
        "(tensors are created on the input's device; tests/test_gpu.py runs the math on CUDA)")

_KL32 = ("the approx_kl metric without the upper clamp: it only differs for log-ratios above 20, where "
         "ratio is e^20 and the metric, averaged in float32 (tok_mean casts), cannot tell e^20 - 21 from "
         "e^20 - 26 (float32's step there is 32); the loss is unaffected")
_F64 = ("np.asarray(rewards) without float64: the rewards are Python floats (float64 already), and "
        "main_advantages and group_stats cast to float64 themselves")

#: Survivors we keep, by mutant name, with the reason they are equivalent or harmless.
KEPT: dict[str, str] = {
    # advantages
    "mgrpo_algo.core.advantages.x__as_mask__mutmut_7": (
        "a tensor mask goes through np.asarray instead of .detach(): the same values on CPU "
        "(a CUDA mask would fail loudly, not silently)"),
    "mgrpo_algo.core.advantages.x__as_mask__mutmut_17": _CPU,
    "mgrpo_algo.core.advantages.x__group_moments__mutmut_9": (
        "the mask stays bool instead of float64: r * mask and mask.sum() give the same numbers "
        "(bool promotes to r's dtype, the count is an exact integer)"),
    # losses
    "mgrpo_algo.core.losses.x__prepare__mutmut_27": (
        "dtype=None gives float32 ones: the weight 1.0 is exact in any dtype and promotes to the values' dtype"),
    "mgrpo_algo.core.losses.x__prepare__mutmut_30": (
        "no dtype gives float32 ones: the weight 1.0 is exact in any dtype and promotes to the values' dtype"),
    "mgrpo_algo.core.losses.x__prepare__mutmut_28": _CPU,
    "mgrpo_algo.core.losses.x__prepare__mutmut_31": _CPU,
    "mgrpo_algo.core.losses.x__prepare__mutmut_36": _CPU,
    "mgrpo_algo.core.losses.x__prepare__mutmut_38": _CPU,
    "mgrpo_algo.core.losses.x_loss_normalizer__mutmut_7": (
        "torch.zeros without dtype is float32, the dtype written: equivalent"),
    "mgrpo_algo.core.losses.x_loss_normalizer__mutmut_10": (
        "torch.zeros without dtype is float32, the dtype written: equivalent"),
    "mgrpo_algo.core.losses.x_loss_normalizer__mutmut_8": _CPU,
    "mgrpo_algo.core.losses.x_loss_normalizer__mutmut_11": _CPU,
    "mgrpo_algo.core.losses.x_aggregate__mutmut_25": _CPU,
    "mgrpo_algo.core.losses.x_aggregate__mutmut_28": _CPU,
    "mgrpo_algo.core.losses.x_clipped_pg_loss__mutmut_32": _CPU,
    "mgrpo_algo.core.losses.x_clipped_pg_loss__mutmut_34": _CPU,
    "mgrpo_algo.core.losses.x_clipped_pg_loss__mutmut_174": _CPU,
    "mgrpo_algo.core.losses.x_clipped_pg_loss__mutmut_176": _CPU,
    "mgrpo_algo.core.losses.x_clipped_pg_loss__mutmut_119": (
        "kl_coef >= 0 instead of > 0: at kl_coef == 0 it adds 0 * kl, and kl is clamped finite, so the "
        "loss and its gradient are unchanged"),
    "mgrpo_algo.core.losses.x_clipped_pg_loss__mutmut_131": (
        "entropy_coef >= 0 instead of > 0: at entropy_coef == 0 it subtracts 0 * entropy; masked positions "
        "are replaced before aggregation, so the loss and its gradient are unchanged for finite entropies"),
    "mgrpo_algo.core.losses.x_clipped_pg_loss__mutmut_161": (
        "adv <= 0 instead of < 0 in clipfrac_low: where adv == 0 both pg terms are 0, so "
        "pg_clipped > pg_unclipped is already false"),
    "mgrpo_algo.core.losses.x_clipped_pg_loss__mutmut_166": (
        "adv >= 0 instead of > 0 in clipfrac_high: where adv == 0 both pg terms are 0, so "
        "pg_clipped > pg_unclipped is already false"),
    "mgrpo_algo.core.losses.x__prepare__mutmut_11": (
        "the mask stays bool instead of the values' dtype: values * mask, mask.sum() and (n > 0) give the "
        "same numbers, and every result is divided or multiplied into the values' dtype"),
    "mgrpo_algo.core.losses.x_clipped_pg_loss__mutmut_208": _KL32,
    "mgrpo_algo.core.losses.x_clipped_pg_loss__mutmut_210": _KL32,
    # roles
    **{f"mgrpo_algo.training.roles.x__write_json__mutmut_{n}": (
        "mkdir without parents: _write_json writes into the server's folder (made with parents=True when the "
        "server starts) or its buffers/ subfolder, so the parent always exists") for n in (1, 3, 5)},
    **{f"mgrpo_algo.training.roles.xǁRoleServerǁ_apply_sub__mutmut_{n}": (
        "_apply_sub is only called from _apply_pending, which has just made state['pending'] and iterates "
        "its keys: the setdefault default is never used and the key popped is always there")
       for n in (3, 5, 13, 24, 32)},
    # compare
    "mgrpo_algo.experiments.compare.x__history_means__mutmut_6": 'float("NAN") is the same NaN as float("nan")',
    "mgrpo_algo.experiments.compare.x__history_means__mutmut_9": 'float("NAN") is the same NaN as float("nan")',
    "mgrpo_algo.experiments.compare.x__pm__mutmut_7": (
        "format 'F' instead of 'f': identical for finite numbers (only inf / nan are spelled INF / NAN)"),
    "mgrpo_algo.experiments.compare.x__pm__mutmut_9": (
        "format 'F' instead of 'f': identical for finite numbers (only inf / nan are spelled INF / NAN)"),
    # compare's orchestration (issue 22)
    **{f"mgrpo_algo.experiments.compare.x__full_evaluation__mutmut_{n}": (
        "eval_figures given None for the records, or no scores: with scores given the records are not read, "
        "and without them it recomputes the same per_question(records) that _full_evaluation passes")
       for n in (22, 23, 26)},
    "mgrpo_algo.experiments.compare.x_eval_figures__mutmut_3": (
        "always recompute the scores from the records: every caller passes per_question(records) of those same "
        "records (or nothing), so the scores are the same"),
    "mgrpo_algo.experiments.compare.x__full_evaluation__mutmut_62": 'float("NAN") is the same NaN as float("nan")',
    "mgrpo_algo.experiments.compare.x_aggregate__mutmut_19": 'float("NAN") is the same NaN as float("nan")',
    **{f"mgrpo_algo.experiments.compare.x_evaluate_policies__mutmut_{n}": (
        "RewardConfig's default expert (hop_expert_score) instead of expert_scorer(None): without a judge the "
        "scorer returns hop_expert_score's value and is named 'hops' like it, so every reward and record agree")
       for n in (18,)},
    **{f"mgrpo_algo.experiments.compare.x_run_compare__mutmut_{n}": (
        "summary.json without json.dumps' default=str: every value of the summary is a str, number, bool, "
        "None, list or dict already (paths are str), so the fallback is never called and the text is the same")
       for n in (251, 254)},
    # the env's reward path (issue 22)
    **{f"mgrpo_env.aec.xǁMGRPOEnvǁ_expert__mutmut_{n}": (
        "sub.task or 'XXXX': a sub-agent's task is the delegate call's task, which the protocol's schema "
        "requires with minLength 1, so it is never empty and the fallback is never used") for n in (17,)},
    # NOTE (issue 33): _step_main and _finish moved their turn recording and the answer's pay into
    # mgrpo_env/episode_core.py; the mutant numbers below predate that and need re-checking at the
    # next `make mutation`.
    **{f"mgrpo_env.aec.xǁMGRPOEnvǁ_step_main__mutmut_{n}": (
        "the delegate task's fallback when the call has none: the protocol's schema requires 'task' (a "
        "non-empty string), so a parsed delegate call always has it") for n in (78, 80, 83)},
    **{f"mgrpo_env.aec.xǁMGRPOEnvǁ_finish__mutmut_{n}": (
        "infos.get(agent, None) instead of (agent, {}): every agent's infos are set when it starts "
        "(_start_agent -> _set_observation), so the default is never used") for n in (92, 94)},
    "mgrpo_env.aec.xǁMGRPOEnvǁ_return_to_main__mutmut_1": (
        "the note's default: _return_to_main is called without a note only with a sub's result text (a str), "
        "and the note is read only when the result is None"),
    # kv_cache (issue 22)
    "mgrpo_algo.policies.kv_cache.xǁKVCacheManagerǁprepare__mutmut_18": (
        "entries.pop(None, None) for an unkeyed row: store never keeps a row without a key, so there is no "
        "entry under None and the pop returns None, as the branch does"),
    **{f"mgrpo_algo.policies.kv_cache.xǁKVCacheManagerǁprepare__mutmut_{n}": (
        "zip(strict=...) over the prompts and their cached lengths: cached is built one per prompt (from a "
        "zip(keys, prompts, strict=True) that raises on a mismatch, tested), the lengths are always equal")
       for n in (44, 47, 48, 67, 70, 71)},
    **{f"mgrpo_algo.policies.kv_cache.xǁKVCacheManagerǁprepare__mutmut_{n}": (
        "torch.full without dtype=torch.long: the fill value pad_id is a Python int, so torch infers int64 "
        "(long) anyway (the layout's dtype is tested)") for n in (53, 56)},
    **{f"mgrpo_algo.policies.kv_cache.xǁKVCacheManagerǁprepare__mutmut_{n}": (
        "torch.tensor of a list of token ids without dtype=torch.long: a non-empty list of Python ints is "
        "int64 already; the list is never empty (an entry is used only when it leaves at least one id to "
        "feed, and the cached part is only copied when c > 0)") for n in (74, 76, 88, 90)},
    "mgrpo_algo.policies.kv_cache.xǁKVCacheManagerǁstore__mutmut_4": (
        "budget_bytes == 1 instead of == 0 for the early return: with a budget of 0 every entry (at least "
        "one float per layer) is over it and skipped, so nothing is kept either way; a budget of exactly 1 "
        "byte likewise keeps nothing (the budget is whole megabytes in practice)"),
    **{f"mgrpo_algo.policies.kv_cache.xǁKVCacheManagerǁstore__mutmut_{n}": (
        "the length (or device) read from layer 1's keys or from layer 0's values instead of layer 0's keys: "
        "only models whose layers are all plain full-attention DynamicLayers are served (supports_reuse), "
        "and their keys and values all have the same length and device") for n in (7, 8, 38, 39)},
    "mgrpo_algo.policies.kv_cache.xǁKVCacheManagerǁstore__mutmut_25": (
        "device only: index.to(None) keeps the column index on the CPU, identical on CPU where these tests "
        "run (on CUDA PyTorch moves a CPU index tensor to the indexed tensor's device; not run here)"),
    "mgrpo_algo.policies.kv_cache.x_supports_reuse__mutmut_9": (
        "getattr(cache, 'layers') without a default: the DynamicCache of the installed transformers always "
        "has .layers (only an older one without it would raise instead of answering False)"),
    "mgrpo_algo.policies.kv_cache.xǁKVCacheManagerǁ__init____mutmut_8": (
        "'' instead of None as the weights version before the first batch: any value that is not a tuple of "
        "versions differs from the first model's, and there are no entries to invalidate then"),
    "mgrpo_algo.policies.kv_cache.xǁKVCacheManagerǁstore__mutmut_65": (
        "popitem(last=None): OrderedDict reads a falsy last as False, the least recently used end"),
    # scoring
    "mgrpo_algo.core.scoring.x_score_main__mutmut_12": _F64,
    "mgrpo_algo.core.scoring.x_score_main__mutmut_14": _F64,
    "mgrpo_algo.core.scoring.x_score_sub__mutmut_52": (
        "zip(strict=None) over the group and its plan: plan_with_stats returns one row per rollout, the "
        "lengths are always equal"),
    "mgrpo_algo.core.scoring.x_score_sub__mutmut_55": (
        "zip without strict over the group and its plan: plan_with_stats returns one row per rollout"),
    "mgrpo_algo.core.scoring.x_score_sub__mutmut_56": (
        "zip(strict=False) over the group and its plan: plan_with_stats returns one row per rollout"),
    # align
    "mgrpo_env.align.x__subset__mutmut_5": (
        "rng.choice(replace=None): numpy reads a falsy replace as without replacement, as written"),
    "mgrpo_env.align.x__duplicate__mutmut_1": (
        "d_k > d instead of >=: at d_k == d the other branch returns range(d) plus rng.integers(size=0), "
        "the same slots, and drawing 0 integers leaves the generator's state unchanged (tested)"),
    "mgrpo_env.align.x__duplicate__mutmut_20": (
        "rng.integers(d_k, size=n) is numpy's one-argument form, [0, d_k): identical to integers(0, d_k)"),
    "mgrpo_env.align.x__duplicate_balanced__mutmut_1": (
        "d_k > d instead of >=: at d_k == d the other branch gives range(d) * 1 plus a subset of size 0, "
        "the same slots, and choosing 0 leaves the generator's state unchanged (tested)"),
    "mgrpo_env.align.x_choose_d__mutmut_37": (
        "frac gets one extra entry (n+1)/n past the end: frac[n-1] == 1 >= quantile already, so argmax "
        "never reaches it"),
    # rewards
    "mgrpo_env.rewards.x__unit_array__mutmut_3": (
        "np.asarray without float64: bools, ints and floats compare and multiply to the same values, and "
        "the result is cast to float64 at the end"),
    "mgrpo_env.rewards.x__unit_array__mutmut_5": (
        "np.asarray without float64: bools, ints and floats compare and multiply to the same values, and "
        "the result is cast to float64 at the end"),
    "mgrpo_env.rewards.x_main_rewards__mutmut_13": (
        "format_ok not cast to bool: np.where reads any non-zero as True, as the bool cast does"),
    "mgrpo_env.rewards.x_main_rewards__mutmut_15": (
        "format_ok not cast to bool: np.where reads any non-zero as True, as the bool cast does"),
    "mgrpo_env.rewards.x_main_rewards__mutmut_23": "astype(None) is astype(float64) in numpy: equivalent",
    "mgrpo_env.rewards.x_sub_rewards__mutmut_13": (
        "format_ok not cast to bool: np.where reads any non-zero as True, as the bool cast does"),
    "mgrpo_env.rewards.x_sub_rewards__mutmut_15": (
        "format_ok not cast to bool: np.where reads any non-zero as True, as the bool cast does"),
    "mgrpo_env.rewards.x_sub_rewards__mutmut_30": "astype(None) is astype(float64) in numpy: equivalent",
}


def patterns(paths: list[str]) -> list[str]:
    """mutmut's mutant-name patterns for ``paths``: a scoped module's functions only, else the whole module.

    A pattern ``<module>.x_<function>*`` matches the function's mutants and its own name, which is how
    mutmut picks the tests to run first (a pattern ending in ``__mutmut_*`` would select no test)."""
    out = []
    for path in paths:
        module = mutmut_path(path).removesuffix(".py").replace("/", ".")
        scope = SCOPE.get(path)
        if scope is None:
            out.append(f"{module}.*")
            continue
        for name in sorted(scope):
            cls, _, method = name.rpartition(".")
            out.append(f"{module}.xǁ{cls}ǁ{method}*" if cls else f"{module}.x_{name}*")
    return out


def mutmut_path(path: str) -> str:
    """``path`` as mutmut sees it: ``tools/render_cache.py`` -> ``mgrpo_tools/render_cache.py``."""
    for folder, package in PACKAGE_DIRS.items():
        if path.startswith(folder):
            return package + path.removeprefix(folder)
    return path


@contextlib.contextmanager
def package_links() -> Iterator[None]:
    """The links of :data:`PACKAGE_DIRS` in ROOT (``mgrpo_tools -> tools``) while mutmut runs or is read;
    removed afterwards unless they were there before (git ignores them)."""
    made = []
    for folder, package in PACKAGE_DIRS.items():
        link = ROOT / package.rstrip("/")
        if not link.exists():
            link.symlink_to(folder.rstrip("/"), target_is_directory=True)
            made.append(link)
    try:
        yield
    finally:
        for link in made:
            link.unlink()


RUN_FILE = "mutmut-run.json"  # in mutants/: how its verdicts were obtained, for --no-run


def run_mutmut(max_children: int, paths: list[str] | None = None, command: str = "make mutation") -> dict:
    """A fresh ``mutmut run`` from ROOT (of ``paths``' mutants only, when given; scoped modules run only
    their scope's mutants either way); returns (and writes to ``mutants/mutmut-run.json``) the run: its
    wall time in seconds, the parallel workers, the command and the modules."""
    shutil.rmtree(ROOT / "mutants", ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    mutmut = Path(sys.executable).with_name("mutmut")
    start = time.perf_counter()
    with package_links():
        subprocess.run([str(mutmut), "run", "--max-children", str(max_children), *patterns(paths or list(TARGETS))],
                       cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    run = {"wall_s": round(time.perf_counter() - start, 1), "max_children": max_children, "command": command,
           "modules": paths or list(TARGETS), "finished": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    (ROOT / "mutants" / RUN_FILE).write_text(json.dumps(run, indent=1) + "\n")
    return run


def _diff(name: str, path: str) -> str:
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        with package_links():
            lines = get_diff_for_mutant(name, path=mutmut_path(path)).splitlines()[2:]
    finally:
        os.chdir(cwd)
    return "\n".join(line for line in lines if line.startswith(("+", "-")))


def collect(paths: list[str] | None = None) -> dict:
    """Per-module counts and the survivors, from the ``.meta`` files mutmut wrote."""
    modules = {}
    for path, target in TARGETS.items():
        if paths is not None and path not in paths:
            continue
        meta = ROOT / "mutants" / (mutmut_path(path) + ".meta")
        if not meta.exists():
            raise SystemExit(f"{meta} is missing: run without --no-run first")
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        counts = {"killed": 0, "survived": 0, "no_tests": 0, "timeout": 0, "other": 0}
        survivors = []
        scope = SCOPE.get(path)
        for name, code in sorted(codes.items(), key=lambda kv: _natural(kv[0])):
            if scope is not None and _function(name) not in scope:
                continue
            status = _STATUS.get(code, "other")
            counts[status] += 1
            if status in ("survived", "no_tests", "other"):
                survivors.append({"mutant": name, "status": status, "diff": _diff(name, path),
                                  "reason": KEPT.get(name)})
        total = sum(counts.values())
        detected = counts["killed"] + counts["timeout"]
        modules[path] = {**counts, "scope": sorted(scope) if scope else "whole module", "total": total, "detected": round(detected / total, 4) if total else 1.0,
                         "target": target, "survivors": survivors}
    return modules


def _function(mutant: str) -> str:
    """``pkg.mod.x_verdict__mutmut_3`` -> ``verdict``; a method ``xǁCǁm__mutmut_1`` -> ``C.m``."""
    generated = mutant.rsplit(".", 1)[-1].split("__mutmut_")[0]
    return generated[2:] if generated.startswith("x_") else generated.lstrip("x").strip("ǁ").replace("ǁ", ".")


def _natural(name: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def _run_line(run: dict, modules: dict) -> str:
    """One run and the modules whose verdicts come from it (a later --only run may have replaced others)."""
    wall = "wall time not measured" if run.get("wall_s") is None else f"wall time {run['wall_s'] / 60:.1f} min"
    workers = f"{run['max_children']} worker" + ("s" if run["max_children"] > 1 else "")
    when = f", finished {run['finished']}" if run.get("finished") else ""
    used = [path for path, m in modules.items() if m.get("run") == run]
    return (f"- `{run['command']}` ({workers}, {wall}{when}), the verdicts of "
            + ", ".join(f"`{path}`" for path in used))


def write(modules: dict, out: Path, note: str = "") -> bool:
    out.mkdir(parents=True, exist_ok=True)
    ok = True
    for m in modules.values():
        m["meets_target"] = m["detected"] >= m["target"]
        ok &= m["meets_target"] and all(s["reason"] for s in m["survivors"])
    import mutmut

    runs: list[dict] = []  # the distinct runs the modules' verdicts come from, in module order
    for m in modules.values():
        if m.get("run") and m["run"] not in runs:
            runs.append(m["run"])
    data = {"tool": f"mutmut {mutmut.__version__}", "runs": runs, "note": note, "modules": modules,
            "first_run": {p: dict(zip(("killed", "survived", "no_tests", "total"), b, strict=True))
                          for p, b in BEFORE.items()}}
    (out / "mutation.json").write_text(json.dumps(data, indent=1) + "\n")
    lines = [
        "# Mutation testing",
        "",
        f"`make mutation` ({data['tool']}). Detected = killed + "
        "timed out, over all mutants (a mutant no selected test reaches counts as not detected). "
        "The verdicts come from these runs:",
        "",
        *(_run_line(r, modules) for r in runs),
        "",
        *([note, ""] if note else []),
        "Why mutmut 3 and not cosmic-ray 8: both mutate a module and run a test command, but cosmic-ray "
        "starts that command once per mutant, and on these 2 shared cores a pytest start that imports torch "
        "costs 8-10 s, about 3 h for the 1,240 mutants of the five target modules alone. mutmut 3 imports the tests once, learns which "
        "tests reach which function, then forks once per mutant and runs only those tests (a few per "
        "second). Its `mutants/` copy suits this layout: `source_paths` copies `mgrpo_algo/` and `mgrpo_env/` "
        "whole, `only_mutate` picks the modules, and it puts `mutants/` first on sys.path and removes the "
        "checkout, so the copies are what the tests import (`mgrpo_tools` and `mgrpo_scenarios` still come "
        "from the install; they are not mutated). Configured in pyproject.toml, `[tool.mutmut]`.",
        "",
        "| module | mutants | killed | survived | no test | timeout | detected | target | first run |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for path, m in modules.items():
        b = BEFORE.get(path)
        first = f"{b[0]} / {b[1]} / {b[2]}: {100 * b[0] / b[3]:.1f}%" if b else "not measured"
        lines.append(f"| `{path}` | {m['total']} | {m['killed']} | {m['survived']} | {m['no_tests']} | "
                     f"{m['timeout']} | {100 * m['detected']:.1f}% | {100 * m['target']:.0f}% | {first} |")
    for path, scope in SCOPE.items():
        lines += ["", f"`{path}` is scored on {', '.join(f'`{f}`' for f in sorted(scope))} only."]
    lines += ["", "First run: killed / survived / no test before the tests it prompted (commit 04f434e; the "
              "selected tests were test_advantages, test_losses, test_rewards and test_align); for the wiring "
              "modules, their first complete run (commit 1826326), before the tests its survivors prompted."]
    lines += ["", "## Survivors kept", "",
              "Each is equivalent to the original, or differs only on a CUDA device; the reason is given "
              "under its diff.", ""]
    for path, m in modules.items():
        if not m["survivors"]:
            continue
        lines += [f"### `{path}`", ""]
        for s in m["survivors"]:
            lines += [f"- `{s['mutant'].rsplit('.', 1)[-1]}` ({s['status'].replace('_', ' ')}): "
                      f"{s['reason'] or '**unexplained**'}", "", "  ```diff",
                      *("  " + line for line in s["diff"].splitlines()), "  ```", ""]
    (out / "mutation.md").write_text("\n".join(lines))
    return ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--no-run", action="store_true", help="report the verdicts already in mutants/")
    p.add_argument("--max-children", type=int, default=1, help="parallel mutant workers (default 1)")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--note", default="", help="a sentence on how the verdicts were obtained, for the report")
    p.add_argument("--only", nargs="+", choices=list(TARGETS), metavar="MODULE",
                   help="mutate these modules only; the other modules keep their verdicts from the previous report")
    args = p.parse_args(argv)
    previous_file = args.out / "mutation.json"
    previous = json.loads(previous_file.read_text()) if previous_file.exists() else {}
    command = "make mutation" if argv is None and len(sys.argv) == 1 else " ".join(
        ["benchmarks/mutation.py", *(sys.argv[1:] if argv is None else argv)])
    if args.no_run:  # the run that produced mutants/, as it recorded itself
        run_file = ROOT / "mutants" / RUN_FILE
        run = json.loads(run_file.read_text()) if run_file.exists() else None
    else:
        run = run_mutmut(args.max_children, args.only, command)
    fresh = {path: {**m, "run": run} for path, m in collect(args.only).items()}
    if args.only:  # every module in TARGETS order: the fresh ones, the others as the previous report has them
        kept = previous.get("modules", {})
        missing = [path for path in TARGETS if path not in fresh and path not in kept]
        if missing:
            raise SystemExit(f"no previous verdicts for {', '.join(missing)}: run them (or all) first")
        # a report written before runs were recorded per module: its one run, one worker
        old_run = {"wall_s": previous.get("wall_s"), "max_children": 1, "command": previous.get("command", "make mutation"),
                   "modules": [p for p in kept if p not in fresh]}
        for m in kept.values():  # the reasons as KEPT has them now (a reason may have been added since)
            for survivor in m.get("survivors", []):
                survivor["reason"] = KEPT.get(survivor["mutant"], survivor.get("reason"))
        modules = {path: fresh.get(path) or {"run": old_run, **kept[path], "target": TARGETS[path], "from_previous_run": True}
                   for path in TARGETS}
    else:
        modules = fresh
    ok = write(modules, args.out, args.note)
    for path, m in modules.items():
        unexplained = sum(not s["reason"] for s in m["survivors"])
        print(f"{path:34s} {m['killed']:4d} killed {m['survived']:3d} survived {m['no_tests']:3d} no test "
              f"{m['timeout']:2d} timeout  {100 * m['detected']:5.1f}% (target {100 * m['target']:.0f}%)"
              + (f"  {unexplained} unexplained" if unexplained else ""))
    print(f"wrote {args.out / 'mutation.json'} and {args.out / 'mutation.md'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
