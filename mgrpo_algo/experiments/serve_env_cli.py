"""``mgrpo serve-env``: the hierarchy (or with ``--single`` the single-agent env) as an OpenEnv server.

    mgrpo serve-env --scenario wiki-hops [--single] [--split stage2] [--host 127.0.0.1] [--port 8000]
                    [--set num_entities=300] [--limit max_main_turns=8] [--max-sessions 64]

It opens the scenario's world once (shared by every session), binds the port (``--port 0``: a free
one), prints one JSON line ``{"url": ..., "env": ..., "scenario": ..., "split": ...}`` once clients
may connect, and serves until Ctrl-C or SIGTERM, then closes every session and the world. The
server is :mod:`mgrpo_env.openenv_server` (openenv-core's); the client is
:class:`mgrpo_env.openenv_client.MGRPOEnvClient`. Needs the ``openenv`` extra.
"""

from __future__ import annotations

import argparse
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
    se.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a scenario option")
    se.add_argument("--limit", action="append", default=[], metavar="KEY=VALUE",
                    help="an episode limit (mgrpo_env.Limits field: max_main_turns=8, max_sub_turns=6, ...)")
    se.add_argument("--max-sessions", type=int, default=None, help="sessions served at once (default 64)")
    se.add_argument("--session-timeout", type=float, default=None,
                    help="close a session idle this many seconds (default: only a disconnect closes one)")
    se.set_defaults(func=cmd_serve_env)


def cmd_serve_env(args: argparse.Namespace) -> int:
    import uvicorn

    from mgrpo_env.core import Limits
    from mgrpo_env.openenv_server import DEFAULT_MAX_SESSIONS, EnvSpec, create_app

    from ..cli import _build_scenario, _scenario_kwargs

    try:
        limits = Limits(**_scenario_kwargs(args.limit))
    except (TypeError, ValueError) as exc:
        raise SystemExit(f"mgrpo: bad --limit: {exc}") from None
    scenario = _build_scenario(args.scenario, args.set)
    # Bound before the world opens: a port in use is one line, not a traceback after a slow start.
    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as exc:
        sock.close()
        raise SystemExit(f"mgrpo: cannot bind {args.host}:{args.port}: {exc}") from None
    with sock, scenario.open() as world:
        spec = EnvSpec(scenario, args.split, world, limits)
        app = create_app(spec, single=args.single, max_sessions=args.max_sessions or DEFAULT_MAX_SESSIONS,
                         session_timeout_s=args.session_timeout)
        sock.listen(128)  # connections wait in the backlog until uvicorn accepts them
        host, port = sock.getsockname()[:2]
        print(json.dumps({"url": f"http://{host}:{port}", "env": "single" if args.single else "hierarchy",
                          "scenario": args.scenario, "split": args.split}), flush=True)
        # uvicorn handles Ctrl-C and SIGTERM itself: it closes the connections (so each session and
        # its env), then returns here and the world closes.
        config = uvicorn.Config(app, log_level="warning", ws="websockets-sansio", lifespan="on")
        uvicorn.Server(config).run(sockets=[sock])
    return 0
