"""One role's learner: a causal LM, its AdamW optimiser and the clipped policy-gradient update.

M-GRPO trains each role (main agent, sub-agent) with its own learner; no gradient crosses roles.
A learner takes the role's :class:`~mgrpo_algo.core.sequences.TokenSequence` batch and makes one update::

    learner = RoleLearner("main", "path/to/model", LearnerConfig())
    metrics = learner.update(sequences)          # {"main/loss": ..., "main/clipfrac": ..., ...}
    learner.save("runs/x/main")                  # later: RoleLearner.load("runs/x/main")

What ``update`` does, top to bottom:

1. Drop samples with no sampled token: they cost no compute and are in no denominator. The
   "seq-mean" denominator is the number of the remaining samples (a duplicated alignment slot is
   present twice and counts twice; a masked one is not in the batch at all).
   Samples with advantage exactly 0 stay in that denominator but run no forward/backward when the
   KL and entropy terms are off (``skip_zero_advantage``): their gradient is exactly 0.
2. Old log-probs: the current weights are the sampling policy (on-policy, as the paper's code). With
   one epoch and one minibatch they are the detached log-probs of the update's own forward (the same
   numbers as a separate no-grad pass, without its cost): the ratio is exactly 1. With more passes
   they come from a no-grad pass before the first step.
3. For each epoch, shuffle and split into ``minibatches``; each minibatch is one optimiser step.
   Its samples are packed into micro-batches of at most ``micro_batch_tokens`` padded tokens, each
   loss is divided by the minibatch's global normaliser, gradients accumulate, so the step equals
   one full-minibatch step. Clip the gradient norm, step AdamW (a non-finite norm skips the step).

Token positions: ``logp[:, t]`` is the log-probability of token ``t + 1`` given tokens ``<= t`` (the
logits at position t predict token t+1); the loss mask is shifted the same way, so ``loss_mask[0]``
(nothing predicts the first token) never trains. Right padding, so no attention mask is needed (see ``_forward``).

Mixed precision and LoRA (``LearnerConfig.autocast_dtype`` / ``lora_rank``): every forward runs
under ``torch.autocast`` in the configured dtype (parameters and AdamW keep ``dtype``; log-probs and
the loss are float32; float16 adds a ``GradScaler``). With ``lora_rank > 0`` the model is wrapped in
a peft adapter named after the role (:mod:`mgrpo_algo.learning.lora`): the base is frozen, the optimiser holds
only the adapter, the adapter is activated around each forward (so roles can share one base model
object), and with ``kl_coef > 0`` the reference is the same model with adapters disabled (no copy).
A LoRA checkpoint holds the unmerged base in ``model/`` and the adapter in ``adapter/`` (peft
format, what vLLM's ``/v1/load_lora_adapter`` loads); see :meth:`RoleLearner.save`.

Metrics are returned namespaced by role (``main/loss``), ready for the trainer's logger (CleanRL's
convention). The model object is shared: a rollout policy in the same process may hold the same
object, so it is only ever updated in place (also by :meth:`RoleLearner.resume`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..core.config import LearnerConfig
from ..core.losses import POLICY_LOSSES, get_policy_loss, loss_normalizer
from ..core.sequences import TokenSequence
from .batching import MicroBatch, advantages, pack_micro_batches, scatter_columns
from .checkpoint import LearnerCheckpoints, _load_model
from .logits import target_logprobs
from .prefix import PrefixPass, forward_with_prefix, plan_prefix, run_prefixes

__all__ = ["RoleLearner"]

class RoleLearner(LearnerCheckpoints):
    """The learner of one role.

    Args:
        role: "main", "sub" or "single"; prefixes the metric keys.
        model: a Hugging Face causal LM, or a path / hub name loaded with
            ``AutoModelForCausalLM.from_pretrained`` in ``config.dtype``. An object is moved in place
            to ``config.device`` / ``config.dtype`` and stays the same object.
        config: the learner's configuration.
        tokenizer: optional; its ``pad_token_id`` pads batches (else 0: padded positions are masked,
            the id does not matter) and it is saved with checkpoints.
        ref_model: the frozen reference for ``kl_coef > 0``; default a copy of ``model`` as given.

    Attributes:
        model: the trained model (shared, updated in place).
        optimizer: its AdamW.
        step: number of completed ``update`` calls that stepped the optimiser.
    """

    def __init__(
        self,
        role: str,
        model: str | os.PathLike | torch.nn.Module,
        config: LearnerConfig | None = None,
        *,
        tokenizer: Any = None,
        ref_model: torch.nn.Module | None = None,
    ) -> None:
        self.role = role
        self.config = config = config if config is not None else LearnerConfig()
        # The loss by name (core/losses.py's registry): its function, how its metrics merge, and its
        # options, built once from this config and handed to every call.
        self.loss = get_policy_loss(POLICY_LOSSES.check(config.policy_loss, "learner.policy_loss"))
        self.loss_options = vars(self.loss.make_options(config))
        self.device = torch.device(config.device)
        self.dtype = getattr(torch, config.dtype)
        if isinstance(model, (str, os.PathLike)):
            model = _load_model(model, self.dtype)
        self.model = model.to(device=self.device, dtype=self.dtype)  # nn.Module.to is in place
        self.tokenizer = tokenizer
        self.autocast_dtype = None if config.autocast_dtype == "none" else getattr(torch, config.autocast_dtype)
        self.scaler = torch.amp.GradScaler("cuda") if config.autocast_dtype == "float16" else None
        self.adapter: str | None = None  # the role's LoRA adapter name, None without LoRA
        if config.lora_rank > 0:
            from .lora import add_role_adapter

            # Wraps a plain model (peft injects LoRA layers into it in place, so another holder of
            # the original object sees the active adapter) or adds this role's adapter to a shared one.
            self.model = add_role_adapter(
                self.model, role, rank=config.lora_rank, alpha=config.lora_alpha, targets=config.lora_targets
            )
            self.adapter = role
        if config.gradient_checkpointing:
            kwargs = {"use_reentrant": False}
            if hasattr(
                self.model, "activation_checkpointing_enable"
            ):  # transformers >= 5 (the old name warns)
                self.model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
            else:
                self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        self.ref_model = None
        if config.kl_coef > 0 and ref_model is None and self.adapter is not None:
            pass  # the reference is self.model with adapters disabled (see _score_reference)
        elif config.kl_coef > 0:
            if ref_model is None:
                import copy

                ref_model = copy.deepcopy(self.model)
            self.ref_model = ref_model.to(device=self.device, dtype=self.dtype).eval().requires_grad_(False)
        if self.adapter is not None:
            from .lora import adapter_parameters

            self.params = adapter_parameters(self.model, self.adapter)
        else:
            self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.params,
            lr=config.lr,
            betas=config.betas,
            eps=config.adam_eps,
            weight_decay=config.weight_decay,
            # One fused kernel over all parameters: on CPU torch's default is a Python loop per tensor.
            fused=all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in self.params) or None,
        )
        self.step = 0

    # ------------------------------------------------------------------ forward passes
    def logprobs(self, sequences: Sequence[TokenSequence]) -> list[list[float]]:
        """Per-token log-probabilities under the current weights (no grad, eval mode).

        Returns one list of length T per sequence: entry t is ``log p(token t | tokens < t)`` for
        every position (sampled or not), entry 0 is 0.0, the layout of ``sampled_logprobs``.
        """
        was_training = self.model.training
        self.model.eval()
        try:
            scored = self._score(list(sequences), self.model)
        finally:
            self.model.train(was_training)
        return [[0.0] + row.tolist() for row in scored]

    @torch.no_grad()
    def _score(self, samples: list[TokenSequence], model: torch.nn.Module) -> list[Tensor]:
        """No-grad per-sample log-probs [T-1] (float32, on device), micro-batched like the update."""
        out: list[Tensor] = [torch.empty(0)] * len(samples)
        for group in self._micro_batches(samples):
            batch = self._collate([samples[i] for i in group])
            logp, _ = self._forward(batch, model=model, entropy=False)
            for row, i in enumerate(group):
                out[i] = logp[row, : samples[i].num_tokens - 1].detach()
        return out

    def _score_reference(self, samples: list[TokenSequence]) -> list[Tensor] | None:
        """Reference log-probs for the KL term: the frozen copy, or with LoRA the base model itself
        (adapters disabled). None when ``kl_coef`` is 0."""
        if self.ref_model is not None:
            return self._score(samples, self.ref_model)
        if self.config.kl_coef > 0 and self.adapter is not None:
            with self.model.disable_adapter():
                return self._score(samples, self.model.get_base_model())
        return None

    def _forward(
        self, batch: MicroBatch, *, model: torch.nn.Module | None = None, entropy: bool = False,
        loss_positions_only: bool = False, prefix: tuple[PrefixPass, Tensor] | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """``(logp, entropy)``, both [B, L-1] float32: log-prob of each next token and, if asked, the
        entropy of the predicted distribution (with grad only when ``entropy_coef > 0``).

        ``loss_positions_only``: compute the vocabulary projection only at the columns where some
        sample has a loss-masked token (``logits_to_keep``); other positions are 0. The prompt (most of
        an agent's sequence) then costs no [V]-wide logits, which dominate the update for small models.
        ``prefix``: the batch's shared prefix (a pass of :func:`~mgrpo_algo.learning.prefix.run_prefixes`
        and each row's prefix index): its tokens are read from there, not run.
        """
        model = self.model if model is None else model
        self._activate(model)
        length = batch.targets.shape[1]
        columns, ids, keep = self._columns(batch) if loss_positions_only else (None, batch.input_ids[:, :length], None)
        with self._autocast():
            if prefix is not None:
                logits = forward_with_prefix(model, ids, keep, *prefix)  # type: ignore[arg-type]
            else:
                # Right padding under causal attention: no real token attends to a pad, so the mask only
                # slows the kernel down (an explicit 4-D mask instead of the causal fast path).
                kwargs = {"logits_to_keep": keep} if keep is not None else {}
                logits = model(input_ids=ids, use_cache=False, **kwargs).logits
        logits = logits.float()  # a no-op in float32; autocast's bfloat16 logits are scored in float32
        if self.config.temperature != 1.0:
            logits = logits / self.config.temperature  # the rollouts sampled from softmax(logits / T)
        targets = batch.targets if columns is None else batch.targets[:, columns]
        # One log-softmax serves the targets' log-probs and the entropy (see logits.py for the backward).
        logp, ent = target_logprobs(logits, targets, entropy=entropy, entropy_grad=self.config.entropy_coef > 0)
        if columns is not None:
            logp = scatter_columns(logp, columns, length)
            ent = scatter_columns(ent, columns, length) if ent is not None else None
        return logp, ent

    @staticmethod
    def _columns(batch: MicroBatch) -> tuple[Tensor, Tensor, Tensor | int]:
        """``(columns, ids, keep)``: the positions where some sample has a trained target (position t
        predicts token t+1), the input ids cut after the last of them (later tokens feed no prediction
        under causal attention), and ``logits_to_keep`` for them (an int when they are the trailing
        positions: a slice, a view, not a gather and its scatter back)."""
        columns = torch.nonzero(batch.loss_mask.any(0)).squeeze(-1)
        if len(columns) == 0:
            return columns, batch.input_ids[:, : batch.targets.shape[1]], columns
        last = int(columns[-1])
        contiguous = last - int(columns[0]) + 1 == len(columns)
        return columns, batch.input_ids[:, : last + 1], len(columns) if contiguous else columns

    def _activate(self, model: torch.nn.Module) -> None:
        if model is self.model and self.adapter is not None:
            from .lora import activate

            activate(model, self.adapter)  # left active through the backward (shared base: see lora.py)

    def _autocast(self) -> torch.autocast:
        return torch.autocast(self.device.type, dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None)

    def _prefix_passes(self, batches: list[MicroBatch]) -> list[tuple[PrefixPass, Tensor] | None]:
        """Each micro-batch's shared prefix, run once for the whole minibatch (``share_prefix``; off with
        gradient checkpointing, whose recomputation would not see the prefix leaves)."""
        cfg = self.config
        if not cfg.share_prefix or cfg.gradient_checkpointing:
            return [None] * len(batches)
        plans = []
        for b in batches:
            columns, ids, _ = self._columns(b)
            plans.append(plan_prefix(ids, columns, cfg.share_prefix_min_tokens))
        self._activate(self.model)
        with self._autocast():
            return run_prefixes(self.model, plans)

    # ------------------------------------------------------------------ batching
    def _micro_batches(self, samples: Sequence[TokenSequence]) -> list[list[int]]:
        """Indices grouped so that (longest length x count) <= micro_batch_tokens; longest first
        (:func:`~mgrpo_algo.learning.batching.pack_micro_batches`)."""
        return pack_micro_batches(samples, self.config.micro_batch_tokens)

    def _collate(
        self,
        samples: Sequence[TokenSequence],
        old: Sequence[Tensor] | None = None,
        ref: Sequence[Tensor] | None = None,
    ) -> MicroBatch:
        length = max(s.num_tokens for s in samples)
        pad = getattr(self.tokenizer, "pad_token_id", None)
        pad = 0 if pad is None else int(pad)
        ids = torch.full((len(samples), length), pad, dtype=torch.long)
        attn = torch.zeros((len(samples), length), dtype=torch.long)
        mask = torch.zeros((len(samples), length), dtype=torch.float32)
        for row, s in enumerate(samples):
            ids[row, : s.num_tokens] = torch.as_tensor(s.input_ids, dtype=torch.long)
            attn[row, : s.num_tokens] = 1
            mask[row, : s.num_tokens] = torch.as_tensor(s.loss_mask, dtype=torch.float32)

        def padded(rows: Sequence[Tensor] | None) -> Tensor | None:
            if rows is None:
                return None
            out = torch.zeros((len(samples), length - 1), dtype=torch.float32, device=self.device)
            for r, x in enumerate(rows):
                out[r, : x.shape[0]] = x
            return out

        dev = self.device
        return MicroBatch(
            input_ids=ids.to(dev),
            attention_mask=attn.to(dev),
            targets=ids[:, 1:].to(dev),
            loss_mask=(mask[:, 1:] != 0).float().to(dev),
            advantages=advantages(samples, length, dev),
            weights=torch.ones(len(samples), dtype=torch.float32, device=dev),  # every sample counts once (the losses' sample_weight)
            old_logp=padded(old),
            ref_logp=padded(ref),
        )

    # ------------------------------------------------------------------ the update
    def update(self, sequences: Sequence[TokenSequence]) -> dict[str, float]:
        """One update on a batch of this role's sequences; returns metrics keyed ``"{role}/name"``.

        Metrics: loss (full objective), pg_loss, clipfrac (+ _low / _high), approx_kl, ratio_mean,
        ratio_max, adv_mean, entropy (if ``compute_entropy``), kl_ref (if ``kl_coef`` > 0),
        grad_norm (before clipping), lr, tokens (sampled tokens trained on), seq_tokens (all tokens
        of those samples), samples (with a sampled token), masked_samples (dropped: nothing
        sampled), zero_adv_skipped (share of those samples with advantage exactly 0 that ran no
        forward/backward; see ``LearnerConfig.skip_zero_advantage``; token-mean metrics then cover the
        samples that ran), micro_batches (forward/backward passes), optimizer_steps, nonfinite_steps,
        skipped (1 when nothing was trainable: no step), seconds, tokens_per_s (seq_tokens per
        second of this call, all passes included), step. Loss-side values are means over the
        optimiser steps of the call.
        """
        start = time.perf_counter()
        cfg = self.config
        live = [s for s in sequences if any(s.loss_mask[1:])]
        if cfg.informative_only:  # DAPO's dynamic sampling by weight: groups without spread leave the batch
            informative = [s for s in live if s.has_signal]
            uninformative = len(live) - len(informative)
            live = informative
        else:
            uninformative = 0
        counts = {
            "samples": float(len(live)),
            "masked_samples": float(len(sequences) - len(live) - uninformative),
            "tokens": float(sum(sum(s.loss_mask[1:]) for s in live)),
            "seq_tokens": float(sum(s.num_tokens for s in live)),
            "lr": float(self.optimizer.param_groups[0]["lr"]),
        }
        if cfg.informative_only:
            counts["uninformative_dropped"] = float(uninformative)
        if not live:
            return self._prefixed(
                {
                    **counts,
                    "skipped": 1.0,
                    "optimizer_steps": 0.0,
                    "micro_batches": 0.0,
                    "seconds": time.perf_counter() - start,
                    "tokens_per_s": 0.0,
                    "step": float(self.step),
                }
            )

        # A zero advantage zeroes a sample's policy-gradient term; with no KL or entropy term nothing
        # else gives it a gradient, so it only needs to count in the normaliser (see _optimizer_step).
        skip = cfg.skip_zero_advantage and cfg.kl_coef == 0 and cfg.entropy_coef == 0
        trained = [not (skip and not s.has_signal) for s in live]
        counts["zero_adv_skipped"] = 1.0 - sum(trained) / len(live)
        was_training = self.model.training
        self.model.train()  # HF gradient checkpointing needs it; RL models carry no dropout (Qwen2: 0)
        try:
            old = None
            if cfg.ppo_epochs * cfg.minibatches > 1:
                scored = iter(self._score([s for s, t in zip(live, trained, strict=True) if t], self.model))
                old = [next(scored) if t else None for t in trained]
            ref = self._score_reference(live)
            steps: list[dict[str, float]] = []
            for epoch in range(cfg.ppo_epochs):
                order = np.random.default_rng([cfg.seed or 0, self.step, epoch]).permutation(len(live))
                for part in np.array_split(order, cfg.minibatches):
                    if len(part) == 0:
                        continue
                    idx = [int(i) for i in part]
                    steps.append(
                        self._optimizer_step(
                            [live[i] for i in idx],
                            None if old is None else [old[i] for i in idx],
                            None if ref is None else [ref[i] for i in idx],
                            [trained[i] for i in idx],
                        )
                    )
        finally:
            self.model.train(was_training)
        self.step += 1

        keys = dict.fromkeys(k for m in steps for k in m)  # a step that skipped every sample has no token means
        metrics = {k: float(np.mean([m[k] for m in steps if k in m])) for k in keys}
        for k in self.loss.maxima:  # the loss's own merge rules, not a list kept here
            metrics[k] = max(m[k] for m in steps if k in m)
        metrics["micro_batches"] = float(sum(m["micro_batches"] for m in steps))
        metrics["nonfinite_steps"] = float(sum(m["nonfinite_steps"] for m in steps))
        seconds = time.perf_counter() - start
        metrics.update(
            counts,
            skipped=0.0,
            optimizer_steps=float(len(steps)),
            seconds=seconds,
            tokens_per_s=counts["seq_tokens"] / seconds,
            step=float(self.step),
        )
        return self._prefixed(metrics)

    def _optimizer_step(
        self, samples: list[TokenSequence], old: list[Tensor | None] | None, ref: list[Tensor] | None,
        trained: list[bool] | None = None,
    ) -> dict[str, float]:
        """Accumulate the minibatch's gradient over micro-batches, clip, step. Returns its metrics.

        Samples with ``trained[i]`` False (zero advantage, no KL / entropy term) run no forward: their
        gradient is exactly 0, but they stay in the normaliser, so the step is the one with them."""
        cfg = self.config
        trained = trained if trained is not None else [True] * len(samples)
        run = [i for i, t in enumerate(trained) if t]
        batches = []
        for group in self._micro_batches([samples[i] for i in run]):
            group = [run[g] for g in group]
            batches.append(
                self._collate(
                    [samples[i] for i in group],
                    None if old is None else [old[i] for i in group],  # type: ignore[misc]
                    None if ref is None else [ref[i] for i in group],
                )
            )
        # The minibatch's denominator, known before any forward: micro-batch losses then sum to it.
        # Skipped samples add to it exactly as they would have (their masks are all it depends on).
        normalizer = sum((loss_normalizer(b.loss_mask, cfg.aggregation, b.weights) for b in batches),
                         torch.zeros((), device=self.device))
        for i, t in enumerate(trained):
            if not t:
                mask = torch.as_tensor(samples[i].loss_mask[1:], dtype=torch.float32, device=self.device)[None]
                weight = torch.ones(1, device=self.device)  # one sample: its share of the denominator
                normalizer = normalizer + loss_normalizer(mask, cfg.aggregation, weight)
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = {}
        maxima = dict.fromkeys(self.loss.maxima, 0.0)
        token_total = 0.0
        loss_total = 0.0
        prefixes = self._prefix_passes(batches)
        for b, prefix in zip(batches, prefixes, strict=True):
            logp, entropy = self._forward(b, entropy=cfg.compute_entropy, loss_positions_only=True, prefix=prefix)
            loss, m = self.loss.fn(
                logp,
                logp.detach() if b.old_logp is None else b.old_logp,
                b.advantages,
                b.loss_mask,
                aggregation=cfg.aggregation,
                sample_weight=b.weights,
                ref_logp=b.ref_logp,
                entropy=entropy,
                global_normalizer=normalizer,
                **self.loss_options,
            )
            (loss if self.scaler is None else self.scaler.scale(loss)).backward()
            loss_total += float(loss.detach())
            # Re-weight per-call metrics into minibatch ones, as the loss declares: token-means by
            # weighted token count, normalised ones by this call's share of the minibatch's normaliser.
            tokens = float((b.loss_mask.sum(-1) * b.weights).sum())
            token_total += tokens
            own = float(loss_normalizer(b.loss_mask, cfg.aggregation, b.weights))
            for k, v in m.items():
                kind = self.loss.merge_kind(k)
                if kind == "max":
                    maxima[k] = max(maxima.get(k, v), v)
                elif kind == "normalised":
                    sums[k] = sums.get(k, 0.0) + v * own / max(float(normalizer), 1e-12)
                else:
                    sums[k] = sums.get(k, 0.0) + v * tokens

        for prefix in {id(p[0]): p[0] for p in prefixes if p is not None}.values():
            prefix.backward()  # the micro-batches' gradients on the shared prefixes, through their pass
        if not batches:  # every sample skipped: a zero gradient still moves AdamW (momentum, decay)
            for p in self.params:
                p.grad = torch.zeros_like(p)
        max_norm = cfg.max_grad_norm if cfg.max_grad_norm is not None else float("inf")
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, max_norm))
        finite = bool(np.isfinite(grad_norm))
        if self.scaler is not None:  # skips the step itself on inf/NaN gradients and lowers the scale
            self.scaler.step(self.optimizer)
            self.scaler.update()
        elif finite:
            self.optimizer.step()
        if self.optimizer.defaults.get("fused") and (finite or self.scaler is not None):
            # The fused kernel writes the weights without bumping their version counters, which is how
            # a policy's KV cache and the decode steps see that the shared model moved (policies/kv_cache.py,
            # fast_step.py, lean_forward.py).
            torch.autograd.graph.increment_version(self.params)
        self.optimizer.zero_grad(set_to_none=True)

        metrics = {k: (v if self.loss.merge_kind(k) == "normalised" else v / max(token_total, 1e-12))
                   for k, v in sums.items()}
        metrics.update(maxima)
        metrics.update(
            loss=loss_total,
            grad_norm=grad_norm,
            micro_batches=float(len(batches)),
            nonfinite_steps=float(not finite),
        )
        return metrics

    def _prefixed(self, metrics: dict[str, float]) -> dict[str, float]:
        return {f"{self.role}/{k}": float(v) for k, v in metrics.items()}

