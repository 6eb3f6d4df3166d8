"""Packed prefill: the prompt chunks of several cache rows in one forward.

Continuous batching admits requests one sync at a time, and each brings a prompt chunk for its own
row of the shared cache. Run row by row, every chunk is a whole eager forward whose host time
goes to launching kernels, so a sync with many admissions is a stretch of a serving unit in which
the GPU mostly waits, and that host time is what varies from run to run (measured by
`scripts/serving_timing_noise.py`). Packed, the chunks of one sync are one forward over their
concatenated tokens [1,S]:

* Each chunk gets a region of a batch-1 *packing cache* (`PackingCache`): region r holds slots
  [r*cap, (r+1)*cap) for the r-th chunk's row; its prompt prefix (slots < the chunk's start) is
  copied in from the row first, so a chunk that continues a prompt sees the tokens before it.
* Token t of chunk r sits at region slot start_r + t with RoPE position start_r + t, and its mask
  admits exactly region r's slots <= start_r + t: the chunk's own causal attention over its row,
  as a one-row chunk forward computes it. Masked slots add exact zeros, so no chunk sees another.
* With a bucket (CUDA), S is padded to a multiple of it: the padding tokens sit in a scratch
  region past the last row region and attend to themselves only. The packing cache's size is
  fixed per row cache, so S is the only shape that varies (`warm`, one pass per padded length).
* Afterwards the real tokens' K/V are copied from their region slots to their row's slots.
* A graphed packing cache (`graphed`, on CUDA with a bucket) runs the forward as a CUDA graph, one
  per padded length, captured on the length's first use (`warm` captures them all): the layout's
  per-call tensors are copied into the graph's static inputs and the forward is one replay, where
  the eager forward pays the host's launch of every kernel. The copy-in of continued prompts
  and the write-back stay eager (their sizes vary); the features come out cloned.

Outputs equal the row-by-row chunk forwards up to float rounding: the projections see an [S,C]
input instead of [T,C], and attention runs over the packing cache's slots, not the row's.

The cost of the fixed layout: attention reads all `rows` x capacity slots (plus the mask over
them) in every packed forward, however few chunks it carries. For fixture-x16-batch (8 regions of
1280 slots) that is ~56 GFLOP of attention in a 512-token forward (computed, not measured): small
beside its projections; at long-context capacities (tens of thousands of slots) it is not, and a
variable-length attention kernel over the rows' own slots is the fix.

Owns: the packing cache, the packed layout (`pack`, for any model with a cached forward), the
target's packed forward and its warm-up. Does not own which chunks run when
(`engine.serving`) or the one-row chunk forward (`steps.prefill_chunk`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specpilot.engine.graphs import GraphedCallable
from specpilot.models.kv_cache import KVCache
from specpilot.kernels.dispatch import prefill_scope
from specpilot.models.transformer import Transformer

PACK_ROWS = 8  # chunks per packed forward at most (the packing cache holds this many row regions)


@dataclass(frozen=True)
class Chunk:
    row: int  # the cache row its tokens belong to
    tokens: tuple[int, ...]  # prompt tokens at slots start..start+len-1 of that row
    start: int


class PackingCache:
    """The batch-1 cache one packed forward attends over: `rows` regions of the row cache's
    capacity, then a scratch region of `pad` slots for padding tokens. Zero-initialised once and
    only ever written with K/V, so masked slots hold finite values."""

    def __init__(self, like: KVCache, rows: int, pad: int, graphed: bool = False):
        self.rows, self.cap, self.pad = rows, like.capacity, pad
        self.graphed = graphed and pad > 0  # a bucket bounds the lengths, hence the graphs
        self.graphs: dict = {}  # (model id, S, feature layers) -> GraphedCallable
        self.pool = None  # the graphs' shared memory pool (they replay one at a time)
        k0 = like.k[0]
        shape = (1, k0.shape[1], rows * self.cap + pad, k0.shape[3])
        self.cache = KVCache([torch.zeros(shape, dtype=k0.dtype, device=k0.device) for _ in like.k],
                             [torch.zeros(shape, dtype=k0.dtype, device=k0.device) for _ in like.v])

    @classmethod
    def of(cls, store: dict, cache: KVCache, bucket: int, graphed: bool = False) -> "PackingCache":
        """The packing cache of `cache` kept in `store` (by batch and capacity, as drafters keep their
        caches per workspace): `PACK_ROWS` regions at most, a scratch region of one bucket."""
        key = (cache.batch, cache.capacity)
        if key not in store:
            store[key] = cls(cache, min(cache.batch, PACK_ROWS), bucket, graphed)
        return store[key]

    @property
    def slots(self) -> int:
        return self.rows * self.cap + self.pad

    def regions(self, t: torch.Tensor) -> torch.Tensor:
        """[Hkv, rows, cap, D] view of one layer's row regions (t [1,Hkv,slots,D])."""
        Hkv, D = t.shape[1], t.shape[3]
        return t[0, :, : self.rows * self.cap].view(Hkv, self.rows, self.cap, D)


