"""What a role learner consumes and what a restarted one holds, checked by value, fast (tiny model).

- Stale decoupled mode (``placement.staleness`` n >= 0): the sub worker, driven directly, acts for
  sub-agents that really delegated (several per rollout, several turns, real sampled token ids), and
  the main statistics reach the store with a lag of up to n iterations. Whatever the lag, every
  update of the sub learner is exactly iteration t's sequences with iteration t's A_S (R_S from
  iteration t's correctness, aligned with t's generator), in iteration order, once each.
- Restart from a checkpoint: a role server restarted by its handle (or rolled back by a resumed run)
  has the checkpoint's parameters, optimizer state and step count, and then trains on as the
  uninterrupted server does, bitwise.

The slow end-to-end runs (tests/test_decoupled.py, tests/test_crash.py) check the same through whole runs.
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from test_roles import _Recorder  # stands in for FaultPoints

# Imported once here, not lazily in each test (transformers' model classes take seconds to import).
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config, Qwen2ForCausalLM  # noqa: F401

from mgrpo_algo.core.config import GenerationConfig, LearnerConfig, RoleConfig
from mgrpo_algo.core.scoring import (
    CalledFact,
    CalledScoring,
    MainSlot,
    RoleBatch,
    RolloutKey,
    anchor_state,
    score_sub_side,
)
from mgrpo_algo.core.seeding import iteration_rngs
from mgrpo_algo.core.sequences import slot_sequence
from mgrpo_algo.distributed.placement import spawn
from mgrpo_algo.learning.learner import RoleLearner
from mgrpo_algo.policies.hf_policy import TransformersPolicy  # noqa: F401
from mgrpo_algo.policies.models import build_tiny_model, train_tokenizer
from mgrpo_algo.training.roles import RoleWorker
from mgrpo_env.rewards import paid_sub_reward
from mgrpo_env.rollout import PolicyRequest
from mgrpo_env.turn_requests import TurnSender

SEED = 3
K = 2  # rollouts per query; 2 queries
# the sub-agents each rollout delegated to: with d = 3 slots, fewer are duplicated and more subsampled,
# both drawn from the iteration's alignment generator
SUBS = [("sub_0", "sub_1"), ("sub_0",), ("sub_0", "sub_1", "sub_2", "sub_3"), ("sub_0", "sub_1")]
TURNS = 2  # turns of every agent
ITERATIONS = 4
SCORING = CalledScoring(k=K, d=3, strategy="duplicate", step_weight=0.5, sub_weights=(0.1, 0.4, 0.5))
SPEC = RoleConfig(generation=GenerationConfig(max_new_tokens=4), learner=LearnerConfig(lr=1e-2))


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny-update-model")
    tok = train_tokenizer(["hello world <answer>x</answer> <result>y</result> " * 20] * 20, vocab_size=300)
    build_tiny_model(tok, out, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)
    return str(out)


def _worker(tiny_model, run_dir, role, **kw):
    kw.setdefault("spec", SPEC)
    return RoleWorker(role, tiny_model, str(run_dir), f"sqlite:{run_dir / 'stats.db'}", seed=SEED,
                      store_timeout_s=0.2, **kw)


def _act(worker, iteration, agents):
    """``agents``: [(episode, agent name)]; each acts TURNS turns. Returns {(episode, agent): (the
    extras of its turns, the states its requests carried)}, copied (what a restart reads from disk)."""
    worker.begin_collect(iteration)
    sender = TurnSender()  # the loop's side: only each chat's new messages cross
    chats = {a: [{"role": "system", "content": "you are an agent"}] for a in agents}
    seen = {a: ([], []) for a in agents}
    for turn in range(TURNS):
        requests = []
        for episode, agent in agents:
            # some of a query's agents read the same chat: shared anchor states (step credit), which
            # ones changes with the iteration
            observation = f"iteration {iteration} turn {turn}: " + ("hello", "world", "x")[episode * (iteration + 1) % 3]
            chats[(episode, agent)].append({"role": "user", "content": observation})
            requests.append(PolicyRequest(episode, agent, worker.role, observation, list(chats[(episode, agent)]), None))
        texts = worker.act(iteration, sender.compact(requests))  # text only: the token ids stay in the worker
        sender.answered(requests)
        for request, text in zip(requests, texts, strict=True):
            chats[(request.episode, request.agent)].append({"role": "assistant", "content": text})
            kept = worker.trajectories.history(iteration, request.episode, request.agent)[-1]
            assert kept["completion_ids"] and len(kept["prompt_ids"]) > len(seen[(request.episode, request.agent)][0])
            seen[(request.episode, request.agent)][0].append(copy.deepcopy(kept))
            seen[(request.episode, request.agent)][1].append(anchor_state(request.messages))
    worker.commit(iteration)
    return seen


# -- stale decoupled mode: which slots go with which sequences ----------------------------------------


def _facts(t):
    """Iteration t's sub facts (the same agents every iteration, different format flags and expert
    scores: a slot of another iteration would fit the sequences but carry other values)."""
    rng = np.random.default_rng([SEED, t, 7])
    return [[CalledFact(a, bool(rng.random() < 0.8), None if (i + j + t) % 3 == 0 else float(rng.random()),
                     "none" if (i + j + t) % 3 == 0 else "hops") for j, a in enumerate(row)]
            for i, row in enumerate(SUBS)]


def _correct(t):
    return [float(x) for x in np.random.default_rng([SEED, t, 8]).integers(0, 2, size=len(SUBS))]


def _main_slots(t):
    return [MainSlot(RolloutKey(i, i // K, i % K), "main_0", c, 0.0, c, True) for i, c in enumerate(_correct(t))]


def _expected(t, seen):
    """Iteration t's sub training samples, computed here from t's facts, t's correctness and t's trajectories."""
    facts = _facts(t)
    rewards = [[paid_sub_reward(f.format_ok, _correct(t)[i], f.expert, SCORING.sub_weights) for f in row]
               for i, row in enumerate(facts)]
    states = {(i, j): seen[(i, f.agent)][1] for i, row in enumerate(facts) for j, f in enumerate(row)}
    slots, _ = score_sub_side(facts, rewards, K, SCORING.d, strategy=SCORING.strategy, rng=iteration_rngs(SEED, t)[1],
                              step_weight=SCORING.step_weight, states=states)
    sequences = [slot_sequence(seen[(s.key.index, s.agent)][0], s.advantage, "sub", turn_advantages=s.turn_advantages)
                 for s in slots]
    return [(s.key.index, s.agent, s.advantage) for s in slots], sequences


def _kept_advantages(run_dir, role="sub"):
    """The A_S the sub side's worker kept, by iteration: [(record index, agent, A_S)] per aligned slot."""
    folder = run_dir / "workers" / role / "advantages"
    return {int(p.stem): [(s["index"], s["agent"], s["advantage"]) for s in json.loads(p.read_text())]
            for p in sorted(folder.glob("*.json"))} if folder.exists() else {}


