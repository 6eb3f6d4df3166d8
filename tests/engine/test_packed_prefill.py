"""Packed prefill writes what row-by-row chunk prefills write (CPU, float32): each row's K/V and
each chunk's features, for chunks that begin a prompt and chunks that continue one, with and
without padding to a bucket; no chunk sees another's tokens; bad calls are refused."""

import pytest
import torch

from specpilot.models.kv_cache import KVCache
from specpilot.engine.drafters.base import DrafterSettings
from specpilot.engine.packed_prefill import Chunk, PackingCache, packed_forward
from specpilot.engine.steps import prefill_chunk
from specpilot.models.loading import load_model

B, CAP = 4, 64


def fresh(model) -> KVCache:
    return KVCache.allocate(model.config, B, CAP, model.device, model.dtype)


def prompts():
    g = torch.Generator().manual_seed(5)
    return [torch.randint(1, 4096, (n,), generator=g).tolist() for n in (30, 7, 19, 12)]


def rowwise(model, chunks: list[Chunk], capture=()) -> tuple[KVCache, list]:
    """Each chunk by the one-row chunk forward, after the chunks before it (row prefixes)."""
    cache = fresh(model)
    feats = [prefill_chunk(model, cache.row(c.row), list(c.tokens), c.start, 0, capture) for c in chunks]
    return cache, feats


def row_entries(cache: KVCache, row: int, n: int) -> list[torch.Tensor]:
    return [t[row, :, :n] for t in cache.k + cache.v]


