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

__all__ = ["export_final_models", "export_role_model", "save_model_folder"]


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


def export_role_model(model: Any, tokenizer: Any, start: str, dest: Path) -> bool:
    """One role's final folder at ``dest``: its model object (learned or frozen) with its tokenizer,
    else a copy of its start folder; False when there is nothing to write (a hub name never trained)."""
    from ..policies.chat_tokens import load_tokenizer

    if model is not None and hasattr(model, "save_pretrained"):
        save_model_folder(model, tokenizer or load_tokenizer(start), dest)
        return True
    if not Path(start).is_dir():
        return False
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(start, dest)
    return True


def export_final_models(workers: Mapping[str, Any], out: Path, storage: str = "") -> Path:
    """Every role's final model under ``out/final/<role>/``, written by its worker (a
    ``service.RoleService``, wherever it runs); returns ``out/final``. With a declared ``storage``
    (``placement.storage``: the workers may be on other nodes) each worker writes ``final/<role>`` there
    and this node copies it into ``out/final``."""
    from .storage import RunStorage

    final = out / "final"
    final.mkdir(parents=True, exist_ok=True)
    shared = RunStorage(storage).child("final") if storage else None
    if shared is not None:
        shared.create()
    for role, worker in workers.items():
        if shared is None:
            worker.export(str(final / role))
        elif worker.export(f"{shared.url}/{role}"):
            shared.copy_folder_to(role, final / role)
    return final
