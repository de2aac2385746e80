"""A run's final models as complete Hugging Face folders: ``OUT_DIR/final/<role>/``.

Each folder is what ``save_pretrained`` of the model and its tokenizer gives (weights, config,
tokenizer, chat template), so ``AutoModelForCausalLM.from_pretrained`` and ``mgrpo eval --agent
OUT_DIR/final`` load it as is. A LoRA role is saved merged (the adapter folded into a copy of the
base: one plain model folder); a role that did not learn (``frozen-sub``'s sub-agent) is its start
model. Written once, at the end of a run; the checkpoints keep the learner's own layout.
"""

from __future__ import annotations

import copy
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["export_final_models", "save_model_folder"]


def save_model_folder(model: Any, tokenizer: Any, dest: Path) -> Path:
    """``save_pretrained`` of ``model`` (merged if it is a peft model) and ``tokenizer`` into ``dest`` (replaced)."""
    if hasattr(model, "merge_and_unload"):  # peft: fold the adapter into a copy, the live model keeps training
        model = copy.deepcopy(model).merge_and_unload()
    tmp = dest.parent / f".{dest.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest


def export_final_models(roles: Any, paths: Mapping[str, str], out: Path) -> Path:
    """Write every role's final model under ``out/final/<role>/``; returns ``out/final``.

    ``roles`` is the trainer's role backend: in process it holds the learners and policies; role
    servers keep theirs in ``out/servers/<role>/checkpoint/model`` (complete folders), copied here.
    """
    from ..policies.hf_policy import load_tokenizer

    final = out / "final"
    final.mkdir(parents=True, exist_ok=True)
    learners = getattr(roles, "learners", {})
    policies = getattr(roles, "policies", {})
    for role, start in paths.items():
        dest = final / role
        if role in learners:
            tokenizer = getattr(policies.get(role), "tokenizer", None) or load_tokenizer(start)
            save_model_folder(learners[role].model, tokenizer, dest)
        elif getattr(policies.get(role), "model", None) is not None and hasattr(policies[role].model, "save_pretrained"):
            save_model_folder(policies[role].model, policies[role].tokenizer, dest)
        else:  # role servers (or a served role that does not learn): the folder on disk
            served = out / "servers" / role / "checkpoint" / "model"
            source = served if (served / "config.json").is_file() else Path(start)
            if not source.is_dir():
                continue  # a hub name that was never trained: nothing new to keep
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(source, dest)
    return final
