"""LoRA per role (peft): one adapter per agent, optionally several agents on one shared base model.

M-GRPO trains each role (main agent, sub-agent) as its own policy. With LoRA the roles can be distinct
agents that share one frozen base model *object* in memory: the base weights are stored once, each
role owns only its adapter (``lora_A`` / ``lora_B`` matrices named after the role), its optimiser
state and its gradients::

    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda()
    model = add_role_adapter(base, "main", rank=32, alpha=64)       # a peft PeftModel
    add_role_adapter(model, "sub", rank=32, alpha=64)               # same object, second adapter
    main = RoleLearner("main", model, LearnerConfig(lora_rank=32, ...))
    sub = RoleLearner("sub", model, LearnerConfig(lora_rank=32, ...))

(``RoleLearner`` calls :func:`add_role_adapter` itself when ``lora_rank > 0``; passing a model that
already holds the role's adapter reuses it.)

How sharing works, and its limits:

- peft keeps every adapter in the same ``LoraLayer`` modules; exactly one adapter is *active* per
  forward. A learner activates its own adapter before each forward (:func:`activate`), so two
  learners on one base must not run forwards at the same time (threads): updates in M-GRPO are
  sequential per process, which is what the trainers do. A rollout policy generating from the
  same object must activate the role's adapter too (``with use_adapter(model, "sub"): ...``).
- ``set_adapter`` also flips ``requires_grad`` (active adapter trainable, the others frozen); each
  learner's optimiser holds only its own adapter's parameters (:func:`adapter_parameters`), so the
  roles never touch each other's weights and the base never trains.
- Memory: a 0.5B base in bf16 is ~1 GB once instead of once per role; a rank-32 adapter on every
  projection of Qwen2-0.5B is ~17.6M parameters (~3.5% of the base).

Checkpoints (``RoleLearner.save``): ``model/`` holds the *unmerged* frozen base weights with the
plain Hugging Face names (a normal ``from_pretrained`` directory, see :func:`base_state_dict`), and
``adapter/`` the role's adapter in peft's format (``adapter_config.json`` +
``adapter_model.safetensors``, :func:`save_adapter`). That adapter directory is exactly what vLLM's
``/v1/load_lora_adapter`` takes (``mgrpo_algo.policies.weight_sync.WeightSync.sync_lora``). Merged weights
(for serving without LoRA) are one call away: :func:`merged_state_dict`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "activate",
    "add_role_adapter",
    "adapter_parameters",
    "base_state_dict",
    "has_adapter",
    "is_peft_model",
    "load_adapter_weights",
    "merged_state_dict",
    "save_adapter",
    "use_adapter",
]

_ADAPTER_WEIGHTS = "adapter_model.safetensors"
_ADAPTER_CONFIG = "adapter_config.json"


def _peft() -> Any:
    try:
        import peft
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("LoRA needs the 'peft' package: pip install peft") from exc
    return peft


def is_peft_model(model: Any) -> bool:
    """True for a peft ``PeftModel`` (without importing peft when it is not installed)."""
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def has_adapter(model: Any, name: str) -> bool:
    return is_peft_model(model) and name in model.peft_config


def add_role_adapter(
    model: torch.nn.Module,
    name: str,
    *,
    rank: int,
    alpha: float,
    targets: Sequence[str] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    dropout: float = 0.0,
) -> torch.nn.Module:
    """Give ``model`` a LoRA adapter called ``name`` and return the peft model that holds it.

    A plain causal LM is wrapped (``get_peft_model``, base frozen); a peft model gets one more adapter
    in place (same object, shared base); an adapter of that name already present is kept as is. The
    new adapter starts as the identity (``lora_B = 0``) and takes the base's dtype and device.
    Dropout defaults to 0: the RL ratio assumes the sampling and the training forwards agree.
    """
    peft = _peft()
    if rank < 1:
        raise ValueError(f"LoRA rank must be >= 1, got {rank}")
    config = peft.LoraConfig(
        r=int(rank),
        lora_alpha=float(alpha),
        target_modules=list(targets),
        lora_dropout=float(dropout),
        bias="none",
        task_type="CAUSAL_LM",
    )
    if is_peft_model(model):
        if name not in model.peft_config:
            model.add_adapter(name, config)
    else:
        model = peft.get_peft_model(model, config, adapter_name=name)
    ref = next(p for n, p in model.named_parameters() if "lora_" not in n)
    model.to(device=ref.device)
    for p in adapter_parameters(model, name):  # peft creates adapters in float32; match the base
        p.data = p.data.to(ref.dtype)
    return model


def adapter_parameters(model: torch.nn.Module, name: str) -> list[torch.nn.Parameter]:
    """The parameters of adapter ``name`` (peft names them ``...lora_A.<name>.weight``), in module order."""
    key = f".{name}."
    params = [p for n, p in model.named_parameters() if "lora_" in n and key in f".{n}."]
    if not params:
        raise ValueError(f"no LoRA parameters for adapter {name!r} (adapters: {list(getattr(model, 'peft_config', {}))})")
    return params


def activate(model: torch.nn.Module, name: str | None) -> None:
    """Make adapter ``name`` the active one and leave it so (a no-op for ``None`` or a plain model).

    The learner calls this before each forward and does *not* switch back before the backward:
    ``set_adapter`` sets ``requires_grad=False`` on inactive adapters, and a leaf that stops requiring
    grad between forward and backward gets no gradient.
    """
    if name is not None and is_peft_model(model) and model.active_adapter != name:
        model.set_adapter(name)


@contextlib.contextmanager
def use_adapter(model: torch.nn.Module, name: str | None) -> Iterator[None]:
    """Activate adapter ``name`` for the enclosed forwards (a no-op for ``None`` or a plain model).

    The previous active adapter is restored afterwards, so use it for no-grad work (generation,
    scoring), not around a forward whose backward comes later (see :func:`activate`). Not
    thread-safe: one active adapter per model object at a time.
    """
    if name is None or not is_peft_model(model):
        yield
        return
    previous = model.active_adapter
    if previous != name:
        model.set_adapter(name)
    try:
        yield
    finally:
        if previous != name and previous in model.peft_config:
            model.set_adapter(previous)


def save_adapter(model: torch.nn.Module, name: str, out_dir: str | os.PathLike) -> Path:
    """Write adapter ``name`` to ``out_dir`` (``adapter_config.json`` + ``adapter_model.safetensors``,
    the layout ``PeftModel.from_pretrained`` and vLLM's LoRA loader read). Replaces what is there."""
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        model.save_pretrained(tmp, selected_adapters=[name], safe_serialization=True)
        src = Path(tmp) / name if (Path(tmp) / name / _ADAPTER_CONFIG).exists() else Path(tmp)
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        for f in (_ADAPTER_CONFIG, _ADAPTER_WEIGHTS):
            shutil.move(str(src / f), out / f)
    return out


def load_adapter_weights(model: torch.nn.Module, name: str, adapter_dir: str | os.PathLike) -> None:
    """Copy the weights saved by :func:`save_adapter` into adapter ``name`` of ``model``, in place
    (the parameter objects, and so an optimiser holding them, stay the same)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    state = load_file(str(Path(adapter_dir) / _ADAPTER_WEIGHTS))
    params = adapter_parameters(model, name)
    before = [p.data_ptr() for p in params]
    with torch.no_grad():
        result = set_peft_model_state_dict(model, state, adapter_name=name)
    missing = [k for k in getattr(result, "unexpected_keys", []) if "lora_" in k]
    if missing:
        raise ValueError(f"adapter weights in {adapter_dir} do not fit adapter {name!r}: {missing[:3]}")
    if [p.data_ptr() for p in adapter_parameters(model, name)] != before:  # pragma: no cover - peft detail
        raise RuntimeError("loading the adapter replaced its parameter objects")


def base_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The frozen base weights of a peft model with the plain Hugging Face names (LoRA tensors
    dropped, ``.base_layer`` removed), ready for ``save_pretrained(state_dict=...)``."""
    base = model.get_base_model() if is_peft_model(model) else model
    return {k.replace(".base_layer.", "."): v for k, v in base.state_dict().items() if "lora_" not in k}


def merged_state_dict(model: torch.nn.Module, name: str) -> dict[str, torch.Tensor]:
    """Base weights with adapter ``name`` merged in (``W + B @ A * alpha / r``), plain names; the model
    is left unchanged. For serving the role without LoRA (e.g. a full-weights sync)."""
    state = base_state_dict(model)
    for module_name, module in model.get_base_model().named_modules():
        if not (hasattr(module, "get_delta_weight") and name in getattr(module, "lora_A", {})):
            continue
        key = f"{module_name}.weight"
        with torch.no_grad():
            delta = module.get_delta_weight(name)
        state[key] = (state[key].float() + delta.float()).to(state[key].dtype)
    return state
