"""Fast checks before a run does anything expensive.

``mgrpo train`` and ``mgrpo compare`` build tokenizers, models and oracle demonstrations (minutes)
before the first iteration. A mistake that makes the run impossible (an unreachable store, a missing
data file, an output folder that cannot be written, a split the scenario does not have) must be
found before that, in well under a second, with one line naming what is wrong:

    preflight(load_config(None, ["placement.kind=local", "placement.store=redis://127.0.0.1:1"]))
    # PreflightError: store redis://127.0.0.1:1 is unreachable: Error 111 connecting to 127.0.0.1:1. ...

Each check is a small function raising :class:`PreflightError` (a ``ValueError``).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from ..core.config import TrainConfig

__all__ = ["PreflightError", "preflight", "check_store", "check_writable", "check_scenario"]


class PreflightError(ValueError):
    """A run cannot start; the message is one line naming the path, address or field at fault."""


def check_writable(folder: str | Path, what: str) -> None:
    """``folder`` can be written: it exists and takes a file, or its nearest existing ancestor is a
    writable folder (nothing is created here)."""
    path = Path(folder).expanduser().absolute()
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise PreflightError(f"{what} {str(path)!r} cannot be created: {str(existing)!r} is not a folder")
    if existing != path:
        if not os.access(existing, os.W_OK | os.X_OK):
            raise PreflightError(f"{what} {str(path)!r} cannot be created: {str(existing)!r} is not writable")
        return
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".mgrpo-preflight-"):
            pass
    except OSError as exc:
        raise PreflightError(f"{what} {str(path)!r} is not writable: {exc.strerror or exc}") from None


def check_store(spec: str | None, timeout_s: float = 2.0) -> None:
    """A ``redis://`` store answers PING within ``timeout_s``; a ``sqlite:`` store's folder is writable;
    any other spec is refused with the accepted forms (``None``: the default store in the run folder)."""
    if spec is None:
        return
    if spec.startswith(("redis://", "rediss://")):
        try:
            import redis
        except ImportError:
            raise PreflightError(f"store {spec} needs redis-py: pip install 'mgrpo[dist]'") from None
        try:
            client = redis.Redis.from_url(spec, socket_connect_timeout=timeout_s, socket_timeout=timeout_s)
            try:
                client.ping()
            finally:
                client.close()
        except (redis.RedisError, ValueError, OSError) as exc:
            raise PreflightError(f"store {spec} is unreachable: {exc}") from None
        return
    if spec.startswith("sqlite:") and spec[len("sqlite:"):]:
        check_writable(Path(spec[len("sqlite:"):]).expanduser().parent, f"store {spec}: folder")
        return
    from ..distributed.store import open_store

    try:
        open_store(spec)  # raises ValueError naming the accepted forms
    except ValueError as exc:
        raise PreflightError(str(exc)) from None
    raise PreflightError(f"unsupported store spec {spec!r}")  # pragma: no cover - open_store refused it


def _has_split(splits: list[str], split: str) -> bool:
    """``split`` is one of ``splits`` or their common prefix (wiki-hops: ``stage1`` = ``stage1/train``)."""
    return split in splits or any(s.startswith(split + "/") for s in splits)


def check_scenario(config: TrainConfig, *, include_eval: bool = True) -> Any:
    """The scenario builds from ``scenario_kwargs`` (a benchmark finds its data files here) and has
    every split the stages (and, with ``include_eval``, the evaluation) name. Returns the scenario."""
    import mgrpo_scenarios

    try:
        scenario = mgrpo_scenarios.get(config.scenario, **config.scenario_kwargs)
        splits = list(scenario.splits())
    except KeyError as exc:
        raise PreflightError(str(exc.args[0])) from None
    except (OSError, ValueError, TypeError) as exc:
        raise PreflightError(f"scenario {config.scenario!r}: {exc}") from None
    wanted = {f"stages[{i}].split": stage.split for i, stage in enumerate(config.stages)}
    if include_eval:
        wanted["eval.split"] = config.eval.split
    for field_name, split in wanted.items():
        if not _has_split(splits, split):
            raise PreflightError(f"config field '{field_name}': scenario {config.scenario!r} has no split {split!r} "
                                 f"(it has {', '.join(splits)})")
    return scenario


def preflight(config: TrainConfig, *, check_eval: bool = False) -> None:
    """Every check above, cheapest first: folders, the store, the scenario and its splits.

    ``check_eval``: also require ``config.eval.split`` (``mgrpo compare`` evaluates it; ``mgrpo
    train`` does not).
    """
    check_writable(config.out_dir, "output folder (out_dir)")
    if not all(getattr(config, role).model for role in ("main", "sub", "single")):
        check_writable(config.models_dir, "models folder (models_dir)")
    check_store(config.placement.store or None)
    check_scenario(config, include_eval=check_eval)
