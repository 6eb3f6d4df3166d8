"""The decode loop: stopping rules, statistics, capacity errors."""

import pytest
import torch

from specpilot.engine.drafters.draft_model import DraftModelDrafter
from specpilot.engine.generator import Generator
from specpilot.engine.state import DecodeState, commit_tokens, extract_outputs
from specpilot.errors import ConfigError
from specpilot.models.loading import load_model


@pytest.fixture(scope="module")
def target(target_dir):
    return load_model(target_dir)


@pytest.fixture(scope="module")
def draft(drafter_dir):
    return load_model(drafter_dir)


def test_commit_tokens_respects_counts_eos_and_limit():
    st = DecodeState.allocate(batch=3, capacity=32, max_rounds=8, device="cpu")
    st.reset([[1, 2], [3], [4, 5, 6]], eos_ids=(99,), max_new=4)
    new = torch.tensor([[10, 11, 12], [13, 99, 14], [15, 16, 17]])
    commit_tokens(st, new, torch.tensor([2, 3, 1]))
    assert st.seq_lens.tolist() == [4, 4, 4]
    assert st.done.tolist() == [False, True, False]  # row 1 emitted EOS
    commit_tokens(st, new, torch.tensor([3, 3, 3]))
    assert st.seq_lens.tolist() == [7, 4, 7]  # done rows are frozen
    assert st.done.tolist() == [True, True, True]  # rows 0 and 2 reached 4 new tokens
    assert st.rounds.tolist() == [2, 1, 2]
    assert st.accept_log[:, :2].tolist() == [[2, 3], [3, 0], [1, 3]]
    outs = extract_outputs(st, (99,), max_new=4)
    assert outs == [[10, 11, 10, 11], [13, 99], [15, 15, 16, 17]]


def test_generation_stops_at_eos_identically(target, draft, make_prompts):
    prompts = make_prompts(6, seed=3)
    free = Generator(target).generate(prompts, 40).outputs
    eos = free[0][10]  # a token AR emits: make it the EOS
    ar = Generator(target, eos_ids=(eos,)).generate(prompts, 40)
    spec = Generator(target, {4: DraftModelDrafter(draft, 4, 2, 8)}, eos_ids=(eos,)).generate(prompts, 40)
    assert ar.outputs == spec.outputs
    assert ar.outputs[0] == free[0][: free[0].index(eos) + 1]
    for out in ar.outputs:
        assert eos not in out[:-1]


def test_result_statistics(target, draft, make_prompts):
    prompts = make_prompts(3, seed=4)
    r = Generator(target, {3: DraftModelDrafter(draft, 3, 1, 3)}).generate(prompts, 30)
    assert [len(o) for o in r.outputs] == [30, 30, 30]
    for row, rounds in zip(r.accept_lengths, r.rounds):
        assert len(row) == rounds and all(1 <= a <= 4 for a in row)
        assert sum(row) >= 30
    assert r.mean_accepted_length == pytest.approx(90 / sum(r.rounds))
    assert r.seconds > 0 and r.tokens_per_second > 0


def test_prompt_longer_than_context_is_a_clear_error(target):
    with pytest.raises(ConfigError, match="exceeds the model's context"):
        Generator(target).generate([[1] * 2040], 64)


def test_empty_prompt_and_zero_tokens_are_errors(target):
    with pytest.raises(ConfigError):
        Generator(target).generate([[]], 4)
    with pytest.raises(ConfigError):
        Generator(target).generate([[1]], 0)
