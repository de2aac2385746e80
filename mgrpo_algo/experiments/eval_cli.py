"""``mgrpo eval``: one agent on a scenario split, from the same config tree and through the same
evaluation as ``mgrpo compare``.

The settings are a :class:`~mgrpo_algo.core.config.TrainConfig` (``--config FILE`` and ``--set
dotted.key=value``): the scenario and its options, the env ``limits``, the ``eval`` section (split,
limit, samples, temperature, greedy, max_new_tokens), each role's ``generation`` and ``learner.device``
/ ``dtype``, ``max_workers`` and ``seed``. The older flags are shorthands for those fields, and a
``--set`` key that is not a config field is a scenario option (``scenario_kwargs.KEY``), as before.
Learned models are evaluated by :func:`~mgrpo_algo.experiments.compare.evaluate_policies` over
:func:`~mgrpo_algo.experiments.compare.evaluation_policies`, the function ``compare`` runs for its
start and after evaluations, so the same models and config give the same episodes and numbers.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

from mgrpo_env import strict_json
from mgrpo_env.roles import ROLES

__all__ = ["AGENTS", "AGENT_FORMS", "add_eval_parser", "build_scenario", "cmd_eval", "resolve_agent"]

AGENTS = ("oracle", "scenario-oracle", "random")

AGENT_FORMS = """\
--agent forms (who answers):
  oracle               scripted main and sub-agents through the AEC env (the default)
  scenario-oracle      the scenario's own solver calling the tools directly (no env)
  random               random well-formed protocol actions
  FOLDER               learned models in FOLDER/main and FOLDER/sub (each a Hugging Face folder, or
                       ROLE/model inside it: runs/RUN/final, runs/RUN/checkpoints/iter-N,
                       configs/demo-warm-start); a FOLDER with only single/ (or mode=single-agent)
                       evaluates the single agent
  main=PATH,sub=PATH   the hierarchy from two model folders or hub names
  single=PATH          the single-agent baseline (one agent with every tool)

