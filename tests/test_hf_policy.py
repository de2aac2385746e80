"""TransformersPolicy: batched left-padded sampling, exact ids and logprobs, nesting prompts, stop tags."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from mgrpo_algo.core.sequences import trajectory_sequence
from mgrpo_algo.policies.chat_tokens import ChatPrompter, StopSpec, cut_at_stop, stop_spec
from mgrpo_algo.policies.hf_policy import TransformersPolicy
from mgrpo_algo.policies.models import build_tiny_model
from mgrpo_env.rollout import PolicyRequest, collect

SYSTEM = {"role": "system", "content": "You are a research agent."}
ANSWER = "<think>look it up</think><answer>Blue</answer>"


def _request(content: str, episode: int = 0, messages=None, history=None) -> PolicyRequest:
    messages = messages or [SYSTEM, {"role": "user", "content": content}]
    return PolicyRequest(episode, "main_0", "main", content, messages, None, history or [])


@pytest.fixture(scope="module")
def model_dir(tokenizer, tmp_path_factory):
    path = tmp_path_factory.mktemp("model")
    build_tiny_model(tokenizer, path, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, seed=0)
    return path


@pytest.fixture(scope="module")
def model(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def answering_model(model, tokenizer):
    """The tiny model fitted to answer ANSWER and then ramble on: generation must stop at </answer>."""
    fitted = copy.deepcopy(model)
    prompter = ChatPrompter(tokenizer)
    prompt = prompter.first_prompt([SYSTEM, {"role": "user", "content": "What colour is the sky?"}])
    completion = prompter.encode(ANSWER + " and then many more words that must never be sampled")
    ids = torch.tensor([prompt + completion])
    labels = ids.clone()
    labels[:, : len(prompt)] = -100
    optimizer = torch.optim.Adam(fitted.parameters(), lr=1e-2)
    fitted.train()
    for _ in range(80):
        loss = fitted(ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() < 0.01:
            break
    fitted.eval()
    return fitted


def _forward_logprobs(model, ids: list[int], positions: list[int], temperature: float = 1.0) -> torch.Tensor:
    """log p(ids[t] | ids[:t]) for t in positions, from one unpadded forward pass (what a learner computes)."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return torch.stack([logp[t - 1, ids[t]] for t in positions])


def test_batched_generation_gives_exact_ids_text_and_logprobs(model, tokenizer):
    policy = TransformersPolicy(model, tokenizer, role="main", max_new_tokens=12, temperature=0.8, seed=1)
    requests = [_request("Who? " * n, episode=i) for i, n in enumerate((1, 7, 23, 3))]  # different lengths
    responses = policy(requests)
    assert len(responses) == 4
    prompter = ChatPrompter(tokenizer)
    for request, response in zip(requests, responses, strict=True):
        extra = response.extra
        assert extra["prompt_ids"] == prompter.first_prompt(request.messages)  # the chat template, no padding
        assert tokenizer.pad_token_id not in extra["prompt_ids"]
        assert 0 < len(extra["completion_ids"]) <= 12
        assert len(extra["logprobs"]) == len(extra["completion_ids"])
        assert tokenizer.decode(extra["completion_ids"], skip_special_tokens=False) == response.text
        assert all(math.isfinite(x) and x <= 0 for x in extra["logprobs"])
        assert extra["policy"].startswith("hf:") and extra["finish_reason"] in ("stop", "length")
        # left padding changed nothing: the logprobs are those of the unpadded sequence at T=0.8
        ids = extra["prompt_ids"] + extra["completion_ids"]
        positions = list(range(len(extra["prompt_ids"]), len(ids)))
        assert torch.allclose(_forward_logprobs(model, ids, positions, 0.8), torch.tensor(extra["logprobs"]), atol=1e-4)


def test_top_p_logprobs_are_those_of_the_renormalised_nucleus(model, tokenizer):
    policy = TransformersPolicy(model, tokenizer, role="main", max_new_tokens=6, temperature=0.7, top_p=0.5, seed=2)
    extra = policy([_request("Where?")])[0].extra
    with torch.no_grad():
        logits = model(torch.tensor([extra["prompt_ids"] + extra["completion_ids"]])).logits[0].float() / 0.7
    start = len(extra["prompt_ids"]) - 1
    for t, (token, logprob) in enumerate(zip(extra["completion_ids"], extra["logprobs"], strict=True)):
        probs = torch.softmax(logits[start + t], dim=-1)
        order = torch.argsort(probs, descending=True)
        keep = int((torch.cumsum(probs[order], 0) < 0.5).sum()) + 1  # smallest prefix reaching 0.5
        nucleus = order[:keep]
        assert token in nucleus.tolist()  # never sampled outside the nucleus
        assert logprob == pytest.approx(math.log(probs[token] / probs[nucleus].sum()), abs=1e-4)
    raw = TransformersPolicy(model, tokenizer, role="main", max_new_tokens=6, temperature=0.7, top_p=0.5, seed=2,
                             logprobs_mode="raw")([_request("Where?")])[0].extra
    assert raw["completion_ids"] == extra["completion_ids"]  # same seed, same samples
    ids = raw["prompt_ids"] + raw["completion_ids"]
    positions = list(range(len(raw["prompt_ids"]), len(ids)))
    assert torch.allclose(_forward_logprobs(model, ids, positions, 1.0), torch.tensor(raw["logprobs"]), atol=1e-4)


