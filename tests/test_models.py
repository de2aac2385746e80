"""Tiny local models: the tokenizer keeps protocol tags whole, models load back, builds are idempotent."""

from __future__ import annotations

import json

import pytest

from mgrpo_algo.policies.models import (
    CHAT_TEMPLATE,
    PROTOCOL_TAGS,
    SPECIAL_TOKENS,
    build_role_models,
    build_tiny_model,
    corpus_texts,
    count_parameters,
    train_tokenizer,
)
from mgrpo_env.protocol import MAIN_TOOLS, SUB_TOOLS, parse_action

PROTOCOL_TEXT = (
    '<think>Who founded Velmora Press? Search first.</think><tool_call>{"name": "search", '
    '"arguments": {"queries": ["Velmora Press founder", "1911"]}}</tool_call>'
)


@pytest.fixture(scope="module")
def corpus(small_scenario):
    return list(corpus_texts(small_scenario, max_pages=120, max_tasks=100))


@pytest.fixture(scope="module")
def tokenizer(corpus, tmp_path_factory):
    return train_tokenizer(corpus, tmp_path_factory.mktemp("tok"), vocab_size=1024)


def test_corpus_covers_pages_questions_prompts_and_actions(corpus, small_scenario):
    assert any(text.startswith("<tool_response>\nGoal: ") and "\nURL: http://" in text for text in corpus)
    question = next(small_scenario.tasks("stage2")).question
    assert question in corpus
    assert any("Tools (JSON schemas):" in text for text in corpus)
    delegates = [t for t in corpus if parse_action(t, role="main", allowed_tools=MAIN_TOOLS).tool_name == "delegate"]
    searches = [t for t in corpus if parse_action(t, role="sub", allowed_tools=SUB_TOOLS).tool_name == "search"]
    results = [t for t in corpus if parse_action(t, role="sub", allowed_tools=SUB_TOOLS).kind == "result"]
    assert delegates and searches and results


def test_tokenizer_round_trips_text_and_keeps_each_tag_one_token(tokenizer):
    assert len(tokenizer) <= 1024
    for text in (PROTOCOL_TEXT, "<answer>Ørsted, 1911 — café</answer>", "<result>x</result>\n<tool_response>\n{}\n</tool_response>"):
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(ids, skip_special_tokens=False) == text
        assert tokenizer.decode(ids, skip_special_tokens=True) == text  # tags are not "special": never skipped
    for tag in PROTOCOL_TAGS:
        ids = tokenizer.encode(f"a{tag}b", add_special_tokens=False)
        tag_id = tokenizer.convert_tokens_to_ids(tag)
        assert tokenizer.encode(tag, add_special_tokens=False) == [tag_id]
        assert tag_id in ids  # not merged with its neighbours
    ids = tokenizer.encode(PROTOCOL_TEXT, add_special_tokens=False)
    assert ids[0] == tokenizer.convert_tokens_to_ids("<think>")
    assert ids[-1] == tokenizer.convert_tokens_to_ids("</tool_call>")


def test_special_tokens_and_chat_template(tokenizer):
    assert tokenizer.eos_token == tokenizer.pad_token == "<|endoftext|>"
    assert [tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2]
    assert tokenizer.chat_template == CHAT_TEMPLATE
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids.count(tokenizer.convert_tokens_to_ids("<|im_start|>")) == 3


def test_tiny_model_saves_and_loads_back_with_from_pretrained(tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = build_tiny_model(tokenizer, tmp_path, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, seed=3)
    assert (tmp_path / "model.safetensors").is_file()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    cfg = loaded.config
    assert (cfg.model_type, cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (
        "qwen2", 64, 2, 4, 2)
    assert cfg.vocab_size == len(tokenizer) == len(tok)
    assert cfg.tie_word_embeddings and loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    assert cfg.intermediate_size == 192  # 8/3 x 64 rounded up to a multiple of 64
    assert count_parameters(loaded) == count_parameters(model)
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert a.equal(b), name
    assert tok.encode(PROTOCOL_TEXT, add_special_tokens=False) == tokenizer.encode(PROTOCOL_TEXT, add_special_tokens=False)
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in loaded.generation_config.eos_token_id
    same = build_tiny_model(tokenizer, None, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, seed=3)
    assert next(iter(same.parameters())).equal(next(iter(model.parameters())))  # seeded


def test_bad_shapes_are_refused(tokenizer):
    with pytest.raises(ValueError, match="divisible"):
        build_tiny_model(tokenizer, None, hidden_size=66, num_heads=4)


def test_role_models_share_one_tokenizer_and_are_idempotent(small_scenario, tmp_path):
    sizes = {"main": {"hidden_size": 64, "num_layers": 2}, "sub": {"hidden_size": 32, "num_layers": 1, "num_heads": 2,
                                                                     "num_kv_heads": 1}}
    paths = build_role_models(small_scenario, tmp_path, sizes, vocab_size=512)
    assert set(paths) == {"main", "sub", "single"}
    configs = {role: json.loads((path / "config.json").read_text()) for role, path in paths.items()}
    assert (configs["main"]["hidden_size"], configs["main"]["num_hidden_layers"]) == (64, 2)
    assert (configs["sub"]["hidden_size"], configs["sub"]["num_hidden_layers"]) == (32, 1)
    assert (configs["single"]["hidden_size"], configs["single"]["num_hidden_layers"]) == (128, 4)  # the default
    shared = (tmp_path / "tokenizer" / "tokenizer.json").read_text()
    assert all((path / "tokenizer.json").read_text() == shared for path in paths.values())
    stamp = {role: (path / "model.safetensors").stat().st_mtime_ns for role, path in paths.items()}
    assert build_role_models(small_scenario, tmp_path, sizes, vocab_size=512) == paths  # reused, not rebuilt
    assert {role: (path / "model.safetensors").stat().st_mtime_ns for role, path in paths.items()} == stamp
    with pytest.raises(ValueError, match="other arguments"):
        build_role_models(small_scenario, tmp_path, sizes, vocab_size=600)
    with pytest.raises(ValueError, match="unknown role"):
        build_role_models(small_scenario, tmp_path, {"planner": {}})
