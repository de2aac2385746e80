"""Mutation testing of the math, the scoring and the env's rewards and alignment (``make mutation``).

Runs mutmut 3 (configured in pyproject.toml, ``[tool.mutmut]``) from a clean ``mutants/`` folder,
then reads its verdicts and writes ``benchmarks/results/mutation.json`` and ``mutation.md``: per module
the mutants killed / survived / without a covering test / timed out, the share detected, the target,
and every survivor with its diff and the reason it is kept (:data:`KEPT`). A survivor that is not in
:data:`KEPT` is listed as "unexplained" and makes the script exit 1, as does a module under its target or a
freshly run module with a stale :data:`KEPT` entry (a reason for a mutant it killed or no longer has).

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
    # beyond the issue's targets: the role servers' recovery guards (issue 33 split the worker: its token
    # trajectories and its commit point are modules of their own, held to the same target)
    "mgrpo_algo/training/roles.py": 0.80,
    "mgrpo_algo/training/trajectories.py": 0.80,
    "mgrpo_algo/training/worker_state.py": 0.80,
    # issue 22: the wiring between the parts (compare's orchestration, the env's reward path, the KV cache)
    "mgrpo_algo/experiments/compare.py": 0.90,
    # the held-out evaluation and compare's units of work, split from compare.py (its SCOPE was there, its
    # target was not, so no run measured it)
    "mgrpo_algo/experiments/units.py": 0.90,
    "mgrpo_env/aec.py": 0.90,
    "mgrpo_env/core.py": 0.90,
    # issue 33: the episode core both envs share came out of aec.py; issue 43: it holds the one turn loop
    "mgrpo_env/episode_core.py": 0.90,
    "mgrpo_algo/policies/kv_cache.py": 0.90,
    # issue 34: the speed code (the decode step, the decode loop, the learner's shared prefix, log-probs and
    # batching, the browser's render cache)
    "mgrpo_algo/policies/fast_step.py": 0.90,
    "mgrpo_algo/policies/decode.py": 0.90,
    "mgrpo_algo/learning/prefix.py": 0.90,
    "mgrpo_algo/learning/logits.py": 0.90,
    "mgrpo_algo/learning/batching.py": 0.90,
    "tools/render_cache.py": 0.90,
    # issue 46: what the last wave landed (the imperfect teacher, the mistake statistics, the report's checks,
    # the served engine's watchdog) and the reward options' wiring into training
    "mgrpo_env/teacher.py": 0.90,
    "mgrpo_env/mistakes.py": 0.90,
    "mgrpo_algo/experiments/mistake_stats.py": 0.90,
    "mgrpo_algo/experiments/report.py": 0.90,
    "mgrpo_algo/policies/vllm_server.py": 0.90,
    "mgrpo_algo/training/trainer.py": 0.90,
    "mgrpo_algo/training/workers.py": 0.90,
    # issue 53: what crosses to a role worker per turn (no gold answer, no whole chat); the TRL environment; the
    # served env's sessions and its client (tests/test_openenv_client.py: the real server in a thread of the test
    # process, so the client and the server are mutmut's copies); the run storage the role workers share
    "mgrpo_env/turn_requests.py": 0.90,
    "mgrpo_algo/experiments/trl_env.py": 0.90,
    "mgrpo_env/openenv_server.py": 0.90,
    "mgrpo_algo/training/storage.py": 0.90,
    "mgrpo_env/openenv_client.py": 0.90,
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
    # issue 34: the speed modules' first run, before the tests it prompted (the tests of commit 91f3a93, which
    # include the previous session's issue-34 tests; render_cache's killed count includes its 3 timeouts)
    "mgrpo_algo/policies/fast_step.py": (191, 38, 0, 229),
    "mgrpo_algo/policies/decode.py": (136, 47, 0, 183),
    "mgrpo_algo/learning/prefix.py": (143, 30, 0, 173),
    "mgrpo_algo/learning/logits.py": (82, 13, 0, 95),
    "mgrpo_algo/learning/batching.py": (38, 24, 0, 62),
    "tools/render_cache.py": (158, 47, 2, 207),
    # issue 46: the teacher's and the watchdog's first complete run (commit fa872d5), before the tests its
    # survivors prompted (vllm_server's killed count includes its 2 timeouts)
    "mgrpo_env/teacher.py": (396, 61, 0, 457),
    "mgrpo_algo/policies/vllm_server.py": (85, 42, 0, 127),
    # issue 53: the run storage's first run (tests/test_run_storage.py as commit ea3d081 has it; the killed count
    # includes its timeout); the client's first run (tests/test_openenv_client.py's first version; it had no
    # test mutmut could run before: tests/test_openenv.py serves from a child process)
    "mgrpo_algo/training/storage.py": (333, 135, 45, 513),
    "mgrpo_env/openenv_client.py": (112, 16, 0, 128),
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
        "commit", "update", "_update_scored", "_update_self_scored", "_apply_pending", "flush", "_apply_sub", "_score_sub",
        "_update_shared",
        "_learn_scored", "_replayed", "_publish_main", "_applied", "_published", "rollback", "committed")} | {"_queued"},
    # the worker's sampled tokens: commit / read back / discard / retire / roll back (issue 33's split)
    "mgrpo_algo/training/trajectories.py": {f"Trajectories.{m}" for m in (
        "history", "add", "commit", "load", "discard", "retire", "drop_after")} | {"write_json", "drop_json_after"},
    "mgrpo_algo/experiments/compare.py": {
        "aggregate", "_start_name", "_warm_record", "run_compare", "_run_compare", "_run_units", "with_start",
        "_intervals", "_reproduce"},
    # the held-out evaluation and compare's units of work (split from compare.py)
    "mgrpo_algo/experiments/units.py": {
        "log_scalars", "evaluation_policies", "evaluate_policies", "eval_figures", "greedy_em", "_full_evaluation",
        "_train_and_evaluate", "_trained_policies", "_start_evaluation", "run_unit"},
    # issue 43: the turn loop, the delegation, the limits and the pay live in the episode core; the AEC env
    # keeps PettingZoo's tables in step with it
    "mgrpo_env/aec.py": {f"MGRPOEnv.{m}" for m in ("reset", "_observed", "step", "_paid")},
    "mgrpo_env/core.py": {"call_tool", "safe_verify"},
    "mgrpo_env/episode_core.py": {f"Episode.{m}" for m in (
        "reset", "_start", "_observe", "act", "_reply", "_run_tool", "_delegate", "_refuse", "_end", "_expert", "_finish")},
    # issue 46: the watchdog (health, start / wait, the restart decision), not the command line, the weights
    # written for the engine nor stop's signal escalation (a real engine's process group)
    "mgrpo_algo/policies/vllm_server.py": {f"VLLMServer.{m}" for m in (
        "healthy", "alive", "ensure_up", "wait_ready", "start")} | {"_signal_name"},
    # the reward options on their way to training: the env's RewardConfig and keyword arguments, the sub side's
    # scoring (the iteration loop itself is tests/test_trainer.py's and tests/test_reward_wiring.py's, end to end)
    "mgrpo_algo/training/trainer.py": {"reward_config", "env_options"},
    "mgrpo_algo/training/workers.py": {"RoleWorkers._sub_scoring"},
    # issue 53: the TRL environment's episode (its tools stepping the env, the sub-agents played inside, the
    # check that TRL's sampled turns are what the env ran); not the trainer's construction (tests/test_trl_env.py's
    # two GRPOTrainer steps, a minute and more per mutant)
    "mgrpo_algo/experiments/trl_env.py": {f"FrozenSubEnv.{m}" for m in (
        "reset", "delegate", "reason", "_main_call", "_step_main", "_play_subs", "_settle", "_finish")}
        | {"_canonical_call", "_same_action"},
    # issue 53: the served env's sessions (who may act, the endings' flags, the observations), in process
    # (tests/test_openenv_sessions.py); not the app's construction nor the browser count (over the wire).
    # mutmut leaves decorated functions alone: the ``state`` property (what a client sees of the task) is
    # checked by hand-made breaks instead (the commits of issue 53)
    "mgrpo_env/openenv_server.py": {f"_SessionEnvironment.{m}" for m in ("reset", "step")}
        | {f"{c}.{m}" for c in ("HierarchyEnvironment", "SingleEnvironment") for m in ("_observe", "_reset_env", "_step_env")},
}

# mutmut's exit-code verdicts (mutmut.stats.status_by_exit_code), folded into four columns.
_STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no_tests", 33: "no_tests", 36: "timeout",
           24: "timeout", -24: "timeout", 152: "timeout", 255: "timeout"}

#: Survivors we keep, by mutant name, with the reason (benchmarks/mutation_kept.py).
from mutation_kept import KEPT  # noqa: E402 - benchmarks/ is the script's folder


def patterns(paths: list[str]) -> list[str]:
    """mutmut's mutant-name patterns for ``paths``: a scoped module's functions only, else the whole module.

    A pattern ``<module>.x_<function>*`` matches the function's mutants and its own name, which is how
    mutmut picks the tests to run first (a pattern ending in ``__mutmut_*`` would select no test)."""
    out = []
    for path in paths:
        module = module_name(path)
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


def module_name(path: str) -> str:
    """The dotted module mutmut names ``path``'s mutants after: ``tools/x.py`` -> ``mgrpo_tools.x``."""
    return mutmut_path(path).removesuffix(".py").replace("/", ".")


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


