"""Continuous batching is lossless: every request's tokens equal its single-request AR decode.

CPU float32 on the random test checkpoints: more requests than slots (admissions mid-decode),
mixed prompt lengths and per-request token limits, prompts prefilled over several syncs, EOS, for
AR and the draft-model (chain and tree), n-gram and DFlash drafters. The per-request round counts
are compared with single-request speculative decodes too: a drafter whose row state was not reset
on admission still gives AR's tokens (verification repairs it) but accepts differently.
"""

import pytest
import torch

from specpilot.engine.drafters.dflash import DFlashDrafter
from specpilot.engine.drafters.draft_model import DraftModelDrafter
from specpilot.engine.drafters.ngram import NgramDrafter
from specpilot.engine.generator import Generator
from specpilot.engine.serving import Request, ServingEngine
from specpilot.errors import ConfigError
from specpilot.models.loading import load_model


@pytest.fixture(scope="module")
def requests():
    """9 requests: prompt lengths 1..45, token limits 3..24; every third repeats a motif (n-gram)."""
    g = torch.Generator().manual_seed(11)
    out = []
    for i in range(9):
        L = 1 if i == 4 else int(torch.randint(2, 46, (1,), generator=g))
        p = torch.randint(1, 4096, (L,), generator=g).tolist()
        if i % 3 == 0:
            p = p + p[: L // 2]
        out.append(Request(tuple(p), max_new=int(torch.randint(3, 25, (1,), generator=g))))
    return out


def single(generator, requests, stop_at_eos=True):
    return [generator.generate([list(r.prompt)], r.max_new, stop_at_eos=stop_at_eos) for r in requests]


@pytest.fixture(scope="module")
def ar_outputs(target, requests):
    return [r.outputs[0] for r in single(Generator(target), requests)]


def served(generator, requests, slots=3, prefill_chunk=16, **kw):
    result = ServingEngine(generator, slots, prefill_chunk=prefill_chunk).run(requests, **kw)
    assert len(result.requests) == len(requests)
    return result


def test_ar_serving_equals_single_requests(target, requests, ar_outputs):
    result = served(Generator(target), requests)
    assert [r.output for r in result.requests] == ar_outputs
    assert [r.rounds for r in result.requests] == [len(o) for o in ar_outputs]  # AR: a round per token
    for r in result.requests:  # closed loop: a request is sent when a slot is free
        assert 0 <= r.arrival == r.admitted < r.first_token <= r.finished <= result.seconds
    assert result.tokens == sum(len(o) for o in ar_outputs) and result.tokens_per_second > 0


@pytest.mark.parametrize("depth,topk,budget", [(4, 1, 4), (3, 3, 8)], ids=["chain", "tree"])
@pytest.mark.parametrize("slots,chunk", [(3, 16), (4, 512)])
def test_draft_model_serving_equals_single_requests(target, draft, requests, ar_outputs, depth, topk, budget,
                                                    slots, chunk):
    gen = Generator(target, {depth: DraftModelDrafter(draft, depth, topk, budget)})
    alone = single(gen, requests)
    result = served(gen, requests, slots=slots, prefill_chunk=chunk)
    assert [r.output for r in result.requests] == ar_outputs
    assert [r.accept_lengths for r in result.requests] == [a.accept_lengths[0] for a in alone]
    assert result.mean_accepted_length > 1.1


def test_padded_prefill_chunks_and_idle_slots(target, draft, requests, ar_outputs):
    """Prefill padded to buckets (as on CUDA) over several syncs, and more slots than requests."""
    gen = Generator(target, {3: DraftModelDrafter(draft, 3, 2, 6)}, prefill_bucket=8)
    result = served(gen, requests[:4], slots=6, prefill_chunk=5)
    assert [r.output for r in result.requests] == ar_outputs[:4]


def test_ngram_serving(target, requests, ar_outputs):
    drafter = NgramDrafter(4, 2, 6)
    gen = Generator(target, {4: drafter})
    alone = single(gen, requests)
    result = served(gen, requests)
    assert [r.output for r in result.requests] == ar_outputs
    assert [r.rounds for r in result.requests] == [a.rounds[0] for a in alone]
    last = {r.slot: (req, r) for req, r in zip(requests, result.requests)}  # admitted in order
    assert len(last) == 3
    for slot, (req, r) in last.items():  # each row's index holds its own request's tokens only
        seen, own = drafter.indexes[slot].tokens, list(req.prompt) + r.output
        assert len(seen) >= len(req.prompt) and seen[: len(own)] == own[: len(seen)]


def test_dflash_serving(target, requests, ar_outputs, tmp_path_factory):
    from specpilot.config import TreeConstruction
    from specpilot.models.dflash import random_dflash
    from specpilot.models.dflash_checkpoint import load_dflash, write_dflash

    out = tmp_path_factory.mktemp("dflash")
    write_dflash(random_dflash(target.config, num_layers=2, block_size=6, mask_token_id=5, seed=3), out,
                 dtype=torch.float32)
    drafter = DFlashDrafter(load_dflash(out, target), target, 6, 8, TreeConstruction.BEST_FIRST)
    gen = Generator(target, {5: drafter})
    alone = single(gen, requests)
    result = served(gen, requests, prefill_chunk=7)
    assert [r.output for r in result.requests] == ar_outputs
    assert [r.accept_lengths for r in result.requests] == [a.accept_lengths[0] for a in alone]


def test_adaptive_tiers_and_lazy_sync(target, draft, requests, ar_outputs):
    tiers = {d: DraftModelDrafter(draft, d, 2, 2 * d, window=9) for d in (2, 4, 8)}
    assert [r.output for r in served(Generator(target, tiers), requests).requests] == ar_outputs
    lazy = Generator(target, {3: DraftModelDrafter(draft, 3, 2, 6)}, sync_every=3)
    assert [r.output for r in served(lazy, requests).requests] == ar_outputs


def test_eos_and_fixed_lengths(target, draft, requests, ar_outputs):
    eos = ar_outputs[0][2]  # a token AR emits early: make it the EOS
    ar = Generator(target, eos_ids=(eos,))
    spec = Generator(target, {3: DraftModelDrafter(draft, 3, 2, 6)}, eos_ids=(eos,))
    expected = [r.outputs[0] for r in single(ar, requests)]
    assert expected[0] == ar_outputs[0][:3]
    assert [r.output for r in served(spec, requests).requests] == expected
    fixed = served(spec, requests, stop_at_eos=False)
    assert [r.output for r in fixed.requests] == ar_outputs


def test_arrivals_wait_and_are_timed_from_arrival(target, requests, ar_outputs):
    late = [Request(r.prompt, r.max_new, arrival=0.02 * i) for i, r in enumerate(requests[:4])]
    result = served(Generator(target), late, slots=2)
    assert [r.output for r in result.requests] == ar_outputs[:4]
    for req, r in zip(late, result.requests):
        assert r.arrival == req.arrival and r.admitted >= req.arrival
        assert r.latency == pytest.approx(r.finished - req.arrival)
        assert r.time_to_first_token <= r.latency


def test_bad_requests_are_config_errors(target):
    engine = ServingEngine(Generator(target), 2)
    with pytest.raises(ConfigError):
        engine.run([])
    with pytest.raises(ConfigError):
        engine.run([Request((), 4)])
    with pytest.raises(ConfigError):
        engine.run([Request((1, 2), 0)])
    with pytest.raises(ConfigError):
        ServingEngine(Generator(target), 0)


def test_eagle3_serving(requests):
    """The shipped fixture target with its trained head, so that a row the head never prefilled
    drafts worse (a random head accepts nothing anyway, and equal outputs alone cannot show it)."""
    from specpilot.engine.drafters.eagle3 import Eagle3Drafter
    from specpilot.models.eagle3_checkpoint import load_eagle3
    from specpilot.models.fixture import fixture_path, resolve_checkpoint

    target = load_model(fixture_path("target"))
    head = load_eagle3(resolve_checkpoint("fixture-eagle3", "drafter"), target)
    gen = Generator(target, {4: Eagle3Drafter(head, target, 4, 2, 6)})
    alone = single(gen, requests)
    result = served(gen, requests, prefill_chunk=7)
    assert [r.output for r in result.requests] == [a.outputs[0] for a in single(Generator(target), requests)]
    assert [r.accept_lengths for r in result.requests] == [a.accept_lengths[0] for a in alone]
    assert max(max(r.accept_lengths) for r in result.requests) > 1  # the head drafts something


@pytest.mark.parametrize("kind", ["ar", "tree", "tree-segments-shared"])
def test_attention_spans_keep_every_output(target, draft, requests, ar_outputs, kind):
    """With `attention_span` each round attends over the cache slots the rows can reach (a
    multiple of the span below the capacity) and the outputs stay AR's; with 0, the whole cache."""
    def gen(span):
        if kind == "ar":
            return Generator(target, attention_span=span)
        shared, segment = (4, 8) if kind == "tree-segments-shared" else (0, 0)
        d = DraftModelDrafter(draft, 3, 3, 8, window=9, shared_budget=shared)
        return Generator(target, {3: d}, attention_span=span, segment_tokens=segment)

    spanned = served(gen(64), requests)
    assert [r.output for r in spanned.requests] == ar_outputs
    spans = spanned.extra["attention_spans"]
    assert any(k != "all" and int(k) < 256 for k in spans) and sum(spans.values()) == spanned.rounds
    whole = served(gen(0), requests)
    assert whole.extra["attention_spans"] == {"all": whole.rounds}


def test_the_span_holds_every_row_for_the_rounds_until_the_next_sync(target):
    """A span is the smallest multiple of `attention_span` holding each row's known length plus a
    slack per round to come and one more; at or past the capacity, the whole cache."""
    gen = Generator(target, attention_span=64)
    engine = ServingEngine(gen, 3, prefill_chunk=16)
    ws = gen.rounds.workspace(3, gen.capacity_for(60, 30), 30)
    slack = gen.rounds.slack()
    assert ws.cache.capacity == 256 and engine._spans(ws) == [64, 128, 192, None]
    assert engine._span(ws, [1, 1, 1], 1) == 64
    for reach, rounds in (([61, 5, 1], 1), ([100, 3, 1], 4)):
        need = max(reach) + (rounds + 1) * slack
        assert engine._span(ws, reach, rounds) == -(-need // 64) * 64 >= need
    assert engine._span(ws, [250, 1, 1], 1) is None


@pytest.mark.parametrize("kind", ["model", "eagle3"])
def test_padded_packed_prefill_keeps_every_output(target, draft, requests, ar_outputs, kind):
    """With a prefill bucket (as on a GPU) every packed prefill is padded into the scratch region and
    every packed length is warmed first (target, draft model, EAGLE-3 head): outputs stay AR's."""
    from specpilot.engine.drafters.eagle3 import Eagle3Drafter
    from specpilot.models.eagle3 import random_eagle3

    if kind == "model":
        d = DraftModelDrafter(draft, 3, 3, 8, window=9)
    else:
        d = Eagle3Drafter(random_eagle3(target.config, seed=3).eval().requires_grad_(False), target, 3, 2, 6)
    gen = Generator(target, {3: d}, prefill_bucket=16)
    assert gen.prefill_bucket == 16 and d.settings.prefill_bucket == 16
    result = served(gen, requests, prefill_chunk=24)
    assert [r.output for r in result.requests] == ar_outputs


def test_saturated_stretches_count_only_while_every_slot_is_taken_and_a_request_waits(target, draft, requests):
    """Two equal requests per slot, 2 slots, AR, fixed lengths: the first pair decodes alone with two
    requests waiting (saturated after its first sync) and the second pair drains (not): the saturated
    tokens are the first pair's after the first sync, an even count short of their 2 x 6."""
    prompt = requests[0].prompt
    result = served(Generator(target), [Request(prompt, 6)] * 4, slots=2, prefill_chunk=64, stop_at_eos=False)
    assert result.tokens == 24
    assert result.saturated_tokens in (8, 10)  # 2 x (6 - tokens per row at the first sync, 1 or 2)
    assert 0 < result.saturated_seconds < result.seconds
    alone = served(Generator(target), [Request(prompt, 6)] * 2, slots=2, stop_at_eos=False)
    assert (alone.saturated_tokens, alone.saturated_seconds) == (0, 0.0)  # nothing ever waited
    many = served(Generator(target, {3: DraftModelDrafter(draft, 3, 3, 8)}), requests, slots=3, stop_at_eos=False)
    assert 0 < many.saturated_tokens < many.tokens and 0 < many.saturated_seconds < many.seconds


def test_ngram_adaptive_tiers_serving(target, requests, ar_outputs):
    """Depth tiers of the n-gram drafter share the rows' indexes under continuous batching too."""
    tiers = {d: NgramDrafter(d, 2, 2 * d) for d in (2, 4, 8)}
    result = served(Generator(target, tiers), requests)
    assert [r.output for r in result.requests] == ar_outputs
    assert len({id(d.indexes) for d in tiers.values()}) == 1