Settings come from the config tree of `mgrpo train` / `mgrpo compare` (--config FILE, --set KEY=VALUE):
limits.*, eval.split / limit (0 = all) / samples / temperature / greedy / max_new_tokens,
<role>.generation.*, <role>.learner.device / dtype, max_workers, seed. A --set key that is not a
config field is a scenario option (--set num_entities=500 = --set scenario_kwargs.num_entities=500).
The same models and config give the same numbers as `mgrpo compare`'s start evaluation.
"""

# flag -> config field it is a shorthand for (None: not given, the config's value stands)
_SHORTHANDS = {"scenario": "scenario", "split": "eval.split", "limit": "eval.limit", "k": "eval.samples",
               "temperature": "eval.temperature", "max_new_tokens": "eval.max_new_tokens", "seed": "seed",
               "workers": "max_workers"}


def add_eval_parser(sub: Any) -> None:
    """The ``eval`` subcommand's arguments (``sub``: argparse's subparsers)."""
    ev = sub.add_parser("eval", help="evaluate an agent (scripted or learned models) on a scenario split",
                        epilog=AGENT_FORMS, formatter_class=argparse.RawDescriptionHelpFormatter)
    ev.add_argument("--config", default=None, help="YAML file of mgrpo_algo.core.config.TrainConfig fields "
                    "(the same file as train / compare: limits, eval section, generation, devices)")
    ev.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config field (limits.max_main_turns=5, eval.samples=4), or a scenario option")
    ev.add_argument("--agent", default="oracle", help="oracle, scenario-oracle, random, FOLDER, main=PATH,sub=PATH "
                    "or single=PATH (see below)")
    ev.add_argument("--scenario", default=None, help="= --set scenario=NAME (default wiki-hops; mgrpo_scenarios.names())")
    ev.add_argument("--split", default=None, help="= --set eval.split=SPLIT (default stage2/test, or the scenario's "
                    "default split when it has no stage2/test; join several with '+')")
    ev.add_argument("--limit", type=int, default=None, help="= --set eval.limit=N: the first N tasks (default 100; 0 = all)")
    ev.add_argument("--k", type=int, default=None, help="= --set eval.samples=K: rollouts per question (mean@k, pass@k)")
    ev.add_argument("--temperature", type=float, default=None, help="= --set eval.temperature=T (default 0: greedy)")
    ev.add_argument("--max-new-tokens", type=int, default=None,
                    help="= --set eval.max_new_tokens=N (default 0: each role's generation.max_new_tokens)")
    ev.add_argument("--seed", type=int, default=None, help="= --set seed=N: episode and sampling seeds (default 0)")
    ev.add_argument("--workers", type=int, default=None, help="= --set max_workers=N: threads stepping envs (tool calls)")
    ev.add_argument("--runs", type=int, default=1, help="independent runs to average, seeds SEED + 1000 * run (the paper uses 3)")
    ev.add_argument("--data", default=None, help="= --set scenario_kwargs.data=PATH: the benchmark's released files")
    ev.add_argument("--out", default=None, help="folder for summary.json, outcomes.jsonl and episodes.jsonl")
    ev.add_argument("--resume", action="store_true",
                    help="continue an interrupted evaluation: the episodes already in OUT/episodes.jsonl are kept and not run again")
    ev.add_argument("--quiet", action="store_true", help="no progress bar")
    ev.set_defaults(func=cmd_eval)


def build_scenario(name: str, kwargs: dict[str, Any]) -> Any:
    """``mgrpo_scenarios.get(name, **kwargs)``; a mistake is one line (SystemExit with the message)."""
    import mgrpo_scenarios

    try:
        return mgrpo_scenarios.get(name, **kwargs)
    except KeyError as exc:
        raise SystemExit(f"mgrpo: {exc.args[0]}") from None
    except TypeError as exc:  # an unknown --set key, or a required one not given
        missing = re.search(r"missing \d+ required (?:positional |keyword-only )?arguments?: (.+)$", str(exc))
        if missing:
            names = re.findall(r"'(\w+)'", missing.group(1))
            how = " and ".join(f"--{n}" if n == "data" else f"--set {n}=..." for n in names)
            raise SystemExit(f"mgrpo: scenario {name!r} needs {how}"
                             + (" (the benchmark's released files)" if "data" in names else "")) from None
        raise SystemExit(f"mgrpo: bad option for scenario {name!r}: {exc}") from None
    except (OSError, ValueError) as exc:  # a missing --data path, an unreadable or malformed file
        raise SystemExit(f"mgrpo: scenario {name!r}: {exc}") from None


def _overrides(args: argparse.Namespace) -> list[str]:
    """``--set`` items as config overrides (non-config keys become scenario options), then the flags."""
    from ..core.config import TrainConfig

    names = {f.name for f in fields(TrainConfig)}
    out = []
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"mgrpo: --set expects key=value, got {item!r}")
        key = key.strip()
        if key == "seed":  # before the config tree, --set seed=N was the world's seed: never guess which
            raise SystemExit("mgrpo: --set seed is ambiguous in eval: use --seed N (episodes and sampling) or "
                             "--set scenario_kwargs.seed=N (the world)")
        out.append(f"{key}={value}" if key.split(".")[0] in names else f"scenario_kwargs.{key}={value}")
    for flag, field_name in _SHORTHANDS.items():
        value = getattr(args, flag)
        if value is not None:
            out.append(f"{field_name}={json.dumps(value)}")  # JSON: a YAML scalar of the right type
    if args.data:
        out.append(f"scenario_kwargs.data={json.dumps(args.data)}")
    return out


def _role_model(folder: Path, role: str) -> str | None:
    """A role's model inside an agent folder: ``ROLE/model`` (a learner checkpoint) or ``ROLE``."""
    for candidate in (folder / role / "model", folder / role):
        if (candidate / "config.json").is_file():
            return str(candidate)
    return None


def resolve_agent(spec: str, mode: str) -> dict[str, str] | None:
    """The model paths of ``--agent``: ``{"main", "sub"}`` or ``{"single"}``; None for a scripted agent."""
    if spec in AGENTS:
        return None
    if "=" in spec:
        paths: dict[str, str] = {}
        for part in spec.split(","):
            role, sep, path = part.partition("=")
            if not sep or role.strip() not in ROLES or not path.strip():
                raise SystemExit(f"mgrpo: --agent {spec!r}: expected main=PATH,sub=PATH or single=PATH, got {part!r}")
            paths[role.strip()] = path.strip()
        if set(paths) not in ({"main", "sub"}, {"single"}):
            raise SystemExit(f"mgrpo: --agent {spec!r} names {', '.join(sorted(paths))}; give main and sub "
                             "(the hierarchy) or single alone")
        return paths
    folder = Path(spec)
    if not folder.is_dir():
        raise SystemExit(f"mgrpo: unknown --agent {spec!r}; use one of {', '.join(AGENTS)}, a folder of role models, "
                         "main=PATH,sub=PATH or single=PATH (mgrpo eval --help)")
    found = {role: p for role in ROLES if (p := _role_model(folder, role))}
    if mode == "single-agent" or ("single" in found and not {"main", "sub"} & set(found)):
        if "single" not in found:
            raise SystemExit(f"mgrpo: --agent {spec!r} has no model for single (expected FOLDER/single[/model])")
        return {"single": found["single"]}
    missing = {"main", "sub"} - set(found)
    if missing:
        raise SystemExit(f"mgrpo: --agent {spec!r} has no model for {', '.join(sorted(missing))} "
                         "(expected FOLDER/main[/model] and FOLDER/sub[/model], main=PATH,sub=PATH, or single=PATH)")
    return {"main": found["main"], "sub": found["sub"]}


