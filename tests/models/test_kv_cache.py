"""The static KV cache: every layer's keys and values are views of one stacked buffer, and
`move_slots` (a commit) equals moving each entry on its own, in one scatter over that buffer."""

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from specpilot.models.kv_cache import KVCache
from specpilot.models.config import ModelConfig

CONFIG = ModelConfig("qwen3", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=3, num_heads=4,
                     num_kv_heads=2, head_dim=8)


def filled(batch: int = 3, capacity: int = 24) -> KVCache:
    cache = KVCache.allocate(CONFIG, batch, capacity, "cpu", torch.float32)
    g = torch.Generator().manual_seed(0)
    for t in cache.k + cache.v:
        t.copy_(torch.randn(t.shape, generator=g))
    return cache


def moved_one_by_one(cache: KVCache, src: torch.Tensor, dst: torch.Tensor) -> list[torch.Tensor]:
    """The reference: every layer's tensors after copying entry (b, src[b,j]) to (b, dst[b,j]), all
    sources read first."""
    out = []
    for t in cache.k + cache.v:
        new = t.clone()
        for b in range(src.shape[0]):
            for j in range(src.shape[1]):
                new[b, :, dst[b, j]] = t[b, :, src[b, j]]
        out.append(new)
    return out


def test_layers_are_views_of_one_stack():
    cache = filled()
    assert cache.stack.shape == (2, 3, 3, 2, 24, 8)
    cache.k[1][2, 0, 5] = 7.0
    cache.v[2][0, 1, 3] = -3.0
    assert cache.stack[0, 1, 2, 0, 5].eq(7.0).all() and cache.stack[1, 2, 0, 1, 3].eq(-3.0).all()
    assert all(t.is_contiguous() for t in cache.k + cache.v)


@pytest.mark.parametrize("view", ["whole", "span", "row"])
def test_move_slots_equals_moving_each_entry(view):
    cache = filled()
    target = {"whole": cache, "span": cache.span(16), "row": cache.row(1)}[view]
    B = target.batch
    # overlapping ranges: a path's entries move down onto slots another entry is read from
    src = torch.tensor([[6, 9, 12, 15], [4, 5, 6, 7], [10, 8, 13, 14]])[:B]
    dst = torch.tensor([[5, 6, 7, 8], [4, 5, 6, 7], [9, 10, 11, 12]])[:B]
    expected = moved_one_by_one(target, src, dst)
    target.move_slots(src, dst)
    for got, want in zip(target.k + target.v, expected):
        assert torch.equal(got, want)


def index_puts(cache: KVCache) -> int:
    src = torch.tensor([[3, 4], [5, 6], [7, 8]])
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        cache.move_slots(src, src - 1)
    return sum(e.count for e in prof.key_averages() if e.key == "aten::index_put_")


def test_a_commit_is_one_scatter_over_the_stack():
    cache = filled()
    assert index_puts(cache) == 1
    unstacked = KVCache(cache.k, cache.v)  # the same layers without their stack: one scatter each
    assert index_puts(unstacked) == 2 * CONFIG.num_layers
