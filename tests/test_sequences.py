"""Token-in/token-out sequences: nesting, masks, and refusal of re-tokenised prompts."""

import pytest

from mgrpo_algo.core.sequences import TokenSequence, trajectory_sequence


def test_nested_turns_give_one_sequence_with_a_mask_on_sampled_tokens():
    turns = [
        {"prompt_ids": [1, 2, 3], "completion_ids": [10, 11], "logprobs": [-0.5, -0.25]},
        {"prompt_ids": [1, 2, 3, 10, 11, 4, 5], "completion_ids": [12], "logprobs": [-1.0]},
    ]
    ids, mask, logps = trajectory_sequence(turns)
    assert ids == [1, 2, 3, 10, 11, 4, 5, 12]
    assert mask == [0, 0, 0, 1, 1, 0, 0, 1]
    assert logps == [0, 0, 0, -0.5, -0.25, 0, 0, -1.0]
    sampled = [i for i, m in zip(ids, mask, strict=True) if m]
    assert sampled == [10, 11, 12]  # the trainer's ids are exactly the sampled ids


def test_a_retokenised_prompt_is_refused():
    turns = [
        {"prompt_ids": [1, 2], "completion_ids": [10, 11]},
        {"prompt_ids": [1, 2, 10, 99, 4], "completion_ids": [12]},
    ]
    with pytest.raises(ValueError, match="re-tokenised"):
        trajectory_sequence(turns)


@pytest.mark.parametrize("turns", [[], [{"completion_ids": [1]}], [{"prompt_ids": [1], "completion_ids": [2], "logprobs": [0.1, 0.2]}]])
def test_bad_turns(turns):
    with pytest.raises(ValueError):
        trajectory_sequence(turns)


def test_token_sequence_checks_lengths():
    with pytest.raises(ValueError):
        TokenSequence([1, 2, 3], [0, 1], advantage=0.5)
    seq = TokenSequence([1, 2, 3], [0, 1, 1], advantage=0.5)
    assert seq.num_tokens == 3 and seq.num_sampled == 2