def test_generation_stops_at_the_closing_tag(answering_model, tokenizer):
    policy = TransformersPolicy(answering_model, tokenizer, role="main", max_new_tokens=40, temperature=0)
    response = policy([_request("What colour is the sky?")])[0]
    assert response.text == ANSWER
    assert response.extra["completion_ids"][-1] == tokenizer.convert_tokens_to_ids("</answer>")
    assert response.extra["finish_reason"] == "stop"
    # the same model without the stop tag rambles on: the stop is what cut it
    rambling = cut_at_stop(tokenizer.encode(ANSWER + " and then", add_special_tokens=False), StopSpec((), ()))
    assert rambling[1] == "length"


def test_stop_strings_stop_generation_when_a_tag_is_several_tokens(answering_model, tokenizer):
    """The hub-tokenizer path: a tag that is not one token stops through HF stop_strings."""
    policy = TransformersPolicy(answering_model, tokenizer, role="main", max_new_tokens=40, temperature=0)
    ends = tuple(i for i in policy.stop.token_ids if i != tokenizer.convert_tokens_to_ids("</answer>"))
    policy.stop = StopSpec(ends, ("Blue</answer>",))
    response = policy([_request("What colour is the sky?")])[0]
    assert response.text == ANSWER and response.extra["finish_reason"] == "stop"


def test_cut_at_stop_handles_ids_and_multi_token_strings(tokenizer):
    spec = stop_spec(tokenizer)
    assert tokenizer.convert_tokens_to_ids("</tool_call>") in spec.token_ids and not spec.strings
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in spec.token_ids
    ids = tokenizer.encode("<result>x</result> more", add_special_tokens=False)
    kept, finish = cut_at_stop(ids, spec)
    assert tokenizer.decode(kept) == "<result>x</result>" and finish == "stop"
    as_string = StopSpec((), ("x</res",))  # a stop string that several tokens complete
    kept, finish = cut_at_stop(ids, as_string, tokenizer)
    assert finish == "stop" and tokenizer.decode(kept).startswith("<result>x</res")
    assert "x</res" not in tokenizer.decode(kept[:-1])


@pytest.mark.parametrize("end", ["", "<|im_end|>"])
def test_second_turn_prompt_nests_and_matches_the_rerendered_template(tokenizer, end):
    prompter = ChatPrompter(tokenizer)
    first = [SYSTEM, {"role": "user", "content": "Who founded Velmora Press?"}]
    prompt_1 = prompter.first_prompt(first)
    action = '<think>search</think><tool_call>{"name": "search", "arguments": {"queries": ["Velmora"]}}</tool_call>'
    completion_1 = tokenizer.encode(action + end, add_special_tokens=False)
    observation = "<tool_response>\n[1] Velmora Press\nURL: http://wiki-hops.test/wiki/Velmora_Press\n</tool_response>"
    messages = [*first, {"role": "assistant", "content": action}, {"role": "user", "content": observation}]
    history = [{"prompt_ids": prompt_1, "completion_ids": completion_1}]
    prompt_2, info = prompter.prompt(_request(observation, messages=messages, history=history))
    assert not info
    assert prompt_2[: len(prompt_1) + len(completion_1)] == prompt_1 + completion_1
    assert prompt_2 == prompter.first_prompt(messages)  # exactly the re-rendered chat template's ids
    turns = [{**history[0], "logprobs": [0.0] * len(completion_1)}, {"prompt_ids": prompt_2, "completion_ids": [5]}]
    trajectory_sequence(turns)  # nests


def test_history_without_ids_falls_back_and_says_so(tokenizer):
    prompter = ChatPrompter(tokenizer)
    messages = [SYSTEM, {"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"},
                {"role": "user", "content": "O"}]
    ids, info = prompter.prompt(_request("O", messages=messages, history=[{}]))
    assert info == {"retokenized": True} and ids == prompter.first_prompt(messages)


