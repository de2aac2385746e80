"""What more than one command of the ``mgrpo`` command line needs: ``--set`` pairs, a scenario from
them, and stop signals that end a server through KeyboardInterrupt.

Here rather than in ``cli.py``: the commands that live in ``experiments/`` (``serve-env``) use them,
and a lower layer never imports the command line.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import yaml

__all__ = ["build_scenario_from_pairs", "interrupt_on_stop_signals", "scenario_kwargs"]


def scenario_kwargs(pairs: Sequence[str]) -> dict[str, Any]:
    """``["k=v", ...]`` as a dict, each value parsed as a YAML scalar; a pair without ``=`` is one line."""
    kwargs: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"mgrpo: --set expects key=value, got {pair!r}")
        kwargs[key.strip()] = yaml.safe_load(value)
    return kwargs


def build_scenario_from_pairs(name: str, pairs: Sequence[str]) -> Any:
    """The scenario ``name`` with the options ``pairs`` (``--set key=value``)."""
    from .eval_cli import build_scenario

    return build_scenario(name, scenario_kwargs(pairs))


def interrupt_on_stop_signals() -> None:
    """Ctrl-C and SIGTERM end a server through KeyboardInterrupt, so its world is closed.

    Set explicitly: a process started with SIGINT ignored (a parent that ignores it, nohup, some
    job runners) inherits SIG_IGN, and Python then installs no KeyboardInterrupt handler at all.
    """
    import signal

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for stop in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop, interrupt)