def _sample(sequence):
    return (sequence.input_ids, sequence.loss_mask, sequence.advantage, sequence.token_advantages,
            sequence.sampled_logprobs)


# staleness, which main iterations are published before the sub worker's call of iteration t, and
# which iterations each call applies (then the rest is published and the end of the run flushes it)
SCHEDULES = {
    "synchronized": (0, [[0], [1], [2], [3]], [[0], [1], [2], [3]], []),
    "stale-1": (1, [[], [0], [1], [2]], [[], [0], [1], [2]], [3]),
    "stale-2": (2, [[], [], [0], [1]], [[], [], [0], [1]], [2, 3]),
    "stale-2-bursts": (2, [[], [], [0], [1, 2]], [[], [], [0], [1, 2]], [3]),  # one call applies two, lags 2 and 1
}


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_sub_learner_applies_iteration_ts_slots_to_iteration_ts_sequences(tiny_model, tmp_path, schedule):
    staleness, published, applies, flushed = SCHEDULES[schedule]
    main = _worker(tiny_model, tmp_path, "main", train=False)
    sub = _worker(tiny_model, tmp_path, "sub")
    consumed = []  # every batch the sub learner updated on, in order
    update = sub.learner.update
    sub.learner.update = lambda sequences: consumed.append([_sample(s) for s in sequences]) or update(sequences)
    agents = [(i, a) for i, row in enumerate(SUBS) for a in row]
    expected = {}
    for t in range(ITERATIONS):
        expected[t] = _expected(t, _act(sub, t, agents))
        for it in published[t]:
            main.update(it, RoleBatch(slots=_main_slots(it)))
        out = sub.update(t, RoleBatch(facts=_facts(t), scoring=SCORING, staleness=staleness))
        assert _kept_advantages(tmp_path) == {it: expected[it][0] for step in applies[:t + 1] for it in step}, t
        if applies[t]:
            assert (out["sub/applied_iteration"], out["sub/lag"]) == (applies[t][-1], t - applies[t][-1])
    for it in flushed:
        main.update(it, RoleBatch(slots=_main_slots(it)))
    out = sub.flush(ITERATIONS - 1)
    assert out.get("sub/applied_iteration") == (flushed[-1] if flushed else None)
    assert _kept_advantages(tmp_path) == {it: expected[it][0] for it in range(ITERATIONS)}  # A_S of iteration it, kept
    assert sub.status()["pending"] == [] and sub.status()["last_applied"] == ITERATIONS - 1
    # each iteration applied once, in order, with its own slots on its own sequences
    assert all(len(set(advantage for _, _, advantage in expected[t][0])) > 1 for t in expected)  # A_S carry signal
    assert all(any(len(set(s.token_advantages) - {0.0}) > 1 for s in expected[t][1]) for t in expected)  # step credit too
    assert len(consumed) == ITERATIONS
    for t, batch in enumerate(consumed):
        assert batch == [_sample(s) for s in expected[t][1]], f"update {t} is not iteration {t}'s slots on its sequences"
    # ... and the weights are those of a learner given exactly these batches (nothing else stepped it)
    reference = RoleLearner("sub", tiny_model, sub.learner.config)
    for t in range(ITERATIONS):
        reference.update(expected[t][1])
    assert sub.learner.step == reference.step == ITERATIONS
    state = sub.learner.model.state_dict()
    for name, tensor in reference.model.state_dict().items():
        assert torch.equal(state[name], tensor), name
    main.close()
    sub.close()


