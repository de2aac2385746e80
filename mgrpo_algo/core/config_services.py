"""Where a run's parts live and what they call: the placement of the role workers and their
statistics store (``PlacementConfig``), and the LLM judge server (``JudgeConfig``).

Part of the one config tree (``mgrpo_algo.core.config.TrainConfig``); split from it by concern.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mgrpo_env.roles import ROLES

from .config_types import check as _check
from .config_types import check_own_names, named

__all__ = ["JudgeConfig", "PlacementConfig"]


@dataclass
class JudgeConfig:
    """An LLM judge for r_expert on tasks without per-hop gold (``mgrpo_scenarios.verifiers.LLMJudge``):
    an OpenAI-compatible server; the key may come from ``MGRPO_JUDGE_API_KEY``."""

    base_url: str = ""
    """The judge server's URL; empty: no judge (per-hop gold only; b3 = 0 where a task has none, and
    the metrics say so: ``sub/expert_disabled``)."""
    model: str = ""
    """The model name the judge server answers to (needed with ``base_url``)."""
    api_key: str | None = None
    """Bearer key of the judge server; None: ``MGRPO_JUDGE_API_KEY``, then ``OPENAI_API_KEY``, if set."""
    timeout_s: float = 30.0
    """Seconds to wait for one judgement before it is retried."""
    max_retries: int = 2
    """Retries of a failed or timed-out judgement; after them the sub-agent's r_expert is unscored."""
    temperature: float = 0.0
    """Sampling temperature of the judge (0: the same verdict for the same input)."""
    max_tokens: int | None = 1024
    """Tokens the judge may write per verdict (None: the server's limit)."""

    def __post_init__(self) -> None:
        _check(not self.base_url or bool(self.model), "expert_judge.model", "is needed with expert_judge.base_url")

    @property
    def enabled(self) -> bool:
        return bool(self.base_url)

    def make(self) -> Any:
        """The ``LLMJudge`` this section describes (None when disabled)."""
        if not self.enabled:
            return None
        from mgrpo_scenarios.verifiers import LLMJudge

        return LLMJudge(self.base_url, self.model, api_key=self.api_key, timeout_s=self.timeout_s,
                        max_retries=self.max_retries, temperature=self.temperature, max_tokens=self.max_tokens)


@dataclass
class PlacementConfig:
    """Where the roles run. One iteration loop drives all of them; only this changes underneath."""

    kind: str = named("local", "mgrpo_algo.distributed.placement:PLACEMENTS")
    """Where the role workers live (one per role, every mode), a name in
    ``mgrpo_algo.distributed.placement.PLACEMENTS``: ``local`` in the trainer's process (arguments by
    reference; the former name ``in-process`` is accepted with a deprecation warning), ``processes``
    one process per role, ``ray`` Ray actors; only statistics cross between roles, through the store."""
    store: str = named("", "mgrpo_algo.distributed.store:check_store_field")
    """The statistics store: ``sqlite:PATH`` or ``redis://[:PASSWORD@]host:port`` (``rediss://`` for
    TLS), or the form of another backend in ``mgrpo_algo.distributed.store.STORE_BACKENDS`` (by its
    scheme). Empty: ``sqlite:<out_dir>/stats.sqlite``."""
    staleness: int = 0
    """0: synchronized (the sub learner applies iteration t in t, the paper's better variant). n > 0:
    the sub learner may lag up to n iterations behind the main learner."""
    resources: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per role ``{num_cpus, num_gpus}`` for Ray actors (e.g. ``{main: {num_gpus: 1}}``); any other key is
    a Ray custom resource, which pins the role to the nodes started with it (``{sub: {num_cpus: 1,
    sub_node: 1}}`` with ``ray start --resources '{"sub_node": 1}'``)."""
    start_timeout_s: float = 120.0
    """Seconds a role worker may take to start (import, load its model or checkpoint, download it from the
    storage) before the run stops naming the resources it asked for; also the wait for a node to take over
    a lost one's role. Raise it for large models or busy machines."""
    storage: str = ""
    """Where the role workers keep their durable state (``workers/<role>``: token buffers, A_S,
    ``worker.json``, checkpoints; stage checkpoints and final models too): a folder every node sees at the
    same path (NFS), or an fsspec URL (``s3://bucket/run``, its fsspec backend installed on every node).
    Empty: the run folder (``out_dir``), right on one machine. A multi-node run needs it (and a Redis
    store): a worker restarted on another node after a node loss resumes from it (docs/multinode.md)."""

    def __post_init__(self) -> None:
        check_own_names(self, "placement.")
        _check(isinstance(self.staleness, int) and self.staleness >= 0, "placement.staleness", "must be an integer >= 0")
        for role, res in self.resources.items():  # a misspelled role or resource would be ignored silently
            _check(role in ROLES, "placement.resources", f"names roles of {ROLES}, got {role!r}")
            # any other key is a Ray custom resource (a node label); num_* names only Ray's own two
            _check(isinstance(res, dict) and all(k in ("num_cpus", "num_gpus") or not str(k).startswith("num_") for k in res),
                   f"placement.resources.{role}", f"takes num_cpus, num_gpus and custom resources, got {res!r}")
        _check(isinstance(self.storage, str), "placement.storage", "must be a path or an fsspec URL")
        _check(self.start_timeout_s > 0, "placement.start_timeout_s", "must be > 0")
        if "://" in self.storage or "::" in self.storage:
            from fsspec.registry import known_implementations, registry

            scheme = self.storage.split("::", 1)[0].split("://", 1)[0]
            _check(scheme in known_implementations or scheme in registry, "placement.storage",
                   f"has an unknown fsspec protocol {scheme!r} (known: file, memory, s3, gs, abfs, ... with their "
                   "fsspec backend installed)")

    @property
    def in_process(self) -> bool:
        """The role workers live in this process (their policies can share a served engine's client)."""
        return self.kind == "local"
