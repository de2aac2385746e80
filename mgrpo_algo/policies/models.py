"""Tiny local models: a byte-level BPE tokenizer trained on a scenario's corpus, and Qwen2 models.

The embedded default of the design (docs/design.md) ("tiny Qwen2-architecture models built and trained locally")
without any download: :func:`train_tokenizer` trains a byte-level BPE on text the agents will read
and write (:func:`corpus_texts`), :func:`build_tiny_model` writes a randomly initialised
``Qwen2ForCausalLM`` next to it, and :func:`build_role_models` does both for every role, once.

Everything is saved with ``save_pretrained`` and loads back with the ordinary calls, so a real hub
model name or path drops in wherever a tiny model folder is used::

    paths = build_role_models(scenario, "runs/models")
    model = AutoModelForCausalLM.from_pretrained(paths["main"])
    tokenizer = AutoTokenizer.from_pretrained(paths["main"])

The tokenizer:

- byte-level BPE (Qwen2's pre-tokenisation regex: digits one by one, words with their leading
  space), so any text round-trips, whatever the vocabulary size;
- special tokens ``<|endoftext|>`` (eos and pad), ``<|im_start|>``, ``<|im_end|>``;
- the protocol tags (:data:`PROTOCOL_TAGS`) as added, non-special tokens: each is one token, it is
  never split or merged with its neighbours, and it decodes to its text even with
  ``skip_special_tokens=True`` - a tiny model writes ``</answer>`` as one token, and the policy can
  stop generation on that token's id;
- a ChatML chat template (:data:`CHAT_TEMPLATE`), as Qwen2.5's without tool rendering (our tools
  are described in the system prompt).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from mgrpo_env import strict_json
from mgrpo_env.roles import ROLES
from mgrpo_scenarios import NamesWorldTokens, ScriptsOracle, StylesPrompts

__all__ = [
    "SPECIAL_TOKENS",
    "PROTOCOL_TAGS",
    "CHAT_TEMPLATE",
    "ROLES",
    "DEFAULT_SIZE",
    "train_tokenizer",
    "corpus_texts",
    "build_tiny_model",
    "build_role_models",
    "count_parameters",
]

#: eos / pad first (id 0), then the ChatML turn markers.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
#: The agent protocol's tags (mgrpo_env.protocol), one token each.
PROTOCOL_TAGS = (
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<answer>",
    "</answer>",
    "<result>",
    "</result>",
    "<tool_response>",
    "</tool_response>",
)
#: ChatML, as Qwen2.5 renders plain messages: ``<|im_start|>role\ncontent<|im_end|>\n`` per message,
#: ``<|im_start|>assistant\n`` as the generation prompt.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
#: Qwen2's pre-tokenisation split (digits one by one; letters with one leading non-letter).
_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
#: The default size of every role's model (1.05 M parameters with a 2,048-token vocabulary).
DEFAULT_SIZE: Mapping[str, int] = {"hidden_size": 128, "num_layers": 4, "num_heads": 4, "num_kv_heads": 2}
_MANIFEST = "mgrpo_model.json"
_FORMAT = 1  # bump when what a given manifest builds changes


# --------------------------------------------------------------------------- tokenizer


def train_tokenizer(
    texts: Iterable[str], out_dir: str | Path | None = None, *, vocab_size: int = 2048, min_frequency: int = 2,
    world_tokens: Iterable[str] = (),
) -> Any:
    """Train a byte-level BPE on ``texts`` and wrap it as a transformers ``PreTrainedTokenizerFast``.

    Args:
        texts: the training corpus (e.g. :func:`corpus_texts`); iterated once.
        out_dir: where to ``save_pretrained`` it (skipped when None).
        vocab_size: target size of the learned vocabulary, special and tag tokens included (the
            real size is smaller when the corpus has fewer merges to offer). At least 256 + 13.
        min_frequency: a pair must occur this often to be merged.
        world_tokens: strings made one token each after training (e.g. a scenario's entity names and
            values, ``Scenario.world_tokens()``), matched as whole words only, never split; they
            come on top of ``vocab_size``.

    Returns:
        The tokenizer, with ``eos_token == pad_token == "<|endoftext|>"`` and :data:`CHAT_TEMPLATE`.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 256 + len(SPECIAL_TOKENS) + len(PROTOCOL_TAGS):
        raise ValueError(f"vocab_size must be at least {256 + len(SPECIAL_TOKENS) + len(PROTOCOL_TAGS)}, got {vocab_size}")
    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(PROTOCOL_TAGS),  # the tags are added after training
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    raw.train_from_iterator(texts, trainer)
    # Non-special added tokens: matched before pre-tokenisation (never split), kept by decode.
    raw.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in PROTOCOL_TAGS])
    extra = [t for t in dict.fromkeys(world_tokens) if t and t not in PROTOCOL_TAGS]
    if extra:
        # Whole words only, so that a value such as "opera" is not cut out of "operate" (a token that
        # ends in punctuation, e.g. a URL prefix, is matched wherever it occurs).
        raw.add_tokens([AddedToken(t, special=False, normalized=False, single_word=t[-1].isalnum()) for t in extra])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        eos_token=SPECIAL_TOKENS[0],
        pad_token=SPECIAL_TOKENS[0],
        additional_special_tokens=list(SPECIAL_TOKENS[1:]),
        model_max_length=1 << 20,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        tokenizer.save_pretrained(str(out_dir))
    return tokenizer


