"""REINFORCE from scratch on the single-agent env, CleanRL style: one file, top to bottom.

How someone else's algorithm plugs in: only ``gymnasium.make("mgrpo/WikiHops-v0")`` (the env's public
API), plain torch, and a tiny Qwen2 built from ``transformers.Qwen2Config``. Nothing from
``mgrpo_algo``.

Tokenizer: bytes. Token ``i < 256`` is the byte ``i``, token 256 ends a turn. The simplest honest
choice: nothing to train or download, and every text round-trips exactly, so the ids the loss is
computed on are exactly the ids that were sampled. The price is long sequences (one token per byte),
so the prompt is the last ``context_bytes`` of the chat.

Loss per iteration (B episodes): ``-(R - b) * sum(log pi(action tokens))`` summed over each episode's
turns, averaged over episodes, minus ``ent_coef`` times the mean entropy; ``b`` is a moving average of
returns. An untrained byte model almost never writes a well-formed action, so R is usually 0 and the
policy-gradient term 0 too: the entropy bonus and the baseline still change the weights, which is
what this example checks and prints. It is a wiring demonstration, not a result.

Run: ``python examples/reinforce_from_scratch.py`` (about 15 seconds on 2 cores).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import gymnasium
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

import mgrpo_env  # noqa: F401 - registers "mgrpo/WikiHops-v0"


@dataclass
class Args:
    seed: int = 0
    """seeds torch and the env's task choice"""
    iterations: int = 4
    """policy updates"""
    episodes_per_iteration: int = 4
    """B: episodes collected before each update"""
    max_turns: int = 2
    """actions per episode (the env truncates after this many)"""
    max_new_tokens: int = 48
    """bytes the policy writes per turn at most"""
    context_bytes: int = 384
    """the prompt is the last this-many bytes of the chat"""
    lr: float = 3e-4
    ent_coef: float = 0.01
    baseline_decay: float = 0.9
    hidden_size: int = 64
    num_layers: int = 2


EOS = 256  # end of a turn; ids 0..255 are bytes


def encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def decode(ids: list[int]) -> str:
    return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def chat_prompt(messages: list[dict[str, str]], context_bytes: int) -> list[int]:
    """The chat as ``<role>: text`` lines, ending with the assistant's turn to speak; its last bytes."""
    text = "".join(f"<{m['role']}>: {m['content']}\n" for m in messages) + "<assistant>: "
    return encode(text)[-context_bytes:]


args = Args()
torch.manual_seed(args.seed)
torch.set_num_threads(1)
config = Qwen2Config(vocab_size=EOS + 1, hidden_size=args.hidden_size, intermediate_size=4 * args.hidden_size,
                     num_hidden_layers=args.num_layers, num_attention_heads=4, num_key_value_heads=2,
                     max_position_embeddings=args.context_bytes + args.max_new_tokens, tie_word_embeddings=True,
                     bos_token_id=EOS, eos_token_id=EOS, pad_token_id=EOS)
policy = Qwen2ForCausalLM(config)
optimizer = torch.optim.AdamW(policy.parameters(), lr=args.lr)
start_params = [p.detach().clone() for p in policy.parameters()]
print(f"policy: Qwen2, {sum(p.numel() for p in policy.parameters()):,} parameters, byte vocabulary")

env = gymnasium.make("mgrpo/WikiHops-v0", split="stage1/train", max_turns=args.max_turns,
                     scenario_kwargs={"num_entities": 300})
baseline = 0.0
for iteration in range(args.iterations):
    t0 = time.perf_counter()
    # ---- rollout: B episodes, each a list of (prompt ids, action ids) and one return
    episodes: list[tuple[list[tuple[list[int], list[int]]], float]] = []
    policy.eval()
    for b in range(args.episodes_per_iteration):
        obs, info = env.reset(seed=args.seed + 1000 * iteration + b)
        turns, done, ret = [], False, 0.0
        while not done:
            prompt = chat_prompt(info["messages"], args.context_bytes)
            with torch.no_grad():
                out = policy.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                      do_sample=True, top_k=0, top_p=1.0, temperature=1.0,
                                      max_new_tokens=args.max_new_tokens, eos_token_id=EOS, pad_token_id=EOS)
            action = out[0, len(prompt):].tolist()
            obs, reward, terminated, truncated, info = env.step(decode(action))
            turns.append((prompt, action))
            ret += float(reward)
            done = terminated or truncated
        episodes.append((turns, ret))
    returns = torch.tensor([r for _, r in episodes])

    # ---- update: REINFORCE with a moving-average baseline and an entropy bonus
    policy.train()
    pg_loss, entropy, n_turns = torch.zeros(()), torch.zeros(()), 0
    for turns, ret in episodes:
        advantage = ret - baseline
        for prompt, action in turns:
            ids = torch.tensor([prompt + action])
            logits = policy(ids).logits[0, len(prompt) - 1 : -1]  # the positions that predicted the action
            logp = torch.log_softmax(logits.float(), dim=-1)
            taken = logp.gather(1, torch.tensor(action).unsqueeze(1)).squeeze(1)
            pg_loss = pg_loss - advantage * taken.sum() / len(episodes)
            entropy = entropy - (logp.exp() * logp).sum(-1).mean()
            n_turns += 1
    entropy = entropy / n_turns
    loss = pg_loss - args.ent_coef * entropy
    optimizer.zero_grad()
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
    optimizer.step()
    baseline = args.baseline_decay * baseline + (1 - args.baseline_decay) * returns.mean().item()

    change = sum((p.detach() - p0).norm() ** 2 for p, p0 in zip(policy.parameters(), start_params, strict=True)) ** 0.5
    print(f"iter {iteration}: return mean {returns.mean():.3f} | loss {loss.item():.4f} (pg {pg_loss.item():.4f}, "
          f"entropy {entropy.item():.3f}) | grad norm {grad_norm:.3f} | |theta - theta0| {change:.5f} | "
          f"{n_turns} turns, {time.perf_counter() - t0:.1f}s")
env.close()
print(f"last action sampled: {decode(episodes[-1][0][-1][1])[:80]!r}")
assert change > 0, "the parameters did not change"
