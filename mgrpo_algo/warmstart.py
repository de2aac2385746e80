"""Supervised warm start (curriculum stage 1): imitate the scripted oracle, with noise.

Tiny models built from scratch cannot emit the protocol at all, so RL has nothing to reinforce.
The warm start shows them oracle demonstrations - the hierarchy's main and sub-agent chats, or the
single agent's - and fits the assistant turns with cross-entropy. ``noise`` replaces that share of
demonstrated actions by well-formed but random protocol actions (a wrong delegation, a random
search, a made-up answer), so the warm-started policy is imperfect and RL has room to improve.

Sequences are built exactly as rollouts build prompts (:class:`~mgrpo_algo.hf_policy.ChatPrompter`:
first prompt from the chat template, then each completion followed by the template's continuation),
so what is imitated is token for token what the policy will later be asked to continue.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from mgrpo_env.policies import OraclePolicy
from mgrpo_env.rollout import collect, collect_single
from mgrpo_env.spaces import ProtocolText

from .config import WarmStartConfig
from .hf_policy import ChatPrompter, load_tokenizer

__all__ = ["WarmStartConfig", "demonstrations", "sft_sequences", "sft_train", "warm_start"]


def demonstrations(
    scenario: Any, world: Any, splits: Sequence[str], max_tasks: int, *, single: bool, limits: Mapping[str, int] | None = None
) -> dict[str, list[list[dict[str, str]]]]:
    """Oracle chats per role: {"main": [...], "sub": [...]} or {"single": [...]}, correct episodes only."""
    chats: dict[str, list[list[dict[str, str]]]] = {"single": []} if single else {"main": [], "sub": []}
    for split in splits:
        tasks = list(scenario.tasks(split))[:max_tasks]
        if single:
            turns = (limits or {}).get("max_main_turns", 6) * (limits or {}).get("max_sub_turns", 4)
            records = collect_single(scenario, tasks, 1, OraclePolicy(scenario, "single"), world=world,
                                     env_kwargs={"max_turns": max(turns, 24)})
            chats["single"] += [r.main.messages for r in records if r.correct]
        else:
            policies = {"main": OraclePolicy(scenario, "main"), "sub": OraclePolicy(scenario, "sub")}
            records = collect(scenario, tasks, 1, policies, world=world, env_kwargs=dict(limits or {}))
            for r in records:
                if r.correct:
                    chats["main"].append(r.main.messages)
                    chats["sub"] += [s.messages for s in r.subs]
    return chats


def sft_sequences(
    tokenizer: Any, chats: Sequence[Sequence[Mapping[str, str]]], *, role: str, noise: float, rng: random.Random,
    max_seq_tokens: int,
) -> tuple[list[tuple[list[int], list[int]]], dict[str, int]]:
    """(input_ids, loss_mask) per chat, built as rollouts build prompts; noisy actions replace oracle ones."""
    prompter = ChatPrompter(tokenizer, max_prompt_tokens=max_seq_tokens)
    corrupt = ProtocolText(4000, role, protocol_share=1.0, seed=rng.randrange(2**31))
    out, skipped, noisy = [], 0, 0
    for chat in chats:
        ids = prompter.first_prompt(chat[:2])
        mask = [0] * len(ids)
        for i in range(2, len(chat), 2):
            content = chat[i]["content"]
            if noise and rng.random() < noise:
                content, noisy = corrupt.sample(), noisy + 1
            completion = prompter.encode(content)
            ids += completion
            mask += [1] * len(completion)
            if i + 1 < len(chat):
                cont = prompter.continuation(completion, [chat[i + 1]])
                ids += cont
                mask += [0] * len(cont)
        if len(ids) > max_seq_tokens:
            skipped += 1
            continue
        out.append((ids, mask))
    return out, {"sequences": len(out), "skipped_too_long": skipped, "noisy_actions": noisy}


def sft_train(model: Any, sequences: list[tuple[list[int], list[int]]], cfg: WarmStartConfig, *, pad_id: int) -> dict[str, float]:
    """Cross-entropy on the loss-masked tokens (token mean per step), AdamW, ``cfg.epochs`` passes."""
    if not sequences:
        return {"steps": 0, "loss_first": math.nan, "loss_last": math.nan}
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    rng = random.Random(cfg.seed)
    model.train()
    losses = []
    started = time.perf_counter()
    tokens = 0
    for _ in range(cfg.epochs):
        order = sorted(range(len(sequences)), key=lambda i: (len(sequences[i][0]), rng.random()))
        batches, current, longest = [], [], 0
        for i in order:  # length-sorted packing under the token budget, then shuffled batches
            longest_next = max(longest, len(sequences[i][0]))
            if current and longest_next * (len(current) + 1) > cfg.batch_tokens:
                batches.append(current)
                current, longest_next = [], len(sequences[i][0])
            current.append(i)
            longest = longest_next
        if current:
            batches.append(current)
        rng.shuffle(batches)
        for batch in batches:
            width = max(len(sequences[i][0]) for i in batch)
            ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
            labels = torch.full((len(batch), width), -100, dtype=torch.long)
            attention = torch.zeros((len(batch), width), dtype=torch.long)
            for row, i in enumerate(batch):
                seq, mask = sequences[i]
                ids[row, : len(seq)] = torch.tensor(seq)
                attention[row, : len(seq)] = 1
                labels[row, : len(seq)] = torch.tensor([t if m else -100 for t, m in zip(seq, mask, strict=True)])
            logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1]
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            losses.append(loss.item())
            tokens += int((labels != -100).sum())
    model.eval()
    seconds = time.perf_counter() - started
    return {"steps": len(losses), "loss_first": losses[0], "loss_last": losses[-1], "seconds": seconds,
            "tokens_per_s": tokens / seconds if seconds else 0.0}


def warm_start(
    scenario: Any, model_paths: Mapping[str, str], out_dir: str | Path, cfg: WarmStartConfig, *,
    limits: Mapping[str, int] | None = None,
) -> dict[str, Path]:
    """Warm-start every role of ``model_paths`` into ``out_dir/<role>``; reused when already done.

    The folder's ``warm_start.json`` records the config and source models; a match is reused.
    """
    from transformers import AutoModelForCausalLM

    out = Path(out_dir)
    key = {"config": asdict(cfg), "models": {r: str(p) for r, p in model_paths.items()}, "scenario": scenario.metadata,
           "limits": dict(limits or {})}
    key = json.loads(json.dumps(key, default=str))
    done = {role: out / role for role in model_paths}
    if all((p / "warm_start.json").is_file() and json.loads((p / "warm_start.json").read_text())["key"] == key
           for p in done.values()):
        return done
    single = set(model_paths) == {"single"}
    with scenario.open() as world:
        chats = demonstrations(scenario, world, cfg.splits, cfg.max_tasks, single=single, limits=limits)
    rng = random.Random(cfg.seed)
    for role, path in model_paths.items():
        tokenizer = load_tokenizer(path)
        model = AutoModelForCausalLM.from_pretrained(path)
        sequences, counts = sft_sequences(tokenizer, chats[role], role=role, noise=cfg.noise, rng=rng,
                                          max_seq_tokens=cfg.max_seq_tokens)
        metrics = sft_train(model, sequences, cfg, pad_id=tokenizer.pad_token_id or 0)
        target = done[role]
        target.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(target)
        tokenizer.save_pretrained(target)
        (target / "warm_start.json").write_text(json.dumps({"key": key, "counts": counts, "metrics": metrics}, indent=2) + "\n")
    return done