def corpus_texts(scenario: Any, *, max_pages: int | None = None, max_tasks: int = 2000) -> Iterator[str]:
    """The text agents of ``scenario`` read and write, for training a tokenizer.

    Yields, in a fixed order: each page of ``<root>/pages/wiki/*.html`` as the visit tool shows it
    (``html_to_document`` + ``render_page``, inside ``<tool_response>``), every split's questions and
    hop questions (up to ``max_tasks`` per split), the system prompts of all roles, and scripted
    demonstrations of every action kind (the oracle's delegate and search calls, visit calls,
    answers, results, a search result listing). Only needs ``scenario.build()`` (no server). URLs
    are written as agents see them: on the wiki-hops world's stable origin (``http://wiki-hops.test``),
    ``/wiki/<Slug>`` without ``.html``.
    """
    from mgrpo_env.protocol import format_tool_response, role_tools, system_prompt
    from mgrpo_scenarios.wiki_hops import ORIGIN
    from mgrpo_tools.html_text import html_to_document, render_page

    root = Path(scenario.build())
    base = ORIGIN
    files = sorted((root / "pages" / "wiki").glob("*.html"))
    for path in files[:max_pages] if max_pages is not None else files:
        url = f"{base}/wiki/{path.stem}"
        doc = html_to_document(path.read_text(encoding="utf-8", errors="replace"), url)
        text, _ = render_page(doc, 1, page_chars=max(200, len(doc.text) + 200 * (len(doc.links) + 1)))
        yield format_tool_response(f"Goal: read the page of {doc.title}\n{text}")
    style = scenario.prompt_style if isinstance(scenario, StylesPrompts) else "full"
    for role in ROLES:  # the prompts the envs build: the scenario's tool sets
        yield system_prompt(role, role_tools(scenario, role), style)
    tasks = []
    for split in scenario.splits():
        split_tasks = list(scenario.tasks(split))[:max_tasks]
        tasks.extend(split_tasks)
        for task in split_tasks:
            yield task.question
            for hop in task.hops:
                yield hop.question
    yield from _demonstrations(scenario, tasks[:200], base)


