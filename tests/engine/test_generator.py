"""The decode loop: stopping rules, statistics, capacity errors."""

import pytest
import torch

from specpilot.engine.drafters.draft_model import DraftModelDrafter
from specpilot.engine.generator import Generator
from specpilot.engine.state import DecodeState, commit_tokens, extract_outputs
from specpilot.errors import ConfigError


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


def test_padded_prefill_changes_no_output(target, draft, make_prompts):
    """Prefill padded to buckets (as on the GPU with CUDA graphs) gives the same tokens, AR and
    speculative, and the same cache contents at every prompt slot."""
    from specpilot.models.kv_cache import KVCache
    from specpilot.engine.steps import padded_length, prefill

    prompts = make_prompts(6, seed=8, lo=1, hi=40)
    for bucket in (0, 8, 16):
        ar = Generator(target, prefill_bucket=bucket).generate(prompts, 24).outputs
        spec = Generator(target, {3: DraftModelDrafter(draft, 3, 2, 6)}, prefill_bucket=bucket).generate(prompts, 24)
        if bucket == 0:
            reference = ar
        assert ar == reference and spec.outputs == reference
    cfg = target.config
    plain = KVCache.allocate(cfg, 1, 64, target.device, target.dtype)
    padded = KVCache.allocate(cfg, 1, 64, target.device, target.dtype)
    prompt = prompts[0] + [5] * 13  # a body that is not a multiple of the bucket
    prefill(target, plain, [prompt])
    prefill(target, padded, [prompt], bucket=16)
    n = len(prompt) - 1
    for x, y in zip(plain.k + plain.v, padded.k + padded.v):
        torch.testing.assert_close(y[:, :, :n], x[:, :, :n], rtol=1e-5, atol=1e-6)
    assert padded_length(10, 0, 64, 16) == 16 and padded_length(10, 50, 64, 16) == 10  # never past the cache
    assert padded_length(10, 0, 64, 0) == 10


def test_warm_prefill_runs_every_padded_shape_of_a_workspace(target, draft, monkeypatch):
    """What a new GPU workspace runs once after capture: each bucket up to the cache's room, target and drafter."""
    from specpilot.engine import round as round_mod

    seen = []
    real = round_mod.prefill
    monkeypatch.setattr(round_mod, "prefill", lambda m, c, p, bucket=0: (seen.append((m is target, len(p[0]) - 1)),
                                                                        real(m, c, p, bucket=bucket)))
    drafter = DraftModelDrafter(draft, 3, 2, 6)
    g = Generator(target, {3: drafter}, prefill_bucket=16)
    assert drafter.settings.prefill_bucket == 16
    ws = g.rounds.workspace(1, 96, 8)
    g.rounds.prepare(ws)
    room = 96 - g.rounds.slack() - 1
    assert [T for is_target, T in seen if is_target] == list(range(16, room + 1, 16))
    assert drafter.cache is drafter.caches.entries[(1, 96)]