def _load(args: argparse.Namespace) -> tuple[Any, Any, dict[str, str] | None]:
    """The config, the scenario and the agent's model paths, every mistake one line."""
    import mgrpo_scenarios

    from ..core.config import EvalConfig, load_config
    from ..training.preflight import PreflightError, check_models_and_devices

    try:
        config = load_config(args.config, _overrides(args))
    except (ValueError, OSError) as exc:
        raise SystemExit(f"mgrpo: bad config: {exc}") from None
    paths = resolve_agent(args.agent, config.mode)
    scenario = build_scenario(config.scenario, dict(config.scenario_kwargs))
    splits = list(scenario.splits())
    default = scenario.default_split if isinstance(scenario, mgrpo_scenarios.HasDefaultSplit) else None
    if config.eval.split == EvalConfig.split and config.eval.split not in splits and default:
        config.eval.split = default  # a scenario without stage2/test (qa files, benchmarks) has its own
    unknown = [p for p in mgrpo_scenarios.split_parts(config.eval.split) if p not in splits]
    if unknown:
        raise SystemExit(f"mgrpo: unknown split {unknown[0]!r}; {config.scenario} has {', '.join(splits)} "
                         "(--split or eval.split; join several with '+')")
    if paths is not None:
        config.mode = "single-agent" if "single" in paths else ("mgrpo" if config.mode == "single-agent" else config.mode)
        for role, path in paths.items():
            getattr(config, role).model = path
        try:
            check_models_and_devices(config)
        except PreflightError as exc:
            raise SystemExit(f"mgrpo: --agent: {exc}") from None
    return config, scenario, paths


def _scripted(args: argparse.Namespace, config: Any, scenario: Any) -> dict[str, Any] | None:
    """The policies of ``oracle`` / ``random`` (None for ``scenario-oracle``, which runs without the env)."""
    from mgrpo_env.scripted import OraclePolicy, RandomPolicy
    from mgrpo_scenarios import ShipsOracle

    if args.agent == "scenario-oracle":
        if not isinstance(scenario, ShipsOracle):
            raise SystemExit(f"mgrpo: scenario {config.scenario!r} ships no oracle; use --agent random or a model folder")
        return None
    if args.agent == "random":
        return {"main": RandomPolicy("main", seed=config.seed), "sub": RandomPolicy("sub", seed=config.seed + 1)}
    try:
        return {"main": OraclePolicy(scenario, "main"), "sub": OraclePolicy(scenario, "sub")}
    except ValueError as exc:  # a scenario without the oracle's hooks
        raise SystemExit(f"mgrpo: --agent oracle: {exc}; use --agent random or a model folder") from None


def cmd_eval(args: argparse.Namespace) -> int:
    """``mgrpo eval``: check, evaluate (each finished episode on disk at once), print and write."""
    from mgrpo_env.episode import read_jsonl

    from ..training.preflight import PreflightError, check_browser_for, check_writable
    from .evaluate import evaluate, oracle_agent

    out = Path(args.out) if args.out else None
    try:  # before the world is built: an evaluation whose results cannot be kept does not start
        if out is not None:
            check_writable(out, "output folder (--out)")
    except PreflightError as exc:
        raise SystemExit(f"mgrpo: {exc}") from None
    if args.resume and out is None:
        raise SystemExit("mgrpo: --resume needs --out (the folder whose episodes.jsonl it continues)")
    if args.runs < 1:
        raise SystemExit(f"mgrpo: --runs must be >= 1, got {args.runs}")
    config, scenario, paths = _load(args)
    policies = _scripted(args, config, scenario) if paths is None else None
    try:
        check_browser_for(scenario)
    except PreflightError as exc:
        raise SystemExit(f"mgrpo: {exc}") from None
    if args.agent == "scenario-oracle":
        report = evaluate(scenario, config.eval.split, oracle_agent(scenario), agent_name=args.agent,
                          limit=config.eval.limit or None, workers=config.max_workers, progress=not args.quiet)
        return _done(report, None, out, {})
    episodes = out / "episodes.jsonl" if out is not None else None
    previous = []
    if episodes is not None and episodes.exists():
        if not args.resume:
            raise SystemExit(f"mgrpo: {episodes} exists; continue it with --resume or choose another --out")
        previous = read_jsonl(episodes)
    elif episodes is not None:
        episodes.parent.mkdir(parents=True, exist_ok=True)
    if paths is not None:
        import torch
        import transformers

        from ..core.kernels import check_in_force

        torch.set_num_threads(config.torch_threads)
        check_in_force()
        transformers.utils.logging.disable_progress_bar()
    return _run(args, config, scenario, paths, policies, out, episodes, previous)