def test_too_long_prompts_are_not_generated_for(model, tokenizer):
    policy = TransformersPolicy(model, tokenizer, role="main", max_new_tokens=4, max_prompt_tokens=40)
    short, long = policy([_request("Hi"), _request("word " * 200)])
    assert long.text == "" and long.extra["completion_ids"] == [] and long.extra["finish_reason"] == "prompt_too_long"
    assert len(long.extra["prompt_ids"]) > 40
    assert short.extra["completion_ids"]


def test_shared_model_keeps_its_mode_no_grad_and_rng(model, tokenizer):
    model.train()
    try:
        policy = TransformersPolicy(model, tokenizer, role="sub", max_new_tokens=5, seed=7)
        torch.manual_seed(123)
        expected = torch.rand(3)
        torch.manual_seed(123)
        first = policy([_request("A"), _request("B b")])
        assert torch.rand(3).equal(expected)  # the global RNG (the learner's) is untouched
        assert model.training  # restored
        assert all(p.grad is None for p in model.parameters())
        again = TransformersPolicy(model, tokenizer, role="sub", max_new_tokens=5, seed=7)([_request("A"), _request("B b")])
        assert [r.extra["completion_ids"] for r in first] == [r.extra["completion_ids"] for r in again]  # reproducible
    finally:
        model.eval()


def test_loads_by_path_and_chunks_batches(model_dir, model):
    policy = TransformersPolicy(model_dir, role="main", max_new_tokens=4, temperature=0, max_batch_size=2)
    whole = TransformersPolicy(model, policy.tokenizer, role="main", max_new_tokens=4, temperature=0)
    requests = [_request("x " * n, episode=n) for n in (9, 1, 5, 3, 7)]
    assert [r.extra["completion_ids"] for r in policy(requests)] == [r.extra["completion_ids"] for r in whole(requests)]
    assert policy.name == f"hf:{model_dir}"


def test_two_turn_episodes_through_the_env_give_trainable_sequences(model, tokenizer, small_scenario, small_world):
    """collect() with the real env: main's prompts nest, and the trainer's ids and logprobs are the sampled ones."""
    main = TransformersPolicy(model, tokenizer, role="main", max_new_tokens=10, seed=3)
    sub = TransformersPolicy(model, tokenizer, role="sub", max_new_tokens=10, seed=4)
    tasks = list(small_scenario.tasks("stage2/test"))[:2]
    records = collect(small_scenario, tasks, 2, {"main": main, "sub": sub}, world=small_world,
                      env_kwargs={"max_main_turns": 2})
    assert len(records) == 4
    for record in records:
        turns = record.main.turns
        assert len(turns) == 2  # the random tiny model never answers: two malformed turns, then the limit
        extras = [t.extra for t in turns]
        assert all(t.action == tokenizer.decode(e["completion_ids"]) for t, e in zip(turns, extras, strict=True))
        prompt_2, completion_1 = extras[1]["prompt_ids"], extras[0]["completion_ids"]
        assert prompt_2[: len(extras[0]["prompt_ids"]) + len(completion_1)] == extras[0]["prompt_ids"] + completion_1
        ids, mask, sampled = trajectory_sequence(extras)
        assert [i for i, m in zip(ids, mask, strict=True) if m] == completion_1 + extras[1]["completion_ids"]
        positions = [t for t, m in enumerate(mask) if m]
        learner = _forward_logprobs(model, ids, positions)
        assert torch.allclose(learner, torch.tensor([sampled[t] for t in positions]), atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_generation_matches_a_cuda_forward_pass(model_dir):
    policy = TransformersPolicy(model_dir, role="main", max_new_tokens=16, temperature=0.9, device="cuda", seed=5)
    torch.cuda.manual_seed(1)
    state = torch.cuda.get_rng_state()
    responses = policy([_request("Who? " * n, episode=n) for n in (1, 9, 4)])
    assert torch.cuda.get_rng_state().equal(state)  # the CUDA RNG is forked too
    for response in responses:
        extra = response.extra
        ids = extra["prompt_ids"] + extra["completion_ids"]
        with torch.no_grad():
            logits = policy.model(torch.tensor([ids], device="cuda")).logits[0].float().cpu()
        logp = torch.log_softmax(logits / 0.9, dim=-1)
        start = len(extra["prompt_ids"])
        expected = torch.stack([logp[t - 1, ids[t]] for t in range(start, len(ids))])
        assert torch.allclose(expected, torch.tensor(extra["logprobs"]), atol=1e-3)
