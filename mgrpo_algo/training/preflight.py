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

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from mgrpo_env.roles import ROLES
from mgrpo_scenarios import NeedsBrowser

from ..core.config import MODES, TrainConfig

__all__ = ["PreflightError", "preflight", "check_store", "check_storage", "check_writable", "check_scenario", "check_browser_for",
           "check_model", "check_device", "check_models_and_devices", "start_tool_warnings"]


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


def check_storage(spec: str) -> None:
    """The run storage (``placement.storage``) can be written: a folder (as ``check_writable``), or an
    fsspec URL that takes a probe file and gives it back. "" (the run folder) is out_dir's check."""
    from .storage import RunStorage, StorageUnreachable, _is_url

    if not spec:
        return
    if not _is_url(spec) or spec.startswith("file://"):
        check_writable(spec.removeprefix("file://"), "run storage (placement.storage)")
        return
    try:
        RunStorage(spec).check()
    except ImportError as exc:  # fsspec names the package of the scheme's backend
        raise PreflightError(f"run storage {spec}: {exc}") from None
    except (StorageUnreachable, ValueError) as exc:
        raise PreflightError(f"run storage {spec} cannot be used: {exc}") from None


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
    for field_name, expression in wanted.items():
        for split in mgrpo_scenarios.split_parts(expression):  # a stage or an evaluation may join splits with '+'
            if not _has_split(splits, split):
                raise PreflightError(f"config field '{field_name}': scenario {config.scenario!r} has no split {split!r} "
                                     f"(it has {', '.join(splits)}; a stage or an evaluation may join several with '+')")
    return scenario


def check_browser_for(scenario: Any) -> None:
    """A scenario whose pages need JavaScript (``scenario.browser_needed``) gets a browser that starts:
    Chromium is launched once and closed (about a second), before any work.

    Without this a missing Chromium only lowered every result (each JavaScript page read as empty
    text). ``browser_mode: never`` in the scenario's options is the explicit way to run without one.
    """
    reason = scenario.browser_needed if isinstance(scenario, NeedsBrowser) else None
    if not reason:
        return
    from mgrpo_tools.browser_check import BrowserUnavailable, check_browser

    try:
        check_browser()
    except BrowserUnavailable as exc:
        raise PreflightError(f"scenario {scenario.name!r} needs a browser ({reason}): {exc}, "
                             "or set browser_mode: never to run without it") from None


def preflight(config: TrainConfig, *, check_eval: bool = False) -> list[str]:
    """Every check, cheapest first: folders, the store, models and devices, the scenario, the browser.
    Returns the warnings, one line each (:func:`start_tool_warnings`), for the caller to print.

    ``check_eval``: also require ``config.eval.split`` (``mgrpo compare`` evaluates it; ``mgrpo
    train`` does not).
    """
    check_writable(config.out_dir, "output folder (out_dir)")
    if not all(getattr(config, role).model for role in ROLES):
        check_writable(config.models_dir, "models folder (models_dir)")
    check_store(config.placement.store or None)
    check_storage(config.placement.storage)
    check_models_and_devices(config)
    check_served_engines(config)
    scenario = check_scenario(config, include_eval=check_eval)
    check_browser_for(scenario)
    return start_tool_warnings(config, scenario)


def start_tool_warnings(config: TrainConfig, scenario: Any) -> list[str]:
    """One line per start model warm-started on prompts that showed its role other tools than this run
    shows (``TrainConfig.tools``, else the scenario's set), or on another version of the scenario's world,
    read from the ``warm_start.json`` key the warm start leaves in the folder (no ``tools`` there: the
    scenario's set). Its prompts would then name a
    tool it never saw, or miss one it learned to call. A warning, not an error: a start under other
    tools can be the experiment. Folders without a readable record are not judged."""
    from mgrpo_env.protocol import role_tools

    lines = []
    for role in ROLES:
        model = getattr(config, role).model
        record = Path(model).expanduser() / "warm_start.json" if model else None
        if record is None or not record.is_file():
            continue
        try:
            key = json.loads(record.read_text()).get("key")
        except (OSError, ValueError, AttributeError):
            continue
        if not isinstance(key, dict):
            continue
        # a start cloned on another version of the same scenario's world saw other pages or tasks
        built_on = key.get("scenario") if isinstance(key.get("scenario"), dict) else {}
        now = dict(getattr(scenario, "metadata", {}) or {})
        if built_on.get("version") is not None and now.get("version") is not None \
                and str(built_on["version"]) != str(now["version"]) and built_on.get("name", now.get("name")) == now.get("name"):
            lines.append(f"config field '{role}.model': {model} was warm-started on version {built_on['version']} of "
                         f"{config.scenario}, this run's is version {now['version']} (its pages or tasks changed); "
                         f"mgrpo warm-start with this config builds a start that saw them")
        recorded = key.get("tools") if isinstance(key.get("tools"), dict) else {}
        # the recorded names as written: a tool registered when the start was built may not be here
        seen = [str(n) for n in recorded[role]] if isinstance(recorded.get(role), list) else list(role_tools(scenario, role))
        shown = list(role_tools(scenario, role, config.tools.get(role)))
        if seen != shown:
            lines.append(f"config field '{role}.model': {model} was warm-started showing {role} the tools "
                         f"{', '.join(seen)}, this run shows {', '.join(shown)} (config field 'tools'); "
                         f"mgrpo warm-start with this config builds a start that saw them")
    return lines