@pytest.mark.parametrize("bucket", [0, 16])
def test_packed_equals_rowwise(target, bucket):
    """Rows 0 and 2 get their prompt in two chunks (the second packed with rows 1 and 3's only
    chunks), so a packed chunk reads a prefix another forward wrote."""
    p = prompts()
    first = [Chunk(0, tuple(p[0][:20]), 0), Chunk(2, tuple(p[2][:8]), 0)]
    second = [Chunk(0, tuple(p[0][20:]), 20), Chunk(1, tuple(p[1]), 0), Chunk(2, tuple(p[2][8:]), 8),
              Chunk(3, tuple(p[3]), 0)]
    capture = (0, 1)
    expected, expected_feats = rowwise(target, first + second, capture)
    cache = fresh(target)
    packing = PackingCache(cache, 4, bucket)
    feats = packed_forward(target, cache, packing, first, bucket, capture)
    feats += packed_forward(target, cache, packing, second, bucket, capture)
    for row, n in ((0, 30), (1, 7), (2, 19), (3, 12)):
        for got, want in zip(row_entries(cache, row, n), row_entries(expected, row, n)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for got, want in zip(feats, expected_feats):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_chunks_do_not_see_each_other(target):
    """Changing one chunk's tokens leaves every other row's K/V as it was, and writes nothing past
    a row's chunk."""
    p = prompts()
    a = [Chunk(0, tuple(p[0]), 0), Chunk(1, tuple(p[1]), 0)]
    b = [Chunk(0, tuple(p[3]), 0), Chunk(1, tuple(p[1]), 0)]
    caches = []
    for chunks in (a, b):
        cache = fresh(target)
        packed_forward(target, cache, PackingCache(cache, 2, 0), chunks, 0)
        caches.append(cache)
    assert all(torch.equal(x, y) for x, y in zip(row_entries(caches[0], 1, 7), row_entries(caches[1], 1, 7)))
    assert not torch.equal(caches[0].k[0][0, :, :12], caches[1].k[0][0, :, :12])
    assert all(t[1, :, 7:].abs().sum() == 0 and t[2:].abs().sum() == 0 for t in caches[0].k + caches[0].v)


def test_bad_calls(target):
    cache = fresh(target)
    packing = PackingCache(cache, 2, 4)
    with pytest.raises(ValueError, match="1..2 non-empty"):
        packed_forward(target, cache, packing, [Chunk(r, (1,), 0) for r in range(3)], 4)
    with pytest.raises(ValueError, match="non-empty"):
        packed_forward(target, cache, packing, [Chunk(0, (), 0)], 4)
    with pytest.raises(ValueError, match="scratch region"):
        packed_forward(target, cache, packing, [Chunk(0, (1,), 0)], 8)


@pytest.mark.parametrize("bucket", [0, 16])
def test_eagle3_head_packed_equals_rowwise(target, bucket):
    """The EAGLE-3 head's packed prompt forwards fill each row's head slots and read each row's root
    hidden at its chunk's last real slot, as the one-row forwards do (float32, random head; chunks
    that begin and that continue a prompt)."""
    from specpilot.engine.drafters.eagle3 import Eagle3Drafter
    from specpilot.engine.state import DecodeState
    from specpilot.models.eagle3 import random_eagle3

    head = random_eagle3(target.config, seed=3).to(dtype=target.dtype).eval().requires_grad_(False)
    p = prompts()
    first = [Chunk(0, tuple(p[0][:20]), 0), Chunk(2, tuple(p[2][:8]), 0)]
    second = [Chunk(0, tuple(p[0][20:29]), 20), Chunk(1, tuple(p[1][:6]), 0), Chunk(2, tuple(p[2][8:18]), 8),
              Chunk(3, tuple(p[3][:11]), 0)]
    g = torch.Generator().manual_seed(7)
    width = len(head.feature_layers) * target.config.hidden_size
    features = {id(c): torch.randn(len(c.tokens), width, generator=g) for c in first + second}
    drafters = []
    for _ in range(2):
        state = DecodeState.allocate(B, CAP, 8, target.device)
        for b, prompt in enumerate(p):
            state.load_row(b, prompt, 4)
        d = Eagle3Drafter(head, target, 3, 2, 4)
        d.configure(DrafterSettings(prefill_bucket=bucket))
        d.start([[0]] * B, state)  # allocates the head's cache, fills nothing
        drafters.append((d, state))
    (rowwise, s0), (packed, s1) = drafters
    for c in first + second:  # one row at a time: the head's one-row prompt forward
        f = features[id(c)]
        nxt = s0.tokens[c.row, c.start + 1 : c.start + f.shape[0] + 1]  # token t + 1 of slot t
        rowwise.cache.root_hidden[c.row] = rowwise._prompt_forward(rowwise.cache.kv.row(c.row), f, nxt, c.start)
    for group in (first, second):
        packed.prefill_rows(group, s1, [features[id(c)] for c in group])
    for row, n in ((0, 29), (1, 6), (2, 18), (3, 11)):
        for a, b in zip(rowwise.cache.kv.k + rowwise.cache.kv.v, packed.cache.kv.k + packed.cache.kv.v):
            torch.testing.assert_close(b[row, :, :n], a[row, :, :n], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(packed.cache.root_hidden, rowwise.cache.root_hidden, rtol=1e-5, atol=1e-5)
    assert rowwise.cache.root_hidden.abs().sum(1).min() > 0  # every row has a root hidden to compare


def test_dflash_context_of_a_sync_equals_rowwise(target):
    """DFlash writes one sync's context K/V in one call: each token at its own row and slot, as
    the one-row writes do (float32, random drafter; chunks that begin and that continue a prompt)."""
    from specpilot.engine.drafters.dflash import DFlashDrafter
    from specpilot.engine.state import DecodeState
    from specpilot.models.dflash import random_dflash

    model = random_dflash(target.config, seed=2).to(dtype=target.dtype).eval().requires_grad_(False)
    p = prompts()
    chunks = [Chunk(0, tuple(p[0][20:29]), 20), Chunk(1, tuple(p[1][:6]), 0), Chunk(3, tuple(p[3][:11]), 0)]
    g = torch.Generator().manual_seed(4)
    width = len(model.feature_layers) * target.config.hidden_size
    features = [torch.randn(len(c.tokens), width, generator=g) for c in chunks]
    drafters = []
    for _ in range(2):
        state = DecodeState.allocate(B, CAP, 8, target.device)
        d = DFlashDrafter(model, target, 4, 8)
        d.start([[0]] * B, state)
        drafters.append((d, state))
    (rowwise, _), (packed, s1) = drafters
    for c, f in zip(chunks, features):  # one row at a time
        pos = c.start + torch.arange(f.shape[0])[None]
        rowwise._write_context(rowwise.cache.row(c.row), f[None], pos)
    packed.prefill_rows(chunks, s1, features)
    for a, b in zip(rowwise.cache.k + rowwise.cache.v, packed.cache.k + packed.cache.v):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    assert rowwise.cache.k[0][0, :, 20:29].abs().sum() > 0 and rowwise.cache.k[0][0, :, :20].abs().sum() == 0


def test_warm_runs_every_padded_length(target, monkeypatch):
    """Every length a chunk budget of `limit` tokens pads to, up to the row capacity; none unpadded."""
    import specpilot.engine.packed_prefill as pp

    seen = []
    monkeypatch.setattr(pp, "packed_forward", lambda model, cache, packing, chunks, bucket, capture=():
                        seen.append(sum(len(c.tokens) for c in chunks)))
    cache = fresh(target)
    packing = PackingCache(cache, 2, 16)
    pp.warm(target, cache, packing, 16, 24)
    assert seen == [16, 32]  # 17..24 real tokens pad to 32
    seen.clear()
    pp.warm(target, cache, packing, 16, 200)
    assert seen == [16, 32, 48, 64]  # the row's capacity bounds a chunk
    seen.clear()
    pp.warm(target, cache, packing, 0, 24)
    assert seen == []


class ReplayOnCpu:
    """Stands in for `GraphedCallable` off the GPU with a graph's semantics: the function runs on its
    static inputs only, which each call overwrites in place; its output tensors are reused."""

    captured = 0

    def __init__(self, fn, static_inputs, warmup=2, pool=None):
        self.fn, self.static_inputs = fn, static_inputs
        ReplayOnCpu.captured += 1

    def __call__(self, *inputs):
        for dst, src in zip(self.static_inputs, inputs):
            dst.copy_(src)
        return self.fn(*self.static_inputs)


def test_graphed_packed_forward_equals_eager(target, monkeypatch):
    """A graphed packing cache runs one graph per padded length, fed through its static inputs:
    chunks that pad to the same length reuse it and still write their own K/V and features."""
    from specpilot.engine import packed_prefill

    monkeypatch.setattr(packed_prefill, "GraphedCallable", ReplayOnCpu)
    ReplayOnCpu.captured = 0
    p = prompts()
    first = [Chunk(0, tuple(p[0][:20]), 0), Chunk(2, tuple(p[2][:8]), 0)]  # 28 tokens: pads to 32
    second = [Chunk(0, tuple(p[0][20:]), 20), Chunk(1, tuple(p[1]), 0), Chunk(2, tuple(p[2][8:]), 8),
              Chunk(3, tuple(p[3]), 0)]  # 40 tokens: pads to 48
    third = [Chunk(1, (5, 6, 7), 7)]  # continues row 1: pads to 16
    capture = (0, 1)
    eager, graphed = fresh(target), fresh(target)
    plain, packing = PackingCache(eager, 4, 16), PackingCache(graphed, 4, 16, graphed=True)
    assert packing.graphed and not plain.graphed and not PackingCache(eager, 4, 0, graphed=True).graphed
    for chunks in (first, second, third, first):
        want = packed_forward(target, eager, plain, chunks, 16, capture)
        got = packed_forward(target, graphed, packing, chunks, 16, capture)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=0, atol=0)
    for g, w in zip(graphed.k + graphed.v, eager.k + eager.v):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    assert ReplayOnCpu.captured == 3 and len(packing.graphs) == 3  # lengths 32, 48, 16; the repeat reuses 32


def test_a_graphing_generator_has_the_draft_model_replay_its_packed_prefill(target, drafter_dir, monkeypatch):
    """The generator hands its CUDA-graph setting to the draft model, whose packed prefill of one
    sync's chunks then replays a graph per padded length and writes what the eager one writes."""
    from specpilot.engine import packed_prefill
    from specpilot.engine.drafters.draft_model import DraftModelDrafter
    from specpilot.engine.generator import Generator
    from specpilot.engine.state import DecodeState

    monkeypatch.setattr(packed_prefill, "GraphedCallable", ReplayOnCpu)
    draft = load_model(drafter_dir)
    gen = Generator(target, {3: DraftModelDrafter(draft, 3, 2, 6)}, prefill_bucket=16)
    assert gen.drafters[3].settings.prefill_graphs is False  # CPU: no graphs
    p = prompts()
    chunks = [Chunk(0, tuple(p[0][:20]), 0), Chunk(1, tuple(p[1]), 0), Chunk(2, tuple(p[2]), 0)]
    caches = []
    for graphed in (False, True):
        d = DraftModelDrafter(draft, 3, 2, 6)
        d.configure(DrafterSettings(prefill_bucket=16, prefill_graphs=graphed))
        state = DecodeState.allocate(B, CAP, 8, draft.device)
        d.start([[1, 2]] * B, state)
        d.prefill_rows(chunks, state)
        d.prefill_rows([Chunk(0, tuple(p[0][20:]), 20)], state)
        caches.append(d.cache)
        assert len(d._packing().graphs) == (2 if graphed else 0)  # 46 tokens pad to 48, 10 to 16
    for g, w in zip(caches[1].k + caches[1].v, caches[0].k + caches[0].v):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_eager_prefills_run_in_the_prefill_scope(target, monkeypatch):
    """Both eager prefill forwards (row by row, packed) run their projections in
    `dispatch.prefill_scope` (W12 weights with a kept copy take cuBLAS there), and nothing else does."""
    from specpilot.kernels import dispatch

    seen = []
    forward = type(target).forward

    def spy(self, *args, **kwargs):
        seen.append(dispatch._PREFILL.get())
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(type(target), "forward", spy)
    p = prompts()
    rowwise(target, [Chunk(0, tuple(p[0]), 0)])
    cache = fresh(target)
    packed_forward(target, cache, PackingCache(cache, 4, 0), [Chunk(1, tuple(p[1]), 0)], 0)
    assert seen == [True, True] and dispatch._PREFILL.get() is False
