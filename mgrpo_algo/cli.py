"""The ``mgrpo`` command line.

Commands available now:
    mgrpo eval  --scenario wiki-hops --split stage2/test --agent oracle [--out runs/demo]
    mgrpo eval  --config configs/demo.yaml --agent configs/demo-warm-start [--set eval.limit=20] [--out DIR]
                --agent {oracle,scenario-oracle,random,FOLDER,main=PATH,sub=PATH,single=PATH}
    mgrpo serve --scenario wiki-hops            # serve the offline world on 127.0.0.1 until Ctrl-C
    mgrpo serve-env --scenario wiki-hops [--single] --port 8000   # the env over OpenEnv (HTTP/WebSocket)
    mgrpo view RUN_DIR                          # a static HTML page of the run's episodes
    mgrpo train --config configs/tiny.yaml [--set mode=frozen-sub --set main.learner.lr=1e-4] [--resume]
    mgrpo train --config configs/tiny.yaml --placement processes --store redis://127.0.0.1:6379 [--staleness 1]
    mgrpo compare --config configs/tiny.yaml --seeds 3 --out runs/compare [--modes mgrpo,frozen-sub,single-agent]
    mgrpo warm-start --config configs/demo.yaml --from configs/oracle-warm-start --out DIR [--shared | --refresh]
    mgrpo config [main.learner eval] [--config configs/qwen2.5-0.5b.yaml]   # every field, default, doc

Scenario options are passed as ``--set key=value`` (values parsed as YAML scalars), for example
``serve --set seed=1 --set num_entities=500``; in ``eval`` ``--set`` takes config fields, and a key
that is not one is a scenario option (``scenario_kwargs.KEY``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["main"]


def _cmd_train(args: argparse.Namespace) -> int:
    from mgrpo_env.tool_health import backend_failure_line

    from .core.config import MODES, load_config
    from .training.preflight import PreflightError, preflight
    from .training.run_folder import check_fresh_run_folder, clear_run_folder

    if args.placement is None and (args.store or args.staleness):
        print("mgrpo: --store and --staleness need --placement (decoupled role workers)", file=sys.stderr)
        return 2
    # the flags are shorthands for the config's placement section
    flags = [f"placement.{name}={value}" for name, value in
             (("kind", args.placement), ("store", args.store), ("staleness", args.staleness or None)) if value is not None]
    if args.resume:
        flags.append("resume=true")
    try:
        config = load_config(args.config, [*args.set, *flags])
    except (ValueError, OSError) as exc:
        print(f"mgrpo: bad config: {exc}", file=sys.stderr)
        return 2
    try:  # before any model, tokenizer or demonstration is built
        check_fresh_run_folder(config.out_dir, resume=args.resume, overwrite=args.overwrite,
                               storage=config.placement.storage)
        warnings = preflight(config)
    except PreflightError as exc:
        print(f"mgrpo: {exc}", file=sys.stderr)
        return 2
    _print_warnings(warnings)
    if args.overwrite:
        cleared = clear_run_folder(config.out_dir)
        if cleared:
            print(f"--overwrite: removed {', '.join(cleared)} from {config.out_dir}", flush=True)
    from torch.utils.tensorboard import SummaryWriter

    from .experiments.compare import log_scalars
    from .training.run_failures import stop_line
    from .training.trainer import Trainer

    # tensorboard --logdir OUT_DIR/tb; flushed every few seconds, so a crashed run keeps its scalars.
    # Opened at the first iteration: a run refused before it starts leaves no empty log folder.
    writers: list[Any] = []
    backend_totals: dict[str, int] = {}

    def log(metrics: dict[str, Any]) -> None:
        if not writers:
            writers.append(SummaryWriter(log_dir=str(Path(config.out_dir) / "tb"), flush_secs=5))
        log_scalars(writers[0], metrics, int(metrics["iteration"]))
        role = MODES[config.mode].roles[0]  # the main (or single) agent
        print(
            f"iter {metrics['iteration']:>3} {metrics['split']:<13} {role} reward {metrics[f'{role}/reward_mean']:.3f} "
            f"acc {metrics[f'{role}/accuracy']:.3f} | {metrics['time/iteration']:.1f}s "
            f"(gen {metrics['time/generation']:.1f}s, tools {metrics['time/tools']:.1f}s summed over threads, "
            f"update {metrics['time/update']:.1f}s)",
            flush=True,
        )
        failures = {k.rsplit("/", 1)[1].replace("_", " "): int(v) for k, v in metrics.items()
                    if k.startswith("tools/backend_failures/")}
        for kind, n in failures.items():
            backend_totals[kind] = backend_totals.get(kind, 0) + n
        if failures:
            print(backend_failure_line(failures) + f" in iteration {metrics['iteration']}", flush=True)

    # the folders whose file system a full disk would stop the run on (a URL storage is not a disk here)
    written = [config.out_dir, config.placement.storage]
    try:
        trainer = Trainer(config, log=log)
    except ValueError as exc:
        print(f"mgrpo: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        stop = stop_line(exc, written)
        if stop is None:
            raise
        print(f"mgrpo: {stop[0]}; rerun once {stop[1]}", file=sys.stderr)
        return 1
    with trainer:
        first = trainer.iteration  # a resumed run starts after the iterations already committed
        try:
            history = trainer.run()
        except Exception as exc:
            stop = stop_line(exc, written)
            if stop is None:
                raise
            print(f"mgrpo: {stop[0]}; the iterations committed so far are kept: rerun with --resume once {stop[1]}",
                  file=sys.stderr)
            return 1
    for writer in writers:
        writer.close()
    done = f"{len(history)} iterations" if not first else f"{len(history)} iterations this run ({first + len(history)} in all, resumed after {first})"
    print(backend_failure_line(backend_totals))
    print(f"{done}; metrics in {config.out_dir}/metrics.jsonl, episodes in {config.out_dir}/episodes.jsonl, "
          f"TensorBoard in {config.out_dir}/tb")
    return 0


def _print_warnings(lines: Sequence[str]) -> None:
    for line in lines:
        print(f"mgrpo: warning: {line}", file=sys.stderr, flush=True)


def _cmd_compare(args: argparse.Namespace) -> int:
    import shlex

    from mgrpo_env.tool_health import backend_failure_line

    from .core.config import load_config
    from .core.modes import mode_names
    from .experiments.compare import check_compare, format_table, run_compare
    from .training.preflight import PreflightError, check_writable, preflight

    modes = [m.strip() for m in (args.modes or ",".join(mode_names())).split(",") if m.strip()]
    try:
        config = load_config(args.config, args.set)
        check_compare(config, args.seeds, modes)
    except (ValueError, OSError) as exc:
        print(f"mgrpo: bad config: {exc}", file=sys.stderr)
        return 2
    try:
        warnings = preflight(config, check_eval=True)
        check_writable(args.out, "output folder (--out)")
    except PreflightError as exc:
        print(f"mgrpo: {exc}", file=sys.stderr)
        return 2
    _print_warnings(warnings)
    command = shlex.join([*shlex.split(args.prog), "compare", *(["--config", args.config] if args.config else []),
                          *[part for item in args.set for part in ("--set", item)],
                          "--seeds", str(args.seeds), "--out", args.out, "--modes", ",".join(modes),
                          *(["--jobs", str(args.jobs)] if args.jobs != 1 else [])])
    summary = run_compare(config, seeds=args.seeds, out_dir=args.out, modes=modes, progress=not args.quiet, command=command,
                          jobs=args.jobs, program=args.prog)
    failures = summary.get("tool_backend_failures") or {}
    if failures:  # first, where it cannot be missed
        print(backend_failure_line(failures))
    print(format_table(summary))
    print(summary["verdict"]["text"])
    print(backend_failure_line(failures))
    print(f"wrote {args.out}/summary.json, report.md, headline.png and the detail figures; TensorBoard: tensorboard --logdir {args.out}/tb")
    return 0


def _cmd_config(args: argparse.Namespace) -> int:
    from .config_doc import config_fields, format_fields
    from .core.config import load_config

    current = None
    if args.config or args.set:
        try:
            current = load_config(args.config, args.set)
        except (ValueError, OSError) as exc:
            print(f"mgrpo: bad config: {exc}", file=sys.stderr)
            return 2
    paths = [f.path for f in config_fields()]
    unknown = [p for p in args.prefix if not any(q == p or q.startswith((p + ".", p + "[")) for q in paths)]
    if unknown:
        print(f"mgrpo: no config field {unknown[0]!r} (mgrpo config lists them all)", file=sys.stderr)
        return 2
    print(format_fields(args.prefix, current=current, brief=args.brief))
    return 0


def _cmd_warm_start(args: argparse.Namespace) -> int:
    import mgrpo_scenarios

    from .core.config import load_config
    from .policies.models import ROLES
    from .policies.prebuilt import export_models
    from .training.trainer import oracle_stage_paths, role_model_paths

    try:
        config = load_config(args.config, args.set)
        scenario = mgrpo_scenarios.get(config.scenario, **config.scenario_kwargs)
    except (ValueError, OSError, KeyError, TypeError) as exc:
        print(f"mgrpo: bad config: {exc}", file=sys.stderr)
        return 2
    teacher = config.warm_start.teacher
    if args.shared:
        return _shared_warm_start(args, config, scenario)
    if args.refresh and (not args.from_dir or args.oracle_out):
        print("mgrpo: --refresh fine-tunes a prebuilt oracle clone: give --from DIR (and no --oracle-out)", file=sys.stderr)
        return 2
    if args.refresh:
        # The oracle's own demonstrations (the teacher with every rate 0), from a prebuilt oracle clone: a
        # clone brought up to a changed world in minutes, where stage 1 from scratch takes over an hour.
        for mistake in teacher.mistakes.values():
            mistake.rate, mistake.roles, mistake.question_kinds = 0.0, {}, {}
    elif args.from_dir and not teacher.enabled:
        print("mgrpo: --from trains the teacher stage, but warm_start.teacher has no rate above 0", file=sys.stderr)
        return 2
    if args.from_dir:
        # Stage 2 only (or the refresh), from a prebuilt stage-1 folder (the committed oracle clone): minutes, not an hour.
        from .learning.teacher_stage import teacher_warm_start
        from .policies.prebuilt import verify_folder

        for role in ROLES:
            verify_folder(Path(args.from_dir) / role)
        paths = {role: str(p) for role, p in teacher_warm_start(
            scenario, args.from_dir, Path(config.models_dir) / ("refresh" if args.refresh else "teacher"),
            config.warm_start, limits=config.limits, tools=config.tools, refresh=args.refresh).items()}
    else:
        for role in ROLES:
            getattr(config, role).model = ""  # always the config's own tiny models, warm-started
        paths = role_model_paths(config, scenario, list(ROLES))
        if args.oracle_out:
            oracle = export_models(oracle_stage_paths(config, list(ROLES)), args.oracle_out)
            print(f"wrote the oracle stage to {oracle} and {oracle}/SHA256SUMS")
    out = export_models(paths, args.out)
    print(f"wrote {out} ({', '.join(ROLES)}) and {out}/SHA256SUMS")
    return 0


def _shared_warm_start(args: argparse.Namespace, config: Any, scenario: Any) -> int:
    """``warm-start --shared``: one model for the main agent and the sub-agents (the shared-model
    baseline's start, played in both roles by ``ModeSpec.shares``), fine-tuned from ``--from``'s main
    model on both roles' teacher demonstrations; exported as ``OUT/main`` (the owner's folder, which
    the shared-model mode loads for both roles). A flag of this command, not a config field: the
    config's ``warm_start`` section, and so every existing stage's key, stays as it is."""
    from .learning.teacher_stage import SHARED_ROLES, shared_teacher_warm_start
    from .policies.prebuilt import export_models, verify_folder

    if not args.from_dir or args.oracle_out:
        print("mgrpo: --shared fine-tunes a prebuilt oracle stage: give --from DIR (and no --oracle-out)", file=sys.stderr)
        return 2
    try:
        for role in SHARED_ROLES:
            verify_folder(Path(args.from_dir) / role)
        path = shared_teacher_warm_start(scenario, args.from_dir, Path(config.models_dir) / "teacher-shared",
                                         config.warm_start, limits=config.limits, tools=config.tools)
    except (ValueError, OSError) as exc:  # ChecksumError is a ValueError
        print(f"mgrpo: {exc}", file=sys.stderr)
        return 2
    out = export_models({SHARED_ROLES[0]: path}, args.out)
    print(f"wrote {out} ({SHARED_ROLES[0]}: one model for {', '.join(SHARED_ROLES)}) and {out}/SHA256SUMS")
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from mgrpo_scenarios import NeedsBuilding

    from .experiments.cli_support import build_scenario_from_pairs, interrupt_on_stop_signals

    scenario = build_scenario_from_pairs(args.scenario, args.set)
    if isinstance(scenario, NeedsBuilding):
        print(f"world at {scenario.build()}")
    try:
        # Loopback by default; another address only when asked (the site then serves every client
        # that can reach it). Scenarios whose open() takes no host serve where they always do.
        opened = scenario.open(host=args.host) if args.host != "127.0.0.1" else scenario.open()
    except TypeError:
        print(f"mgrpo: scenario {args.scenario!r} cannot serve on --host {args.host}", file=sys.stderr)
        return 2
    with opened as world:
        # "url" is what agents see (a stable origin for wiki-hops); "served_url" is where a browser finds it.
        shown = {"url": getattr(world, "url", None), "served_url": getattr(world, "served_url", None)}
        # Before the ready line: a caller may signal as soon as it reads it, and a process started with
        # SIGINT ignored would drop a Ctrl-C that came before the handler (a race lost under load).
        interrupt_on_stop_signals()
        try:
            print(json.dumps({**shown, "tools": sorted(world.tools)}), flush=True)
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    from .experiments.status import format_status, run_status

    try:
        status = run_status(args.run_dir, args.store, args.storage)
    except (OSError, ValueError) as exc:
        print(f"mgrpo: {exc}", file=sys.stderr)
        return 2
    from mgrpo_env import strict_json

    print(strict_json.dumps(status, default=str) if args.json else format_status(status))
    return 0


def _cmd_view(args: argparse.Namespace) -> int:
    from .experiments.view import write_view

    run_dir = Path(args.run_dir)
    target = Path(args.out) if args.out else (run_dir.parent if run_dir.is_file() else run_dir) / "view.html"
    existed = target.exists()
    try:
        out, shown, total = write_view(args.run_dir, args.out, max_episodes=args.max_episodes, scenario=args.scenario)
    except (OSError, ValueError, KeyError) as exc:  # KeyError: an unknown --scenario, its message names the known
        print(f"mgrpo: {exc.args[0] if isinstance(exc, KeyError) else exc}", file=sys.stderr)
        return 2
    print(f"wrote {out} ({shown} of {total} episodes){'; it replaced the previous one' if existed else ''}")
    return 0


def _parser(prog: str = "mgrpo") -> argparse.ArgumentParser:
    from .core.modes import mode_names  # the tables, so a registered mode or placement is listed
    from .distributed.placement import PLACEMENTS

    parser = argparse.ArgumentParser(prog=prog, description="Train and evaluate multi-agent deep-research systems with M-GRPO.")
    sub = parser.add_subparsers(dest="command", required=True)

    from .experiments.eval_cli import add_eval_parser

    add_eval_parser(sub)
    from .experiments.serve_env_cli import add_serve_env_parser

    add_serve_env_parser(sub)

    tr = sub.add_parser("train", help="train with M-GRPO or a baseline (mode in the config)")
    tr.add_argument("--config", default=None, help="YAML file of mgrpo_algo.core.config.TrainConfig fields")
    tr.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config field, dotted for nested ones (main.learner.lr=1e-4)")
    tr.add_argument("--placement", default=None, metavar="{" + ",".join(PLACEMENTS.names()) + "}",
                    help="run each role on its own server (decoupled M-GRPO): in this process, one process per "
                    "role, or Ray actors; default: the single-process trainer")
    tr.add_argument("--store", default=None, help="shared statistics store: sqlite:PATH (default: OUT_DIR/stats.sqlite) "
                    "or redis://HOST:PORT[/DB]")
    tr.add_argument("--staleness", type=int, default=0,
                    help="0: synchronized (the sub learner waits for the main statistics of the same iteration); "
                    "n > 0: it may lag up to n iterations")
    tr.add_argument("--resume", action="store_true",
                    help="continue the run in out_dir after its last committed iteration (same config; any "
                    "placement: every role worker goes back to its checkpoint of that iteration)")
    tr.add_argument("--overwrite", action="store_true",
                    help="start afresh in a used out_dir: its metrics, episodes, checkpoints, loop state and final "
                    "models are removed first (without it, a used out_dir is refused)")
    tr.set_defaults(func=_cmd_train)

    cp = sub.add_parser("compare", help="M-GRPO vs frozen-sub vs single-agent at the same rollout budget, over seeds")
    cp.add_argument("--config", default=None, help="YAML file of mgrpo_algo.core.config.TrainConfig fields (eval: held-out settings)")
    cp.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config field, dotted for nested ones (eval.limit=50)")
    cp.add_argument("--seeds", type=int, default=3, help="seeds per mode: config seed, seed + 1, ...")
    cp.add_argument("--out", default="runs/compare", help="folder for summary.json, report.md, the figures (headline.png, ...), tb/, runs")
    cp.add_argument("--modes", default=None,
                    help=f"comma-separated modes to compare (default: every registered mode: {','.join(mode_names())})")
    cp.add_argument("--quiet", action="store_true", help="no progress bars")
    cp.add_argument("--jobs", type=int, default=1,
                    help="processes: each (seed, mode) run and the reference evaluation go longest first to "
                         "the least loaded (same numbers as 1; each uses torch_threads)")
    cp.set_defaults(func=_cmd_compare)

    cf = sub.add_parser("config", help="every config field (the TrainConfig tree) with its default and its doc")
    cf.add_argument("prefix", nargs="*", help="only the fields under these (main.learner, eval, limits.max_main_turns)")
    cf.add_argument("--config", default=None, help="also show the values this YAML file sets where they differ")
    cf.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a field (as train's --set)")
    cf.add_argument("--brief", action="store_true", help="only the first sentence of each doc")
    cf.set_defaults(func=_cmd_config)

    ws = sub.add_parser("warm-start", help="train a config's warm start once and export it with checksums")
    ws.add_argument("--config", required=True, help="YAML file of TrainConfig fields (its warm_start section)")
    ws.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field")
    ws.add_argument("--out", required=True, help="folder for <role>/ model folders and SHA256SUMS (replaced)")
    ws.add_argument("--from", dest="from_dir", default="",
                    help="train only the teacher stage, from this prebuilt oracle-stage folder (<role>/ + SHA256SUMS)")
    ws.add_argument("--oracle-out", default="", help="also export the oracle stage (stage 1) to this folder")
    ws.add_argument("--refresh", action="store_true",
                    help="with --from: fine-tune the prebuilt oracle clone on the oracle's own demonstrations (the "
                    "teacher stage's epochs, no mistakes): the clone brought up to a changed world")
    ws.add_argument("--shared", action="store_true",
                    help="with --from: one model for the main agent and the sub-agents, fine-tuned from --from's main "
                    "on both roles' teacher demonstrations (the shared-model baseline's start), exported as OUT/main")
    ws.set_defaults(func=_cmd_warm_start)

    sv = sub.add_parser("serve", help="serve a scenario's world on 127.0.0.1 (or --host) until interrupted")
    sv.add_argument("--scenario", default="wiki-hops")
    sv.add_argument("--host", default="127.0.0.1",
                    help="address to bind (default 127.0.0.1, loopback only; 0.0.0.0 serves every interface)")
    sv.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    sv.set_defaults(func=_cmd_serve)

    st = sub.add_parser("status", help="where a run stands: the loop's commit, each worker's, the store's view of each role")
    st.add_argument("run_dir", help="the run folder (out_dir)")
    st.add_argument("--store", default=None, help="the store spec (default: the run's, from its config.json)")
    st.add_argument("--json", action="store_true", help="print the status as one JSON object")
    st.add_argument("--storage", default=None, metavar="PATH_OR_URL",
                    help="where the workers' state is (default: the run's placement.storage, else RUN_DIR)")
    st.set_defaults(func=_cmd_status)

    vw = sub.add_parser("view", help="render a run's episodes.jsonl as one static HTML page")
    vw.add_argument("run_dir", help="run folder holding episodes.jsonl (or the JSONL file itself)")
    vw.add_argument("--out", default=None, help="HTML file to write (default: RUN_DIR/view.html)")
    vw.add_argument("--max-episodes", type=int, default=2000, help="render at most this many episodes")
    vw.add_argument("--scenario", default=None,
                    help="the episodes' scenario, for the outcome filters and the first wrong turn (default: the "
                         "scenario of RUN_DIR/config.json, where there is one)")
    vw.set_defaults(func=_cmd_view)
    return parser


#: The commands that run torch on a config: their ``kernels.pin`` is applied before torch loads.
_PINNED_COMMANDS = ("train", "compare", "eval", "warm-start")


def _pin_kernels(args: argparse.Namespace, *, reexec: bool) -> None:
    """Put the config's ``kernels.pin`` in this process's environment (inherited by every child) before
    anything imports torch; from the command line (``reexec``), a process where torch is already loaded
    starts again pinned, a library caller gets one line (SystemExit) instead of an unpinned run."""
    from .core.kernels import KernelPinError, ensure_pinned, pin_of_config

    if args.command not in _PINNED_COMMANDS:
        return
    try:
        notice = ensure_pinned(pin_of_config(getattr(args, "config", None), getattr(args, "set", [])), reexec=reexec)
    except (KernelPinError, ValueError) as exc:
        raise SystemExit(f"mgrpo: {exc}") from None
    if notice:
        print(notice, file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None, *, prog: str = "mgrpo") -> int:
    """Run one command; a usage mistake (``SystemExit`` with a message) prints that one line to
    stderr and returns 2, as argparse does for its own errors, never a traceback.

    ``prog`` is how the command was started, for usage lines and the command lines a run records to
    reproduce it: a script that registers a mode, placement or tool and then hands its arguments
    here (``benchmarks/shared_model.py``) passes its own, since the installed ``mgrpo`` would not know
    what the script registered."""
    args = _parser(prog).parse_args(argv)
    args.prog = prog
    try:
        _pin_kernels(args, reexec=argv is None)
        return int(args.func(args))
    except SystemExit as exc:
        if not isinstance(exc.code, str):
            raise
        print(exc.code, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