def _demonstrations(scenario: Any, tasks: list[Any], base: str) -> Iterator[str]:
    """Protocol texts as the scripted oracle writes them (first turns from the real OraclePolicy)."""
    from mgrpo_env.protocol import (
        MAIN_TOOLS,
        SUB_TOOLS,
        format_error,
        format_tool_response,
        parse_action,
        system_prompt,
    )
    from mgrpo_env.rollout import PolicyRequest
    from mgrpo_env.scripted import OraclePolicy

    main = OraclePolicy(scenario, "main") if isinstance(scenario, ScriptsOracle) else None
    sub = OraclePolicy(scenario, "sub") if main is not None else None
    style = scenario.prompt_style if isinstance(scenario, StylesPrompts) else "full"
    main_prompt, sub_prompt = system_prompt("main", MAIN_TOOLS, style), system_prompt("sub", SUB_TOOLS, style)
    for i, task in enumerate(tasks):
        yield "system\nuser\nassistant\n"  # the chat template's role headers, in every prompt
        if main is not None and sub is not None:
            request = PolicyRequest(i, "main_0", "main", task.question,
                                    [{"role": "system", "content": main_prompt}, {"role": "user", "content": task.question}], task)
            delegate = main([request])[0]
            yield delegate
            parsed = parse_action(delegate, role="main", allowed_tools=MAIN_TOOLS)
            if parsed.ok and parsed.tool_name == "delegate":
                args = parsed.arguments or {}
                first = f"Subtask: {args.get('task', '')}" + (f"\nContext: {args['context']}" if args.get("context") else "")
                request = PolicyRequest(i, "sub_0", "sub", first,
                                        [{"role": "system", "content": sub_prompt}, {"role": "user", "content": first}], task)
                yield first
                yield sub([request])[0]
        for hop in task.hops[:1]:
            slug = hop.entity.replace(" ", "_")
            call = {"name": "visit", "arguments": {"url": f"{base}/wiki/{slug}", "goal": f"{hop.relation} of {hop.entity}"}}
            yield f"<think>visit next</think><tool_call>{json.dumps(call)}</tool_call>"
            yield format_tool_response(f"[1] {hop.entity}\nURL: {base}/wiki/{slug}\n{hop.question}")
            yield f"<think>read it</think><result>{hop.answer}</result>"
        yield format_tool_response(task.answer)
        yield f"<think>combine the reports</think><answer>{task.answer}</answer>"
    bad = parse_action("no tags here", role="sub", allowed_tools=SUB_TOOLS)
    yield format_error(bad)


# --------------------------------------------------------------------------- models


def _intermediate(hidden_size: int) -> int:
    """SwiGLU's usual 8/3 x hidden (same parameters as a 4x GELU MLP), rounded up to a multiple of 64."""
    return int(math.ceil(hidden_size * 8 / 3 / 64) * 64)


def build_tiny_model(
    tokenizer: Any,
    out_dir: str | Path | None = None,
    *,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 4096,
    rope_theta: float = 10000.0,
    seed: int = 0,
) -> Any:
    """A randomly initialised ``Qwen2ForCausalLM`` for ``tokenizer``, saved (safetensors) with it.

    Args:
        tokenizer: its length is the vocabulary size; its eos / pad / ``<|im_end|>`` ids go into
            the config and the generation config.
        out_dir: ``save_pretrained`` target for the model and the tokenizer (skipped when None),
            so that ``AutoModelForCausalLM.from_pretrained(out_dir)`` and
            ``AutoTokenizer.from_pretrained(out_dir)`` load them.
        hidden_size, num_layers, num_heads, num_kv_heads: the transformer's shape (grouped-query
            attention when ``num_kv_heads < num_heads``). ``hidden_size % num_heads == 0`` and
            ``num_heads % num_kv_heads == 0``.
        intermediate_size: MLP width; default 8/3 x hidden rounded up to a multiple of 64.
        max_position_embeddings: the context length (RoPE, so only a limit, no parameters).
        seed: initialisation seed (the global torch RNG is left as it was).

    The input and output embeddings are tied (as in small Qwen2 models), float32.
    """
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    if hidden_size % num_heads or num_heads % num_kv_heads:
        raise ValueError(
            f"hidden_size ({hidden_size}) must be divisible by num_heads ({num_heads}), "
            f"and num_heads by num_kv_heads ({num_kv_heads})"
        )
    eos_ids = _end_ids(tokenizer)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or _intermediate(hidden_size),
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        rope_theta=rope_theta,
        tie_word_embeddings=True,
        use_sliding_window=False,
        bos_token_id=None,
        eos_token_id=eos_ids[0],
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=eos_ids, pad_token_id=tokenizer.pad_token_id, bos_token_id=None
    )
    model.eval()
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(str(out))
        tokenizer.save_pretrained(str(out))
    return model


def _end_ids(tokenizer: Any) -> list[int]:
    """``<|im_end|>`` (end of an assistant turn) then eos, the ids that end a generation."""
    ids = []
    for token in ("<|im_end|>", tokenizer.eos_token):
        if token is None:
            continue
        tid = tokenizer.convert_tokens_to_ids(token)
        if tid is not None and tid != tokenizer.unk_token_id and tid not in ids:
            ids.append(int(tid))
    return ids


