"""``mgrpo serve-env``: the hierarchy (or with ``--single`` the single-agent env) as an OpenEnv server.

    mgrpo serve-env --scenario wiki-hops [--single] [--split stage2] [--host 127.0.0.1] [--port 8000]
                    [--set num_entities=300] [--limit max_main_turns=8] [--max-sessions 64]
                    [--reveal-answers]

It opens the scenario's world once (shared by every session), binds the port (``--port 0``: a free
one), prints one JSON line ``{"url": ..., "env": ..., "scenario": ..., "split": ...}`` once clients
may connect, and serves until Ctrl-C or SIGTERM, then closes every session and the world. The
server is :mod:`mgrpo_env.openenv_server` (openenv-core's); the client is
:class:`mgrpo_env.openenv_client.MGRPOEnvClient`. Needs the ``openenv`` extra.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import socket
from typing import Any

__all__ = ["add_serve_env_parser", "cmd_serve_env"]


def add_serve_env_parser(sub: Any) -> None:
    """The ``serve-env`` subcommand's arguments (``sub``: argparse's subparsers)."""
    se = sub.add_parser("serve-env", help="serve the env (hierarchy, or --single) over OpenEnv's HTTP/WebSocket protocol")
    se.add_argument("--scenario", default="wiki-hops")
    se.add_argument("--split", default="stage2", help="the split episodes draw their tasks from")
    se.add_argument("--single", action="store_true", help="the single-agent env instead of the hierarchy")
    se.add_argument("--host", default="127.0.0.1",
                    help="address to bind (default 127.0.0.1, loopback only; 0.0.0.0 serves every interface)")
    se.add_argument("--port", type=int, default=8000, help="port to bind (0: a free one, printed on the ready line)")
    se.add_argument("--config", default=None,
                    help="a train config (YAML): serve the env its runs train on (scenario and its options, "
                         "limits, rewards); --set and --limit override it")
    se.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a scenario option")
    se.add_argument("--limit", action="append", default=[], metavar="KEY=VALUE",
                    help="an episode limit (mgrpo_env.Limits field: max_main_turns=8, max_sub_turns=6, ...)")
    se.add_argument("--max-sessions", type=int, default=None, help="sessions served at once (default 64)")
    se.add_argument("--reveal-answers", action="store_true",
                    help="for evaluation tools: state() shows the task's gold answer, aliases, hops and metadata "
                         "while the episode runs (default: only once it is over)")
    se.add_argument("--session-timeout", type=float, default=None,
                    help="close a session idle this many seconds (default: only a disconnect closes one)")
    se.set_defaults(func=cmd_serve_env)


def cmd_serve_env(args: argparse.Namespace) -> int:
    import uvicorn

    from mgrpo_env.core import Limits
    from mgrpo_env.openenv_server import DEFAULT_MAX_SESSIONS, EnvSpec, create_app

    from .cli_support import interrupt_on_stop_signals, scenario_kwargs
    from .eval_cli import build_scenario

    env_kwargs: dict[str, Any] = {}
    if args.config:  # the env a train config's runs train on; --set and --limit override it
        from mgrpo_algo.core.config import load_config
        from mgrpo_algo.training.trainer import env_options, reward_config

        config = load_config(args.config)
        scenario = build_scenario(config.scenario, {**config.scenario_kwargs, **scenario_kwargs(args.set)})
        env_kwargs = env_options(config, reward_config(config, scenario))
    else:
        scenario = build_scenario(args.scenario, scenario_kwargs(args.set))
    try:
        limits = dataclasses.replace(env_kwargs.pop("limits", Limits()), **scenario_kwargs(args.limit))
    except (TypeError, ValueError) as exc:
        raise SystemExit(f"mgrpo: bad --limit: {exc}") from None
    # Bound before the world opens: a port in use is one line, not a traceback after a slow start.
    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as exc:
        sock.close()
        raise SystemExit(f"mgrpo: cannot bind {args.host}:{args.port}: {exc}") from None
    with sock, scenario.open() as world:
        spec = EnvSpec(scenario, args.split, world, limits, env_kwargs, reveal_answers=args.reveal_answers)
        app = create_app(spec, single=args.single, max_sessions=args.max_sessions or DEFAULT_MAX_SESSIONS,
                         session_timeout_s=args.session_timeout)
        sock.listen(128)  # connections wait in the backlog until uvicorn accepts them
        host, port = sock.getsockname()[:2]
        print(json.dumps({"url": f"http://{host}:{port}", "env": "single" if args.single else "hierarchy",
                          "scenario": getattr(scenario, "name", args.scenario), "split": args.split,
                          "reveal_answers": args.reveal_answers}), flush=True)
        # uvicorn catches Ctrl-C and SIGTERM itself and shuts down gracefully (every connection closed,
        # so every session and its env); then it restores the handlers it found and raises the signal
        # again: ours turn it into KeyboardInterrupt, so the world below is closed too.
        interrupt_on_stop_signals()
        config = uvicorn.Config(app, log_level="warning", ws="websockets-sansio", lifespan="on")
        with contextlib.suppress(KeyboardInterrupt):
            uvicorn.Server(config).run(sockets=[sock])
    return 0


class ServeEnvProcess:
    """``mgrpo serve-env ARGS`` in a child process, for tests and benchmarks: ``start()`` waits for its
    ready line (``url``, ``ready``: that line as a dict), ``stop()`` sends SIGTERM (uvicorn's graceful
    shutdown: sessions closed, then the world) and kills it if it has not ended within ``timeout_s``.

    stderr goes to a file, not a pipe: a child blocked on a full pipe would look like a hang.
    """

    def __init__(self, *args: str, startup_timeout_s: float = 600.0) -> None:
        self.args = list(args)
        self.startup_timeout_s = startup_timeout_s
        self.proc: Any = None
        self.url = ""
        self.ready: dict[str, Any] = {}

    def start(self) -> ServeEnvProcess:
        import subprocess
        import sys
        import tempfile
        import threading
        import time

        self._err = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed in __exit__
        self.proc = subprocess.Popen([sys.executable, "-m", "mgrpo_algo.cli", "serve-env", *self.args],
                                     stdout=subprocess.PIPE, stderr=self._err, text=True)
        lines: list[str] = []
        # A reader thread, so that a child that prints nothing cannot block the wait below.
        threading.Thread(target=lambda: lines.extend(line for line in self.proc.stdout if line.startswith("{")),
                         daemon=True).start()
        deadline = time.monotonic() + self.startup_timeout_s
        while not lines and self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if not lines:
            self.stop()
            raise RuntimeError(f"mgrpo serve-env {' '.join(self.args)} did not start (exit code {self.proc.returncode}, "
                               f"{time.monotonic() - deadline + self.startup_timeout_s:.0f} s): {self.stderr()[-3000:]}")
        self.ready = json.loads(lines[0])
        self.url = self.ready["url"]
        return self

    def stderr(self) -> str:
        self._err.flush()
        self._err.seek(0)
        return self._err.read()

    def stop(self, timeout_s: float = 60.0) -> int:
        """Stop the server; its exit code (-9 when it had to be killed)."""
        import signal
        import subprocess

        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def __enter__(self) -> ServeEnvProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._err.close()