def check_served_engines(config: TrainConfig) -> None:
    """A role whose vLLM server the run launches (``served.launch``) needs a usable vLLM here: installed,
    and for the CPU build a CPU with AVX2 (one line, before any model loads)."""
    launched = [role for role in ROLES if getattr(config, role).served.launch]
    if not launched:
        return
    from ..policies.vllm_server import engine_refusal

    problem = engine_refusal()
    if problem:
        raise PreflightError(f"{', '.join(launched)}.served.launch: {problem}")


def _looks_like_path(name: str) -> bool:
    """A model given as a path (``/x``, ``./x``, ``~/x``, ``C:\\x``) rather than a hub name ``org/name``."""
    return name.startswith(("/", ".", "~")) or "\\" in name or name.count("/") > 1 or Path(name).exists()


def check_model(name: str, what: str, *, timeout_s: float = 3.0) -> None:
    """``name`` is a local model folder (with ``config.json``) or a Hugging Face hub name that is cached
    or downloadable: an uncached name fails at once when ``HF_HUB_OFFLINE`` is set, and after
    ``timeout_s`` when the hub does not answer (instead of a long hang and a traceback later)."""
    if _looks_like_path(name):
        folder = Path(name).expanduser()
        if not folder.is_dir():
            raise PreflightError(f"{what} {name!r} is not a folder (a Hugging Face model folder or hub name)")
        if not (folder / "config.json").is_file():
            raise PreflightError(f"{what} {name!r} has no config.json: not a Hugging Face model folder")
        return
    from huggingface_hub import constants, try_to_load_from_cache

    try:
        if isinstance(try_to_load_from_cache(name, "config.json"), str):
            return  # cached: from_pretrained needs no network
    except ValueError as exc:  # not a valid repo id
        raise PreflightError(f"{what} {name!r} is neither a local folder nor a hub name: {exc}") from None
    if constants.HF_HUB_OFFLINE:
        raise PreflightError(f"{what} {name!r} is not a local folder and not in the Hugging Face cache "
                             "(HF_HUB_OFFLINE is set); download it first or give a local folder")
    import httpx

    url = f"{constants.ENDPOINT}/api/models/{name}"
    try:
        answer = httpx.head(url, timeout=timeout_s, follow_redirects=True)
    except httpx.HTTPError as exc:
        raise PreflightError(f"{what} {name!r} is not a local folder nor cached, and the hub {constants.ENDPOINT} "
                             f"does not answer ({type(exc).__name__}); download it first or give a local folder") from None
    if answer.status_code in (401, 404):
        raise PreflightError(f"{what} {name!r} is not a local folder and the hub has no such model (or it is gated)")


def check_device(device: str, what: str) -> None:
    """A non-CPU ``device`` exists in this torch build (a CPU build given ``cuda`` fails here, in one line)."""
    kind, _, index = device.partition(":")
    if kind == "cpu":
        return
    import torch

    module = getattr(torch, kind, None)
    available = bool(module is not None and hasattr(module, "is_available") and module.is_available())
    if kind == "mps":
        available = torch.backends.mps.is_available()
    if not available:
        build = "a CPU-only torch build" if kind == "cuda" and torch.version.cuda is None else f"torch {torch.__version__}"
        raise PreflightError(f"{what} is {device!r} but no {kind} device is available ({build}); set it to 'cpu'")
    count = module.device_count() if module is not None and hasattr(module, "device_count") else 1
    if index and int(index) >= count:
        raise PreflightError(f"{what} is {device!r} but only {count} {kind} device(s) exist")


def check_models_and_devices(config: TrainConfig) -> None:
    """The roles this mode uses: their models load (folder or hub name) and their devices exist."""
    roles = list(MODES[config.mode].roles)
    for role in roles:
        rc = getattr(config, role)
        check_device(rc.learner.device, f"config field '{role}.learner.device'")
        if rc.model:
            check_model(rc.model, f"config field '{role}.model'")
    if config.warm_start.epochs and not all(getattr(config, role).model for role in roles):
        check_device(config.warm_start.device, "config field 'warm_start.device'")