def count_parameters(model: Any) -> int:
    """Distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def _scenario_key(scenario: Any) -> dict[str, Any]:
    return {"name": getattr(scenario, "name", type(scenario).__name__), "metadata": dict(getattr(scenario, "metadata", {}) or {})}


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def build_role_models(
    scenario: Any,
    out_root: str | Path,
    sizes: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    vocab_size: int = 2048,
    min_frequency: int = 2,
    seed: int = 0,
    roles: Iterable[str] = ROLES,
) -> dict[str, Path]:
    """One shared tokenizer and one tiny model folder per role under ``out_root``; idempotent.

    Layout: ``out_root/tokenizer/`` and ``out_root/<role>/`` (model + a copy of the tokenizer, so
    each role folder is a complete ``from_pretrained`` target). Each folder carries a manifest
    (``mgrpo_model.json``) of what built it: scenario name and metadata, vocabulary size, seed,
    the role's size. A folder whose manifest matches is reused as it is - weights a learner saved
    there since are kept. A folder with a different manifest is refused (ValueError) rather than
    overwritten: pick another ``out_root`` or delete it. Folders are written to a temporary
    sibling and renamed into place, so an interrupted build leaves nothing half-made.

    Args:
        scenario: the scenario whose corpus trains the tokenizer (built if needed).
        out_root: the models' folder.
        sizes: per-role keyword arguments of :func:`build_tiny_model` (``hidden_size``,
            ``num_layers``, ...); a role missing here gets :data:`DEFAULT_SIZE`.
        vocab_size, min_frequency: tokenizer training (:func:`train_tokenizer`).
        seed: model initialisation; role ``i`` of :data:`ROLES` uses ``seed + i``.
        roles: which roles to build (default main, sub and single).

    Returns:
        {role: folder}.
    """
    out_root = Path(out_root)
    out_root.mkdir(parents=True, exist_ok=True)
    sizes = dict(sizes or {})
    unknown = sorted(set(sizes) - set(ROLES))
    if unknown:
        raise ValueError(f"unknown role(s) {unknown} in sizes; roles are {list(ROLES)}")
    world_tokens = list(scenario.world_tokens()) if isinstance(scenario, NamesWorldTokens) else []
    tok_key = {"format": _FORMAT, "kind": "tokenizer", "scenario": _scenario_key(scenario),
               "vocab_size": vocab_size, "min_frequency": min_frequency}
    if world_tokens:
        tok_key["world_tokens"] = _digest(world_tokens)
    tok_dir = out_root / "tokenizer"

    def make_tokenizer(tmp: Path) -> None:
        train_tokenizer(corpus_texts(scenario), tmp, vocab_size=vocab_size, min_frequency=min_frequency,
                        world_tokens=world_tokens)

    _build_once(tok_dir, tok_key, make_tokenizer)
    tokenizer = None
    paths: dict[str, Path] = {}
    for role in roles:
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; roles are {list(ROLES)}")
        size = {**DEFAULT_SIZE, **dict(sizes.get(role, {}))}
        role_seed = seed + ROLES.index(role)
        key = {"format": _FORMAT, "kind": "model", "role": role, "tokenizer": _digest(tok_key),
               "size": size, "seed": role_seed}

        def make_model(tmp: Path, size: dict[str, Any] = size, role_seed: int = role_seed) -> None:
            nonlocal tokenizer
            if tokenizer is None:
                from transformers import AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(str(tok_dir))
            build_tiny_model(tokenizer, tmp, seed=role_seed, **size)

        _build_once(out_root / role, key, make_model)
        paths[role] = out_root / role
    return paths


def _build_once(folder: Path, key: Mapping[str, Any], make: Any) -> None:
    """Run ``make(tmp)`` and rename ``tmp`` to ``folder`` with a manifest, unless it is built already."""
    manifest = folder / _MANIFEST
    if manifest.is_file():
        existing = json.loads(manifest.read_text())
        if existing.get("key") == json.loads(json.dumps(dict(key), default=str)):
            return
        raise ValueError(
            f"{folder} was built with other arguments ({existing.get('key')}); "
            f"use another out_root or delete it (wanted {dict(key)})"
        )
    if folder.exists() and any(folder.iterdir()):
        raise ValueError(f"{folder} exists without a {_MANIFEST}: not ours, refusing to overwrite it")
    tmp = folder.parent / f".{folder.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    try:
        make(tmp)
        (tmp / _MANIFEST).write_text(strict_json.dumps({"key": dict(key)}, indent=2, sort_keys=True, default=str) + "\n")
        if folder.exists():
            folder.rmdir()  # empty (checked above)
        try:
            os.rename(tmp, folder)
        except OSError:
            if not (folder / _MANIFEST).is_file():
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # a concurrent builder finished first
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