def _run(args: argparse.Namespace, config: Any, scenario: Any, paths: dict[str, str] | None,
         policies: dict[str, Any] | None, out: Path | None, episodes: Path | None, previous: list[Any]) -> int:
    from mgrpo_env.episode import write_jsonl

    from . import intervals as iv
    from .compare import evaluate_policies, evaluation_policies, greedy_em

    def make(cfg: Any, seed: int) -> dict[str, Any]:
        return policies if paths is None else evaluation_policies(cfg, paths, paths, seed)

    sink = episodes.open("a") if episodes is not None else None

    def keep(record: Any) -> None:  # each finished episode is on disk at once: Ctrl-C loses only unfinished ones
        if sink is not None:
            sink.write(strict_json.dumps(record.to_dict(), ensure_ascii=False) + "\n")
            sink.flush()

    runs, records, first, report, greedy = [], [], [], None, None
    e = config.eval
    try:
        for run in range(args.runs):  # the paper averages 3 runs
            seed = config.seed + 1000 * run
            report, run_records = evaluate_policies(config, scenario, make(config, seed), limit=e.limit, seed=seed,
                                                    progress=not args.quiet, name=args.agent, on_episode=keep,
                                                    previous=previous)
            runs.append(report)
            records += run_records
            first = first or run_records
        if paths is not None and e.temperature > 0 and e.greedy:  # as compare: greedy EM beside mean@k
            greedy = greedy_em(config, scenario, lambda cfg: make(cfg, config.seed), seed=config.seed, name=args.agent)
    except KeyboardInterrupt:
        kept = sum(1 for line in episodes.open() if line.strip()) if episodes is not None else 0
        where = f"kept {kept} finished episodes in {episodes}; finish with the same command and --resume" \
            if episodes is not None else "nothing kept (no --out)"
        print(f"\nmgrpo: interrupted: {where}", file=sys.stderr)
        return 130
    finally:
        if sink is not None:
            sink.close()
    extra: dict[str, Any] = {"samples": e.samples, "config": args.config, "overrides": list(args.set)}
    if paths is not None:  # models ran: what decides their float rounding (CPU, kernels, versions, threads)
        from ..core.kernels import kernel_state

        extra["provenance"] = kernel_state()
    if e.samples > 1:
        scores = iv.per_question(first)  # the first run's k samples per question
        extra.update({"mean_at_k": iv.mean_at_k(scores), "pass_at_k": iv.pass_at_k(scores), "questions": len(scores)})
    if greedy is not None:
        extra["greedy_em"] = greedy
    if args.runs > 1:
        ems = [r.exact_match for r in runs]
        mean = sum(ems) / len(ems)
        spread = (sum((x - mean) ** 2 for x in ems) / len(ems)) ** 0.5
        print(f"{args.runs} runs: exact match {mean:.3f} +- {spread:.3f} (population std); per run {ems}")
        extra["runs_exact_match"] = ems
    if episodes is not None:
        write_jsonl(episodes, records)  # in order, and without the copies of tasks an interruption left half done
    return _done(report, records, out, extra)


def _done(report: Any, records: list[Any] | None, out: Path | None, extra: dict[str, Any]) -> int:
    """Print the table (and mean@k / pass@k / greedy EM); write summary, outcomes (and episodes) under ``out``."""
    from .evaluate import write_report

    print(report.table())
    if "mean_at_k" in extra:
        k = extra["samples"]
        print(f"mean@{k} {extra['mean_at_k']:.3f}, pass@{k} {extra['pass_at_k']:.3f} "
              f"({extra['questions']} questions x {k} samples)")
    if "greedy_em" in extra:
        print(f"greedy exact match {extra['greedy_em']:.3f}")
    if out is not None:
        write_report(report, out, extra=extra)
        also = f" and {out / 'episodes.jsonl'}" if records is not None else ""
        print(f"wrote {out / 'summary.json'} and {out / 'outcomes.jsonl'}{also}")
    return 0
