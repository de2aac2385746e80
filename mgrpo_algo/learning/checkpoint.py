"""A role learner's checkpoints: atomic save, load, in-place resume, recovery after a crash in save.

:class:`LearnerCheckpoints` is the part of :class:`~mgrpo_algo.learning.learner.RoleLearner` that
reads and writes its folder (kept apart from the update, which it does not touch). A checkpoint is
``model/`` (``save_pretrained``; the tokenizer too), ``ref_model/`` (KL reference), ``adapter/``
(LoRA, peft format), ``learner.json`` (role, step, config, ``extra``) and ``learner_state.pt``
(optimiser, grad scaler, RNG states).
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mgrpo_env import strict_json

from ..core.config import LearnerConfig

__all__ = ["LearnerCheckpoints"]

_MODEL_DIR = "model"
_REF_DIR = "ref_model"
_ADAPTER_DIR = "adapter"
_META_FILE = "learner.json"
_STATE_FILE = "learner_state.pt"


class LearnerCheckpoints:
    """Checkpoint I/O of a learner (mixed into ``RoleLearner``: it uses its model, optimiser, step,
    config, tokenizer, reference model, adapter and scaler)."""

    def save(self, path: str | os.PathLike, *, extra: dict[str, Any] | None = None) -> Path:
        """Write a checkpoint directory atomically (a temporary sibling renamed into place).

        Layout: ``model/`` (``save_pretrained``, safetensors; the tokenizer too when there is one),
        ``ref_model/`` (only with ``kl_coef > 0`` and no LoRA), ``learner.json`` (role, step, config)
        and ``learner_state.pt`` (optimiser state, float16 grad-scaler state, torch / CUDA / numpy /
        python RNG states). With LoRA, ``model/`` holds the frozen base *unmerged* under its plain
        Hugging Face names and ``adapter/`` the role's adapter (peft format; vLLM loads it as is).
        An existing checkpoint at ``path`` is replaced. ``extra`` (JSON) is stored in ``learner.json``
        under ``"extra"``: state that must commit together with the weights (a role server's
        ``last_applied``), read back from that file.
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        if self.adapter is not None:
            from .lora import base_state_dict, save_adapter

            self.model.get_base_model().save_pretrained(tmp / _MODEL_DIR, state_dict=base_state_dict(self.model))
            save_adapter(self.model, self.adapter, tmp / _ADAPTER_DIR)
        else:
            self.model.save_pretrained(tmp / _MODEL_DIR)
        if self.tokenizer is not None and hasattr(self.tokenizer, "save_pretrained"):
            self.tokenizer.save_pretrained(tmp / _MODEL_DIR)
        if self.ref_model is not None:
            self.ref_model.save_pretrained(tmp / _REF_DIR)
        meta = {"role": self.role, "step": self.step, "config": asdict(self.config)}
        if extra is not None:
            meta["extra"] = extra
        (tmp / _META_FILE).write_text(strict_json.dumps(meta, indent=2))
        state = {"optimizer": self.optimizer.state_dict(), "rng": _rng_state()}
        if self.scaler is not None:
            state["scaler"] = self.scaler.state_dict()
        torch.save(state, tmp / _STATE_FILE)
        if path.exists():  # two renames: a crash between them leaves the previous one at .old-<pid>
            old = path.parent / f".{path.name}.old-{os.getpid()}"
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
        return path

    @staticmethod
    def recover(path: str | os.PathLike) -> None:
        """After a crash inside :meth:`save`, put a complete checkpoint back at ``path``: between its
        two renames only the previous one exists, as ``.<name>.old-<pid>``; it is moved back (it is
        consistent with itself, ``extra`` included). Leftover temporary folders are removed."""
        path = Path(path)
        leftovers = sorted(path.parent.glob(f".{path.name}.old-*")) if path.parent.exists() else []
        if not path.exists() and leftovers:
            os.replace(leftovers.pop(), path)
        for stale in [*leftovers, *(path.parent.glob(f".{path.name}.tmp-*") if path.parent.exists() else [])]:
            shutil.rmtree(stale, ignore_errors=True)

    @classmethod
    def load(
        cls, path: str | os.PathLike, config: LearnerConfig | None = None, *, tokenizer: Any = None
    ) -> Any:
        """A new learner from a checkpoint: weights, optimiser, step, RNG states (process-global ones
        are restored). ``config`` overrides the saved one (its lr / betas / weight decay win over the
        optimiser state's); default the saved config."""
        path = Path(path)
        meta = json.loads((path / _META_FILE).read_text())
        if config is None:  # keys this version does not know (an older or newer checkpoint) are dropped
            known = {f.name for f in fields(LearnerConfig)}
            config = LearnerConfig(**{k: v for k, v in meta["config"].items() if k in known})
        dtype = getattr(torch, config.dtype)
        if tokenizer is None and (path / _MODEL_DIR / "tokenizer_config.json").exists():
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(path / _MODEL_DIR)
        ref = _load_model(path / _REF_DIR, dtype) if (path / _REF_DIR).exists() else None
        learner = cls(meta["role"], path / _MODEL_DIR, config, tokenizer=tokenizer, ref_model=ref)
        learner._load_adapter(path)
        learner._restore(path, meta)
        return learner

    def resume(self, path: str | os.PathLike) -> None:
        """Load a checkpoint into this learner, copying weights into the existing model object (a
        rollout policy holding it sees them). Keeps this learner's config."""
        path = Path(path)
        meta = json.loads((path / _META_FILE).read_text())
        if self.adapter is not None:  # the base is frozen: only the adapter changed since it was saved
            self._load_adapter(path)
            self._restore(path, meta)
            return
        if (path / _ADAPTER_DIR).exists():
            raise ValueError(f"{path} is a LoRA checkpoint; resume it with lora_rank > 0")
        with torch.no_grad():
            self.model.load_state_dict(_load_model(path / _MODEL_DIR, self.dtype).state_dict())
            if self.ref_model is not None and (path / _REF_DIR).exists():
                self.ref_model.load_state_dict(_load_model(path / _REF_DIR, self.dtype).state_dict())
        self._restore(path, meta)

    def _load_adapter(self, path: Path) -> None:
        """Copy a checkpoint's ``adapter/`` into this learner's adapter (in place)."""
        has = (path / _ADAPTER_DIR).exists()
        if self.adapter is None:
            if has:
                raise ValueError(f"{path} is a LoRA checkpoint; load it with lora_rank > 0")
            return
        if not has:
            raise ValueError(f"{path} has no {_ADAPTER_DIR}/ (not a LoRA checkpoint) but lora_rank > 0")
        from .lora import load_adapter_weights

        load_adapter_weights(self.model, self.adapter, path / _ADAPTER_DIR)

    def save_adapter(self, path: str | os.PathLike) -> Path:
        """Write this role's LoRA adapter alone (peft format) to ``path``: the directory to hand to
        ``mgrpo_algo.policies.weight_sync.WeightSync.sync_lora`` after an update."""
        if self.adapter is None:
            raise ValueError("save_adapter needs lora_rank > 0")
        from .lora import save_adapter

        return save_adapter(self.model, self.adapter, path)

    def _restore(self, path: Path, meta: dict[str, Any]) -> None:
        state = torch.load(path / _STATE_FILE, map_location="cpu", weights_only=True)  # AdamW moves its state
        self.optimizer.load_state_dict(state["optimizer"])
        cfg = self.config
        for group in self.optimizer.param_groups:
            group.update(lr=cfg.lr, betas=cfg.betas, eps=cfg.adam_eps, weight_decay=cfg.weight_decay)
        if self.scaler is not None and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])
        _set_rng_state(state["rng"])
        self.step = int(meta["step"])


def _load_model(path: str | os.PathLike, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype)


def _rng_state() -> dict[str, Any]:
    """Process-global RNG states as tensors and plain values (loadable with ``weights_only=True``)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss)],
        "python": [version, list(internal), gauss_next],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"].cpu())
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])