def to_device(host: torch.Tensor, dev: torch.device) -> torch.Tensor:
    """A host tensor on `dev` without a host sync (pinned, asynchronous on CUDA)."""
    return (host.pin_memory() if dev.type == "cuda" else host).to(dev, non_blocking=True)


def with_features(chunks: list[Chunk], features: list | None) -> list[tuple[Chunk, torch.Tensor]]:
    """The (chunk, features [T,nC]) pairs of the chunks that have features (a feature-conditioned
    drafter's share of one sync's chunks)."""
    pairs = zip(chunks, features or [None] * len(chunks))
    return [(c, f) for c, f in pairs if f is not None and f.shape[0]]


def padded_lengths(bucket: int, limit: int, capacity: int) -> range:
    """Every packed length a chunk budget of `limit` real tokens pads to, up to a row's `capacity`
    (none without a bucket): what a warm-up runs."""
    if bucket <= 0:
        return range(0)
    return range(bucket, min(-(-limit // bucket) * bucket, capacity) + 1, bucket)


@dataclass
class Packed:
    """One packed forward's inputs on the device (`pack`): S tokens, the first n real, chunk i's
    tokens at [offsets[i], offsets[i] + len); `rows`/`row_slots` [n] say where each real token's
    K/V belongs in the row cache (`write_back`)."""

    tokens: torch.Tensor  # [1,S] the chunks' tokens, then padding (0)
    positions: torch.Tensor  # [1,S] RoPE positions
    slots: torch.Tensor  # [1,S] packing-cache slots
    mask: torch.Tensor  # [1,1,S,slots] bool
    rows: torch.Tensor  # [n]
    row_slots: torch.Tensor  # [n]
    offsets: list[int]
    n: int

    def write_back(self, cache: KVCache, packing: PackingCache) -> None:
        """The real tokens' K/V, from their region slots to their row's slots."""
        region_slots = self.slots[0, : self.n]
        for base, pk in zip(cache.k + cache.v, packing.cache.k + packing.cache.v):
            base[self.rows, :, self.row_slots] = pk[0][:, region_slots].transpose(0, 1)  # [n,Hkv,D]


def pack(cache: KVCache, packing: PackingCache, chunks: list[Chunk], bucket: int = 0) -> Packed:
    """Lay out `chunks` (1..`packing.rows`, each with tokens) in the packing cache, their prompt
    prefixes copied in from their rows; the model's forward over the result, then `write_back`."""
    if not chunks or len(chunks) > packing.rows or any(not c.tokens for c in chunks):
        raise ValueError(f"a packed forward takes 1..{packing.rows} non-empty chunks (got {len(chunks)})")
    dev = cache.k[0].device
    cap = packing.cap
    n = sum(len(c.tokens) for c in chunks)
    S = -(-n // bucket) * bucket if bucket > 0 else n
    if S - n > packing.pad:
        raise ValueError(f"padding of {S - n} tokens exceeds the scratch region of {packing.pad}")
    # host side, one transfer: per token (padding last) its token, position, region slot, first
    # and last visible region slot, row and row slot; then the rows and regions of continued chunks
    tok, pos, slot, lo, hi, row, row_slot, offsets = [], [], [], [], [], [], [], []
    for r, c in enumerate(chunks):
        T = len(c.tokens)
        offsets.append(len(tok))
        tok += c.tokens
        pos += range(c.start, c.start + T)
        slot += range(r * cap + c.start, r * cap + c.start + T)
        lo += [r * cap] * T
        hi += range(r * cap + c.start, r * cap + c.start + T)
        row += [c.row] * T
        row_slot += range(c.start, c.start + T)
    scratch = packing.rows * cap
    for j in range(S - n):  # padding: the scratch region, attending to itself
        tok.append(0)
        pos.append(j)
        slot.append(scratch + j)
        lo.append(scratch)
        hi.append(scratch + j)
        row.append(0)
        row_slot.append(0)
    cont = [(r, c) for r, c in enumerate(chunks) if c.start > 0]  # chunks that continue a prompt
    flat = tok + pos + slot + lo + hi + row + row_slot + [c.row for _, c in cont] + [r for r, _ in cont]
    host = torch.tensor(flat, dtype=torch.int64)
    packed = to_device(host, dev)
    per_token = packed[: 7 * S].view(7, S)
    s = torch.arange(packing.slots, device=dev)
    mask = ((s[None] >= per_token[3][:, None]) & (s[None] <= per_token[4][:, None]))[None, None]  # [1,1,S,slots]
    if cont:  # their prompt prefix, from their rows into their regions
        span = max(c.start for _, c in cont)
        src, dst = packed[7 * S :].view(2, len(cont))
        for base, pk in zip(cache.k + cache.v, packing.cache.k + packing.cache.v):
            packing.regions(pk)[:, dst, :span] = base[src, :, :span].transpose(0, 1)
    return Packed(per_token[0][None], per_token[1][None], per_token[2][None], mask, per_token[5, :n],
                  per_token[6, :n], offsets, n)


def packed_forward(model: Transformer, cache: KVCache, packing: PackingCache, chunks: list[Chunk],
                   bucket: int = 0, capture: tuple[int, ...] = ()) -> list[torch.Tensor] | None:
    """Write every chunk's K/V into its row of `cache` from one forward of `model` (at most
    `packing.rows` chunks, each with tokens); with `capture`, each chunk's features [T,nC] in
    order, else None."""
    p = pack(cache, packing, chunks, bucket)
    if packing.graphed:
        out = _graph_of(model, packing, p.tokens.shape[1], tuple(capture))(p.tokens, p.positions, p.slots, p.mask)
    else:
        empty = torch.zeros(1, 0, dtype=torch.int64, device=p.tokens.device)
        with prefill_scope():  # eager: W12 weights with a kept decoded copy run cuBLAS on it
            out = model(p.tokens, p.positions, packing.cache, p.slots, p.mask, logits_for=empty, capture=capture)
    p.write_back(cache, packing)
    if not capture:
        return None
    return [out[1][0, o : o + len(c.tokens)].clone() for o, c in zip(p.offsets, chunks)]  # [T,nC] each


def _graph_of(model: Transformer, packing: PackingCache, S: int, capture: tuple[int, ...]) -> GraphedCallable:
    """The graph of `model`'s packed forward over `packing` at S tokens, captured on first use."""
    key = (id(model), S, capture)
    if key not in packing.graphs:
        dev = packing.cache.k[0].device
        empty = torch.zeros(1, 0, dtype=torch.int64, device=dev)

        def forward(tokens, positions, slots, mask):
            return model(tokens, positions, packing.cache, slots, mask, logits_for=empty, capture=capture)

        static = (torch.zeros(1, S, dtype=torch.int64, device=dev), torch.zeros(1, S, dtype=torch.int64, device=dev),
                  torch.full((1, S), packing.slots - 1, dtype=torch.int64, device=dev),
                  torch.zeros(1, 1, S, packing.slots, dtype=torch.bool, device=dev))
        static[3][..., -1] = True  # warm-up and capture: every token in the last scratch slot, seeing only it
        if packing.pool is None and dev.type == "cuda":
            packing.pool = torch.cuda.graph_pool_handle()
        packing.graphs[key] = GraphedCallable(forward, static, pool=packing.pool)
    return packing.graphs[key]


def warm(model: Transformer, cache: KVCache, packing: PackingCache, bucket: int, limit: int, row: int = 0,
         capture: tuple[int, ...] = ()) -> None:
    """Run every padded packed length of up to `limit` real tokens once (a chunk of zeros in `row`, which
    must be free: its slots 0..limit-1 are overwritten), so no request pays a shape's first run."""
    for S in padded_lengths(bucket, limit, packing.cap):
        packed_forward(model, cache, packing, [Chunk(row, (0,) * S, 0)], bucket, capture)
