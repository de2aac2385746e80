"""Supervised warm start (curriculum stage 1): imitate the scripted oracle, with noise.

Tiny models built from scratch cannot emit the protocol at all, so RL has nothing to reinforce.
The warm start shows them oracle demonstrations - the hierarchy's main and sub-agent chats, or the
single agent's - and fits the assistant turns with cross-entropy. ``noise`` replaces that share of
demonstrated actions by well-formed but random protocol actions (a wrong delegation, a random
search, a made-up answer), so the warm-started policy is imperfect and RL has room to improve.

Sequences are built exactly as rollouts build prompts (:class:`~mgrpo_algo.policies.chat_tokens.ChatPrompter`:
first prompt from the chat template, then each completion followed by the template's continuation),
so what is imitated is token for token what the policy will later be asked to continue.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tqdm import tqdm

from mgrpo_env import strict_json
from mgrpo_env.roles import ROLE_TABLE, env_roles
from mgrpo_env.rollout import collect
from mgrpo_env.scripted import OraclePolicy
from mgrpo_env.spaces import ProtocolText
from mgrpo_scenarios import GroupsWorldTokens

from ..core.config import Limits, WarmStartConfig
from ..core.seeding import torch_threads
from ..policies.chat_tokens import ChatPrompter, load_tokenizer

__all__ = ["WarmStartConfig", "Relabeled", "token_groups", "lr_factor", "demonstrations", "padded_batch", "sft_sequences", "sft_train", "token_budget_batches", "turn_exact_match",
           "warm_start", "demo_env_kwargs", "tools_key", "episode_roles"]


def episode_roles(role: str) -> tuple[str, ...]:
    """The roles whose chats one episode of ``role``'s demonstrations holds (and whose tools it shows):
    every role of its env (the role table's)."""
    return env_roles(ROLE_TABLE[role].env)


def demo_env_kwargs(limits: Limits | None, tools: Mapping[str, Sequence[str]] | None, *, single: bool) -> dict[str, Any]:
    """The env options of a demonstration episode: the run's limits (the single agent's turn budget
    with room for the oracle's longest chains) and, where the run chooses them, its roles' tools, so a
    start model is shown the prompts the run will show it (``TrainConfig.tools``)."""
    limits = limits or Limits()
    kwargs: dict[str, Any] = {"limits": limits, "max_turns": max(limits.single_agent_turns, 24)} if single else {"limits": limits}
    return {**kwargs, **tools_key(tools, "single" if single else "main")}


def tools_key(tools: Mapping[str, Sequence[str]] | None, role: str) -> dict[str, Any]:
    """The part of ``role``'s warm-start key its run's tool choice makes: the chosen tools of the
    roles its demonstrations' episodes show, or nothing where the run keeps the scenario's (so every
    existing key, made before tools could be chosen, stays the same)."""
    chosen = {r: list(tools[r]) for r in episode_roles(role) if tools and r in tools}
    return {"tools": chosen} if chosen else {}


def demonstrations(
    scenario: Any, world: Any, splits: Sequence[str], max_tasks: int, *, single: bool, limits: Limits | None = None,
    held_out: int = 0, validation: bool = False, progress: bool = False, tools: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, list[list[dict[str, str]]]]:
    """Oracle chats per role: {"main": [...], "sub": [...]} or {"single": [...]}, correct episodes only.

    The last ``held_out`` tasks of each split are kept out of the first ``max_tasks`` demonstrated;
    ``validation=True`` demonstrates those held-out tasks instead. ``tools`` (role -> names, the
    run's ``TrainConfig.tools``) chooses the tools the episodes show; default the scenario's.
    """
    chats: dict[str, list[list[dict[str, str]]]] = {role: [] for role in episode_roles("single" if single else "main")}
    single_policy = OraclePolicy(scenario, "single") if single else None
    env_kwargs = demo_env_kwargs(limits, tools, single=single)
    policies = {} if single else {"main": OraclePolicy(scenario, "main"), "sub": OraclePolicy(scenario, "sub")}
    for split in splits:
        every = list(scenario.tasks(split))
        cut = max(0, len(every) - held_out)
        tasks = every[cut:] if validation else every[:cut][:max_tasks]
        bar = tqdm(total=len(tasks), desc=f"oracle demonstrations {split}" + (" (validation)" if validation else ""),
                   unit="task", leave=False, disable=not progress)
        for start in range(0, len(tasks), 50):  # chunks only to move the progress bar
            chunk = tasks[start : start + 50]
            if single:
                records = collect(scenario, chunk, 1, {"single": single_policy}, world=world, env_kwargs=env_kwargs, env="single")
                chats["single"] += [r.main.messages for r in records if r.correct]
            else:
                records = collect(scenario, chunk, 1, policies, world=world, env_kwargs=env_kwargs)
                for r in records:
                    if r.correct:
                        chats["main"].append(r.main.messages)
                        chats["sub"] += [s.messages for s in r.subs]
            bar.update(len(chunk))
        bar.close()
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


class Relabeled(Sequence[tuple[list[int], list[int]]]):
    """Demonstrations whose world tokens are relabelled at random each time one is read.

    ``groups`` are lists of interchangeable members, each member a tuple of token ids that move
    together (an entity's name and its slug). In a sequence, every member present is replaced by a
    distinct random member of its group, the same everywhere in the sequence, so a copy stays a
    copy. Lengths and loss masks are unchanged.
    """

    def __init__(self, sequences: Sequence[tuple[list[int], list[int]]], groups: Sequence[Sequence[tuple[int, ...]]],
                 seed: int = 0) -> None:
        self.sequences, self.groups = sequences, [list(g) for g in groups]
        self.rng = random.Random(seed)
        self._where: dict[int, tuple[int, int]] = {}
        for g, members in enumerate(self.groups):
            for m, ids in enumerate(members):
                for token in ids:
                    self._where.setdefault(token, (g, m))

    def __len__(self) -> int:
        return len(self.sequences)

    def __getitem__(self, index: int) -> tuple[list[int], list[int]]:  # type: ignore[override]
        ids, mask = self.sequences[index]
        present = dict.fromkeys(self._where[t] for t in ids if t in self._where)
        if not present:
            return ids, mask
        mapping: dict[int, int] = {}
        for g in dict.fromkeys(g for g, _ in present):
            olds = [m for gg, m in present if gg == g]
            news = self.rng.sample(range(len(self.groups[g])), len(olds))
            for old, new in zip(olds, news, strict=True):
                for a, b in zip(self.groups[g][old], self.groups[g][new], strict=True):
                    mapping[a] = b
        return [mapping.get(t, t) for t in ids], mask


def token_groups(scenario: Any, tokenizer: Any) -> list[list[tuple[int, ...]]]:
    """The scenario's ``world_token_groups()`` as token ids; members that are not one token each are left out."""
    groups = scenario.world_token_groups() if isinstance(scenario, GroupsWorldTokens) else {}
    unk = getattr(tokenizer, "unk_token_id", None)

    def one(text: str) -> int | None:
        ids = tokenizer.encode(text, add_special_tokens=False)
        return ids[0] if len(ids) == 1 and ids[0] != unk else None

    out = []
    for members in groups.values():
        converted = [tuple(one(t) for t in member) for member in members]
        kept = [m for m in converted if all(t is not None for t in m)]
        if len(kept) > 1:
            out.append(kept)
    return out  # type: ignore[return-value]


def token_budget_batches(sequences: Sequence[tuple[list[int], list[int]]], batch_tokens: int,
                         rng: random.Random) -> list[list[int]]:
    """Indices of ``sequences`` packed, sorted by length (ties at random), into batches of at most
    ``batch_tokens`` padded tokens (a longer sequence gets a batch of its own), in shuffled order."""
    order = sorted(range(len(sequences)), key=lambda i: (len(sequences[i][0]), rng.random()))
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        longest_next = max(longest, len(sequences[i][0]))
        if current and longest_next * (len(current) + 1) > batch_tokens:
            batches.append(current)
            current, longest_next = [], len(sequences[i][0])
        current.append(i)
        longest = longest_next
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches


def padded_batch(sequences: Sequence[tuple[list[int], list[int]]], batch: Sequence[int],
                 pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``(input_ids, labels)`` of ``sequences[batch]``; labels are -100 off the loss mask."""
    width = max(len(sequences[i][0]) for i in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    for row, i in enumerate(batch):
        seq, mask = sequences[i]
        ids[row, : len(seq)] = torch.tensor(seq)
        labels[row, : len(seq)] = torch.tensor([t if m else -100 for t, m in zip(seq, mask, strict=True)])
    return ids, labels


def lr_factor(step: int, total: int, warmup: int, min_ratio: float) -> float:
    """Linear warmup over ``warmup`` steps, then cosine decay to ``min_ratio`` at step ``total``.

    >>> [round(lr_factor(s, 10, 2, 0.1), 3) for s in (0, 1, 2, 6, 10)]
    [0.5, 1.0, 1.0, 0.55, 0.1]
    """
    if step < warmup:
        return (step + 1) / warmup
    span = max(1, total - warmup)
    progress = min(1.0, (step - warmup) / span)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def sft_train(
    model: Any, sequences: Sequence[tuple[list[int], list[int]]], cfg: WarmStartConfig, *, pad_id: int, desc: str = "warm start",
    progress: bool = True, on_epoch: Callable[[dict[str, float]], None] | None = None, epochs: float | None = None,
) -> dict[str, float]:
    """Cross-entropy on the loss-masked tokens (token mean per step), AdamW, ``epochs`` passes
    (default ``cfg.epochs``; a fraction trains on that share of the last pass's batches), with
    ``cfg``'s warmup, cosine decay and beta2.

    ``on_epoch(stats)`` runs after each epoch with the model still on ``cfg.device`` (stats: epoch,
    steps, tokens, loss_tokens, loss = the epoch's mean, train_s = training time so far, the
    callbacks' own time excluded): the sweep benchmark evaluates its checkpoints there.
    """
    epochs = cfg.epochs if epochs is None else epochs
    if not sequences or epochs <= 0:
        return {"steps": 0, "loss_first": math.nan, "loss_last": math.nan}
    device = torch.device(cfg.device)
    model.to(device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0, betas=(0.9, cfg.beta2))
    rng = random.Random(cfg.seed)
    per_epoch = len(token_budget_batches(sequences, cfg.batch_tokens, random.Random(0)))
    total_steps = max(1, math.ceil(epochs * per_epoch))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, total_steps, cfg.warmup_steps, cfg.min_lr_ratio))
    losses: list[float] = []
    tokens = loss_tokens = positions = 0
    train_s = 0.0
    bar = tqdm(total=total_steps, desc=desc, unit="step", leave=False, disable=not progress)
    for epoch in range(1, math.ceil(epochs) + 1):
        model.train()
        started, first = time.perf_counter(), len(losses)
        for batch in token_budget_batches(sequences, cfg.batch_tokens, rng)[: total_steps - len(losses)]:
            ids, labels = padded_batch(sequences, batch, pad_id)
            tokens += sum(len(sequences[i][0]) for i in batch)
            loss_tokens += int((labels != -100).sum())
            positions += ids.numel()
            ids, labels = ids.to(device), labels.to(device)
            targets = labels[:, 1:]
            # The vocabulary projection only at positions that predict a loss token (most are prompt).
            columns = torch.nonzero((targets != -100).any(0)).squeeze(-1)
            with autocast:  # right padding under causal attention: no real token sees a pad, no mask needed
                logits = model(input_ids=ids, logits_to_keep=columns).logits
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets[:, columns].reshape(-1),
                                   ignore_index=-100)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            losses.append(loss.item())
            bar.update(1)
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
        train_s += time.perf_counter() - started
        if on_epoch is not None:
            on_epoch({"epoch": epoch, "steps": len(losses), "tokens": tokens, "loss_tokens": loss_tokens,
                      "loss": sum(losses[first:]) / max(1, len(losses) - first), "train_s": train_s})
    bar.close()
    model.to("cpu")  # saved, validated and rolled out from the CPU copy; the learner moves it again
    model.eval()
    return {"steps": len(losses), "loss_first": losses[0], "loss_last": losses[-1], "seconds": train_s,
            "tokens_per_s": loss_tokens / train_s if train_s else 0.0,
            "positions_per_s": positions / train_s if train_s else 0.0}


def turn_exact_match(model: Any, sequences: list[tuple[list[int], list[int]]], *, pad_id: int,
                     batch_tokens: int = 16384) -> dict[str, float]:
    """Share of demonstrated turns that greedy decoding would reproduce exactly.

    Under teacher forcing a turn (a maximal run of loss-masked tokens) counts when the argmax at
    each of its positions is the demonstrated token: then greedy decoding emits exactly that turn.
    Also the token accuracy over all loss positions. Runs on the model's device (bf16 on CUDA).
    """
    device = torch.device(getattr(model, "device", "cpu"))
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    turns = exact = right = total = 0
    model.eval()
    with torch.no_grad():
        for batch in token_budget_batches(sequences, batch_tokens, random.Random(0)):
            ids, labels = padded_batch(sequences, batch, pad_id)
            with autocast:  # right padding: no mask needed
                predicted = model(input_ids=ids.to(device)).logits[:, :-1].argmax(-1).cpu()
            hits_all = predicted == labels[:, 1:]
            for row, i in enumerate(batch):
                seq, mask = sequences[i]
                hits = hits_all[row, : len(seq) - 1].tolist() + [True]
                labelled = mask[1:] + [0]  # position i predicts token i + 1; a trailing 0 closes the last turn
                turn_ok, in_turn = True, False
                for m, hit in zip(labelled, hits, strict=True):
                    if m:
                        turn_ok = (turn_ok and hit) if in_turn else hit
                        in_turn = True
                        right, total = right + hit, total + 1
                    elif in_turn:
                        turns, exact, in_turn = turns + 1, exact + turn_ok, False
    return {"turn_exact_match": exact / turns if turns else float("nan"),
            "token_accuracy": right / total if total else float("nan"), "turns": turns}


def warm_start(
    scenario: Any, model_paths: Mapping[str, str], out_dir: str | Path, cfg: WarmStartConfig, *,
    limits: Limits | None = None, progress: bool = True, tools: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, Path]:
    """Warm-start every role of ``model_paths`` into ``out_dir/<role>``; reused when already done.

    The folder's ``warm_start.json`` records the config and source models (a match is reused), the
    training metrics and the turn exact match on the held-out validation demonstrations. ``tools``
    (the run's ``TrainConfig.tools``) chooses the tools the demonstrations show, and joins the key.
    """

    out = Path(out_dir)
    keys = {role: _role_key(scenario, cfg, role, path, limits, tools) for role, path in model_paths.items()}
    done = {role: out / role for role in model_paths}
    todo = [role for role in model_paths
            if not ((done[role] / "warm_start.json").is_file()
                    and json.loads((done[role] / "warm_start.json").read_text())["key"] == keys[role])]
    if not todo:
        return done
    chats: dict[str, Any] = {}
    held: dict[str, Any] = {}
    with scenario.open() as world:
        # the hierarchy's demonstrations (main and sub) and the single agent's are different episodes
        for single in sorted({role == "single" for role in todo}):
            chats.update(demonstrations(scenario, world, cfg.splits, cfg.max_tasks, single=single, limits=limits,
                                        held_out=cfg.validation_tasks, progress=progress, tools=tools))
            if cfg.validation_tasks:
                held.update(demonstrations(scenario, world, cfg.splits, cfg.max_tasks, single=single, limits=limits,
                                           held_out=cfg.validation_tasks, validation=True, tools=tools))
    with torch_threads(cfg.torch_threads):
        _fit_roles({role: model_paths[role] for role in todo}, chats, held, cfg, keys, done, progress, scenario)
    return done


def _role_key(scenario: Any, cfg: WarmStartConfig, role: str, path: str, limits: Limits | None,
              tools: Mapping[str, Sequence[str]] | None = None) -> Any:
    """What one role's warm start depends on: a change to another role's epochs does not retrain it."""
    options = {k: getattr(scenario, k) for k in ("page_chars", "search_k", "browser_mode", "profile") if hasattr(scenario, k)}
    config = {**asdict(cfg), "epochs": cfg.epochs_for(role)}
    config.pop("role_epochs")
    config.pop("teacher")  # the second stage's settings do not change the oracle stage
    key = {"role": role, "config": config, "model": str(path), "scenario": scenario.metadata,
           "scenario_options": options, "limits": asdict(limits or Limits()), **tools_key(tools, role)}
    return json.loads(json.dumps(key, default=str))


def _fit_roles(model_paths: Mapping[str, str], chats: Mapping[str, Any], held: Mapping[str, Any], cfg: WarmStartConfig,
               keys: Mapping[str, Any], done: Mapping[str, Path], progress: bool, scenario: Any = None) -> None:
    from transformers import AutoModelForCausalLM

    for role, path in model_paths.items():
        tokenizer = load_tokenizer(path)
        model = AutoModelForCausalLM.from_pretrained(path)
        rng = random.Random(f"{cfg.seed}-{role}")  # per role: retraining one role changes no other
        sequences, counts = sft_sequences(tokenizer, chats[role], role=role, noise=cfg.noise, rng=rng,
                                          max_seq_tokens=cfg.max_seq_tokens)
        pad_id = tokenizer.pad_token_id or 0
        shown: Sequence[tuple[list[int], list[int]]] = sequences
        if cfg.relabel:
            groups = token_groups(scenario, tokenizer)
            counts["relabel_groups"] = [len(g) for g in groups]
            shown = Relabeled(sequences, groups, seed=cfg.seed)
        metrics = sft_train(model, shown, cfg, pad_id=pad_id, desc=f"warm start {role}", progress=progress,
                            epochs=cfg.epochs_for(role))
        if held.get(role):
            validation, _ = sft_sequences(tokenizer, held[role], role=role, noise=0.0, rng=random.Random(0),
                                          max_seq_tokens=cfg.max_seq_tokens)
            if validation:
                metrics["validation"] = turn_exact_match(model, validation, pad_id=pad_id)
        target = done[role]
        target.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(target)
        tokenizer.save_pretrained(target)
        (target / "warm_start.json").write_text(strict_json.dumps({"key": keys[role], "counts": counts, "metrics": metrics}, indent=2) + "\n")
