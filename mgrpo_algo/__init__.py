"""mgrpo_algo: the M-GRPO algorithm, in layers (each imports only those below it; tests/test_layers.py):

=============  ==================================================================
``core``        advantages, losses, batch scoring, sequences, seeds, configuration
``policies``    rollout policies (in-process, OpenAI-compatible), models, weight sync
``distributed`` placements (local, processes, Ray) and statistics stores
``learning``    per-role learners, LoRA, warm start
``training``    the iteration loop and its in-process / role-server backends
``experiments`` evaluation, ``mgrpo compare``, plots, ``mgrpo view``
``cli``         the ``mgrpo`` command
=============  ==================================================================

The names most scripts need are importable from here (loaded on first use, so ``import mgrpo_algo``
stays light)::

    from mgrpo_algo import Trainer, load_config
    Trainer(load_config("configs/demo.yaml")).run()
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "TrainConfig": "core.config",
    "load_config": "core.config",
    "main_advantages": "core.advantages",
    "sub_advantages": "core.advantages",
    "TransformersPolicy": "policies.hf_policy",
    "OpenAICompatiblePolicy": "policies.http_policy",
    "RoleLearner": "learning.learner",
    "Trainer": "training.trainer",
    "RoleWorker": "training.roles",
    "run_compare": "experiments.compare",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:  # PEP 562: import the module on first use
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