def run_mutmut(max_children: int, paths: list[str] | None = None, command: str = "make mutation",
               names: list[str] | None = None) -> dict:
    """A fresh ``mutmut run`` from ROOT (of ``paths``' mutants only, when given; scoped modules run only
    their scope's mutants either way; only the mutants ``names``, when given); returns (and writes to
    ``mutants/mutmut-run.json``) the run: its wall time in seconds, the parallel workers, the command and
    the modules."""
    shutil.rmtree(ROOT / "mutants", ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    mutmut = Path(sys.executable).with_name("mutmut")
    start = time.perf_counter()
    with package_links():
        subprocess.run([str(mutmut), "run", "--max-children", str(max_children),
                        *(names or patterns(paths or list(TARGETS)))],
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
                         "target": target, "survivors": survivors, "stale_kept": stale_kept(path, codes, scope)}
    return modules


def stale_kept(path: str, codes: dict[str, int | None], scope: set[str] | None = None,
               kept: dict[str, str] | None = None) -> list[str]:
    """The :data:`KEPT` entries of ``path`` (in its scope) that no survivor of this run bears: mutants a test
    now kills, or names the module no longer has. mutmut numbers a function's mutants in source order, so
    an edit above a kept mutant renumbers it, and its reason may then sit on another, real mutant
    (issue 43 found ``score_sub_side``'s "zip(strict=...)" reason on ``fact.expert or 1.0``)."""
    prefix = module_name(path) + "."
    stale = []
    for name in (KEPT if kept is None else kept):
        if not name.startswith(prefix) or (scope is not None and _function(name) not in scope):
            continue
        if name not in codes or _STATUS.get(codes[name]) in ("killed", "timeout"):
            stale.append(name)
    return sorted(stale, key=_natural)


def rerun_survivors(previous: dict, paths: list[str]) -> dict:
    """The previous report's modules ``paths`` after rerunning only their survivors (the mutants in
    ``mutants/`` now): a survivor that a test now kills moves to killed (or timeout); every other verdict
    stands. Valid while the modules' source is unchanged (the same mutants) and tests were only added
    (a mutant killed before is still killed)."""
    out = {}
    for path in paths:
        before = previous["modules"][path]
        codes = json.loads((ROOT / "mutants" / (mutmut_path(path) + ".meta")).read_text())["exit_code_by_key"]
        m = {**before, "survivors": []}
        stale = list(before.get("stale_kept", []))
        for survivor in before["survivors"]:
            name = survivor["mutant"]
            if name not in codes:
                raise SystemExit(f"{name} is not a mutant of {path} any more: the module changed, run it afresh")
            status = _STATUS.get(codes[name], "other")
            if codes[name] is None:
                raise SystemExit(f"{name} was not rerun")
            if status != survivor["status"]:
                m[survivor["status"]] -= 1
                m[status] += 1
            if status in ("survived", "no_tests", "other"):
                m["survivors"].append({**survivor, "status": status, "reason": KEPT.get(name)})
            elif name in KEPT:  # a kept "equivalent" a test now kills: its reason was wrong or renumbered
                stale.append(name)
        detected = m["killed"] + m["timeout"]
        m["detected"] = round(detected / m["total"], 4) if m["total"] else 1.0
        m["stale_kept"] = sorted(set(stale), key=_natural)
        m["rerun"] = {"survivors_before": len(before["survivors"]), "survivors_after": len(m["survivors"]),
                      "first_run": before.get("rerun", {}).get("first_run") or before.get("run")}
        out[path] = m
    return out


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


def _first_run_lines(modules: dict) -> list[str]:
    """For modules whose survivors were rerun (``--survivors``): the run their other verdicts come from."""
    firsts: list[dict] = []
    for m in modules.values():
        first = m.get("rerun", {}).get("first_run")
        if first and first not in firsts:
            firsts.append(first)
    lines = []
    for first in firsts:
        used = [p for p, m in modules.items() if m.get("rerun", {}).get("first_run") == first]
        wall = "" if first.get("wall_s") is None else f", wall time {first['wall_s'] / 60:.1f} min"
        when = f", finished {first['finished']}" if first.get("finished") else ""
        lines.append(f"- `{first['command']}` ({first['max_children']} worker{'s' if first['max_children'] > 1 else ''}"
                     f"{wall}{when}): every verdict of " + ", ".join(f"`{p}`" for p in used)
                     + " but their survivors', which the rerun above gives")
    return lines


def write(modules: dict, out: Path, note: str = "") -> bool:
    out.mkdir(parents=True, exist_ok=True)
    ok = True
    for m in modules.values():
        m["meets_target"] = m["detected"] >= m["target"]
        m["stale_kept"] = [n for n in m.get("stale_kept", []) if n in KEPT]  # removed from KEPT since: no longer stale
        ok &= m["meets_target"] and all(s["reason"] for s in m["survivors"]) and not m.get("stale_kept")
    import mutmut

    runs: list[dict] = []  # the distinct runs the modules' verdicts come from, in module order
    for m in modules.values():
        if m.get("run") and m["run"] not in runs:
            runs.append(m["run"])
    data = {"tool": f"mutmut {mutmut.__version__}", "runs": runs, "note": note, "modules": modules,
            "first_run": {p: dict(zip(("killed", "survived", "no_tests", "total"), b, strict=True))
                          for p, b in BEFORE.items()}}
    from mgrpo_env import strict_json  # where it is used: the top level imports none of the project

    (out / "mutation.json").write_text(strict_json.dumps(data, indent=1) + "\n")
    lines = [
        "# Mutation testing",
        "",
        f"`make mutation` ({data['tool']}). Detected = killed + "
        "timed out, over all mutants (a mutant no selected test reaches counts as not detected). "
        "The verdicts come from these runs:",
        "",
        *(_run_line(r, modules) for r in runs),
        *_first_run_lines(modules),
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
              "modules, their first complete run (commit 1826326), before the tests its survivors prompted; for "
              "the speed modules (issue 34), their first run (the tests of commit 91f3a93), before the tests its "
              "survivors prompted; for the teacher and the vLLM watchdog (issue 46), their first complete run "
              "(commit fa872d5), before the tests its survivors prompted; for the run storage and the OpenEnv "
              "client (issue 53), their first run (commit ea3d081's storage tests; the client's first in-process "
              "tests), before the tests its survivors prompted."]
    lines += ["", "## Survivors kept", "",
              "Each is equivalent to the original, differs only on a CUDA device, or differs only in a timing "
              "no test on a shared machine can tell (the reason says which); the reason is given "
              "under its diff.", ""]
    for path, m in modules.items():
        if m.get("stale_kept"):
            lines += [f"### `{path}`: stale KEPT entries", "", "Reasons in benchmarks/mutation_kept.py for mutants "
                      "this run killed or no longer has (renumbered? check the survivors' reasons): "
                      + ", ".join(f"`{n.rsplit('.', 1)[-1]}`" for n in m["stale_kept"]), ""]
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
    p.add_argument("--survivors", action="store_true",
                   help="with --only: rerun only the previous report's survivors of those modules (after adding "
                        "tests; every other verdict stands)")
    args = p.parse_args(argv)
    if args.survivors and not args.only:
        p.error("--survivors needs --only")
    previous_file = args.out / "mutation.json"
    previous = json.loads(previous_file.read_text()) if previous_file.exists() else {}
    given = sys.argv[1:] if argv is None else list(argv)
    if "--note" in given:  # the note is printed on its own
        at = given.index("--note")
        given = given[:at] + given[at + 2:]
    command = "make mutation" if argv is None and len(sys.argv) == 1 else " ".join(["benchmarks/mutation.py", *given])
    if args.no_run:  # the run that produced mutants/, as it recorded itself
        run_file = ROOT / "mutants" / RUN_FILE
        run = json.loads(run_file.read_text()) if run_file.exists() else None
        if not args.only and run and set(run.get("modules", TARGETS)) != set(TARGETS):
            # mutants/ holds verdicts of that run's modules only (mutmut resets the others): report those,
            # keep the others as the previous report has them (this once overwrote them with zeros)
            args.only = [path for path in TARGETS if path in run["modules"]]
    elif args.survivors:
        names = [s["mutant"] for path in args.only for s in previous["modules"][path]["survivors"]]
        run = run_mutmut(args.max_children, args.only, command, names=names)
    else:
        run = run_mutmut(args.max_children, args.only, command)
    if args.survivors:
        fresh = {path: {**m, "run": run} for path, m in rerun_survivors(previous, args.only).items()}
    else:
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
              + (f"  {unexplained} unexplained" if unexplained else "")
              + (f"  {len(m['stale_kept'])} stale KEPT" if m.get("stale_kept") else ""))
    print(f"wrote {args.out / 'mutation.json'} and {args.out / 'mutation.md'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