# -- restart from a checkpoint -----------------------------------------------------------------------


def _train_main(worker, t):
    """One main iteration with real trajectories and non-zero advantages: the learner steps."""
    _act(worker, t, [(i, "main_0") for i in range(len(SUBS))])
    correct = _correct(t)
    advantages = [c - float(np.mean(correct)) + 0.25 * (i % 2) for i, c in enumerate(correct)]
    metrics = worker.update(t, RoleBatch(slots=[MainSlot(RolloutKey(i, i // K, i % K), "main_0", c, a, c, True)
                                     for i, (c, a) in enumerate(zip(correct, advantages, strict=True))]))
    assert metrics["main/skipped"] == 0.0
    return metrics


def _learner_state(learner):
    """Parameters, optimizer state and step, copied."""
    return ({k: v.detach().clone() for k, v in learner.model.state_dict().items()},
            copy.deepcopy(learner.optimizer.state_dict()), learner.step)


def _assert_same_state(learner, saved):
    params, optimizer, step = saved
    assert learner.step == step
    state = learner.model.state_dict()
    # every parameter (a tied lm_head is the embedding: the checkpoint file stores it once)
    assert set(dict(learner.model.named_parameters())) <= params.keys() <= state.keys()
    for name, tensor in params.items():
        assert torch.equal(state[name], tensor), f"parameter {name} differs"
    now = learner.optimizer.state_dict()
    assert now["param_groups"] == optimizer["param_groups"]
    assert now["state"].keys() == optimizer["state"].keys() and len(optimizer["state"]) > 0
    for index, entry in optimizer["state"].items():
        assert entry.keys() == now["state"][index].keys()
        for key, value in entry.items():  # AdamW's step, exp_avg, exp_avg_sq
            assert torch.equal(torch.as_tensor(now["state"][index][key]), torch.as_tensor(value)), f"optimizer {index}/{key} differs"


def _checkpoint_state(folder):
    """What a checkpoint holds, read from its files (not through a learner)."""
    from safetensors.torch import load_file

    params = load_file(str(folder / "model" / "model.safetensors"))
    optimizer = torch.load(folder / "learner_state.pt", map_location="cpu", weights_only=True)["optimizer"]
    return params, optimizer, json.loads((folder / "learner.json").read_text())["step"]


@pytest.mark.parametrize("how", ["restart", "rollback"])
def test_restarted_learner_is_the_checkpoints_and_trains_on_identically(tiny_model, tmp_path, how):
    """``restart``: the role server's handle replaces it by a fresh instance (what the loop does when a
    worker died), which restores its newest checkpoint. ``rollback``: a resumed run whose worker had
    gone one iteration past the loop's commit goes back to the committed checkpoint, in place."""
    kwargs = {"role": "main", "model": tiny_model, "run_dir": str(tmp_path / "run"), "store": f"sqlite:{tmp_path / 'run.db'}",
              "spec": SPEC, "seed": SEED, "store_timeout_s": 0.2}
    handle = spawn(RoleWorker, kwargs, placement="local", name="mgrpo-main")
    for t in range(2):  # two steps: AdamW's moments and step count are not those of a fresh optimizer
        _train_main(handle._obj, t)
    at_commit = _learner_state(handle._obj.learner)
    checkpoint = tmp_path / "run" / "workers" / "main" / "checkpoints" / "iter-1"
    _assert_same_state(handle._obj.learner, _checkpoint_state(checkpoint))  # the checkpoint is the live state
    assert at_commit[2] == 2
    if how == "rollback":
        _train_main(handle._obj, 2)  # applied, never committed by the loop
        assert handle._obj.learner.step == 3
        handle.kill()  # everything died; the run is resumed: a new worker, rolled back to the loop's commit
        handle.restart()
        assert handle.call("rollback", 1) == 1
    else:
        handle.kill()  # the worker died after committing iteration 1; the loop restarts it
        handle.restart()
    worker = handle._obj
    assert worker.restored and worker.status()["last_applied"] == 1
    _assert_same_state(worker.learner, at_commit)
    assert worker.policy.model is worker.learner.model  # the restarted policy samples from the restored weights
    # the next iteration from there equals the uninterrupted run's, bitwise (the optimizer state matters)
    _train_main(worker, 2)
    clean = _worker(tiny_model, tmp_path / "clean", "main", spec=SPEC)
    for t in range(3):
        _train_main(clean, t)
    _assert_same_state(worker.learner, _learner_state(clean.learner))
    clean.close()
    handle.close()


def test_a_shared_worker_scores_the_sub_side_and_updates_once_over_both_roles(tiny_model, tmp_path):
    """``update_shared`` (the shared-model baseline): the main statistics go through the store, the sub
    side is scored with the iteration's own weights, gate and alignment draws (kept in its
    ``advantages/<t>.json``), one learner update takes the main and the sub sequences, the health record
    carries the learner's figures only, a replay applies nothing, and without a store it refuses."""
    worker = _worker(tiny_model, tmp_path, "main")
    worker.faults = _Recorder()
    agents = [(i, "main_0") for i in range(len(SUBS))] + [(i, a) for i, row in enumerate(SUBS) for a in row]
    seen = _act(worker, 0, agents)
    batches = []
    update = worker.learner.update
    worker.learner.update = lambda sequences: batches.append(len(sequences)) or update(sequences)
    scoring = replace(SCORING, sub_weights=(0.2, 0.3, 0.5), sub_format_gate=True)  # not the paper's: they must reach R_S
    facts, correct, slots = _facts(0), _correct(0), _main_slots(0)
    metrics = worker.update(0, RoleBatch(slots=slots, facts=facts, scoring=scoring))
    rewards = [[paid_sub_reward(f.format_ok, correct[i], f.expert, scoring.sub_weights, format_gate=True) for f in row]
               for i, row in enumerate(facts)]
    states = {(i, j): seen[(i, f.agent)][1] for i, row in enumerate(facts) for j, f in enumerate(row)}
    expected, _ = score_sub_side(facts, rewards, K, scoring.d, strategy=scoring.strategy, rng=iteration_rngs(SEED, 0)[1],
                                 step_weight=scoring.step_weight, states=states)
    assert _kept_advantages(tmp_path, "main") == {0: [(s.key.index, s.agent, s.advantage) for s in expected]}
    assert metrics["sub/reward_mean"] == pytest.approx(np.mean([s.reward for s in expected]))
    assert batches == [len(slots) + len(expected)]  # one update over both roles' sequences
    where = {"role": "main", "iteration": 0}
    assert [h for h in worker.faults.hits if h[0] != "act"] == [("after_update", where), ("after_checkpoint", where)]
    health = worker.store.get_health("main")["metrics"]
    assert "main/samples" in health and not any(k.startswith(("sub/", "align/")) for k in health)
    assert worker.store.done_iterations("main") == {0}
    assert worker.update(0, RoleBatch(slots=slots, facts=facts, scoring=scoring))["main/replayed"] == 1.0 and batches == [len(slots) + len(expected)]
    worker.close()
    alone = RoleWorker("main", tiny_model, str(tmp_path / "alone"), "", spec=SPEC, seed=SEED, train=False)
    with pytest.raises(RuntimeError, match="^a shared-model worker reads the main statistics through the store: none is open$"):
        alone.update(0, RoleBatch(slots=slots, facts=facts, scoring=scoring))
