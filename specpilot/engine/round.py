"""The decoding round and the workspaces it runs in: what one round does, read in one place.

A round, for a batch of B rows in a workspace: the tier's drafter proposes a tree (on the device
inside the round, or from the committed tokens on the host before it: `needs_host_tokens`), the
target verifies it in one forward and commits the accepted path and one more token (`steps.py`;
sampled rows by `sampled_steps.py`), and a feature-conditioned drafter observes the accepted
path's features. Without a drafter a round is one AR step. A round never syncs with the host; the
loops that run rounds (`generator.py`, a static batch; `serving.py`, continuous batching) sync
between them.

Owns:
- *Workspaces* (`Workspace`): a target cache and a `DecodeState` per (batch, capacity), with the
  round's CUDA graphs (one per depth tier, attention span and sampling `Filters`), the packed
  prefill cache and the rows' sampling parameters. They are reused across requests, since a
  captured graph keeps pointing at the tensors it was captured with; the most recently used
  `max_workspaces` are kept, and the drafters forget their state of a dropped one (`release`).
- *Capacity*: a workspace holds prompt + new tokens + `slack()`: the most slots past a row's
  committed length one round writes (2 + segment tokens, or a drafter's `slack()` + 1), rounded up
  to 256 slots within the target's context.
- *The round* (`round`): eager (`step`) or replayed from the graph captured on first use (`prepare`
  captures them all before any timing starts).
- *Depth tiers* (`TierPolicy`): which tier's drafter drafts the next round.
- *Setup*: the target's prefill (`prefill`), starting the drafter (`start_drafter`), and a new
  workspace's padded prefill shapes run once (`prepare`).

Sampling: with `filters` a round is a sampled one, by the workspace's `RowSampling`, with a graph of
its own per `Filters`; `filters(params)` refuses what sampled rounds do not support.

Does not own what a round computes (`steps.py`, `sampled_steps.py`, `drafters/`), the loops, or
timing.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from specpilot.engine.drafters.base import Drafter, DrafterSettings
from specpilot.engine.faults import Fault, FaultKind, parse_fault
from specpilot.engine.graphs import GraphedCallable
from specpilot.engine.packed_prefill import PackingCache
from specpilot.engine.row_sampling import Filters, RowSampling
from specpilot.engine.sampled_steps import sampled_ar_step, sampled_verify_step
from specpilot.engine.sampling import SamplingParams
from specpilot.engine.state import DecodeState
from specpilot.engine.steps import ar_step, prefill, verify_step
from specpilot.engine.tree import DraftTree
from specpilot.errors import ConfigError
from specpilot.kernels import launch
from specpilot.models import ops
from specpilot.models.transformer import Transformer

PREFILL_BUCKET = 64  # prefill lengths are padded to multiples of this on CUDA
WARM_PREFILL_TOKENS = 1024  # a new workspace runs each padded prefill shape up to this once


@dataclass
class Workspace:
    cache: object  # the target's decode cache (`new_cache`: a KVCache, or a hybrid decoder's)
    state: DecodeState
    graphs: dict = field(default_factory=dict)  # `graph_key(tier, span, filters)` -> GraphedCallable
    prefill_warm: bool = False  # every padded prefill shape has run once (`Rounds.prepare`)
    packing: PackingCache | None = None  # continuous batching's packed prefill cache (`engine.packed_prefill`)
    sampling: RowSampling | None = None  # the rows' sampling parameters, allocated by the first sampled batch

    def rows(self) -> RowSampling:
        """The workspace's `RowSampling` (allocated once: captured graphs keep pointing at it)."""
        if self.sampling is None:
            self.sampling = RowSampling.allocate(self.state.batch, self.state.tokens.device)
        return self.sampling


@dataclass(frozen=True)
class RoundSteps:
    """The step functions a round calls: compiled with static shapes (`verify_compile`) or eager."""

    ar: Callable
    verify: Callable
    sampled_ar: Callable
    sampled_verify: Callable

    @classmethod
    def of(cls, device: torch.device, compiled: bool) -> "RoundSteps":
        steps = (ar_step, verify_step, sampled_ar_step, sampled_verify_step)
        return cls(*(ops.compiled_static(f, device) if compiled else f for f in steps))


@dataclass
class TierPolicy:
    """Adaptive depth: the tier (a drafter's depth) of the next round. A run starts in the middle
    tier; after each host sync it goes one tier deeper when the mean accepted drafts of the last
    `window` syncs reach 0.8 x the tier, one shallower when they fall below 0.4 x (the record then
    starts over). One tier: it stays."""

    tiers: list[int]  # ascending
    tier: int
    window: int = 4
    recent: list[float] = field(default_factory=list)  # mean accepted drafts per host sync

    @classmethod
    def start(cls, tiers: list[int]) -> "TierPolicy":
        return cls(tiers, tiers[len(tiers) // 2])

    @property
    def adaptive(self) -> bool:
        return len(self.tiers) > 1

    def update(self, accepted: float) -> int:
        """Record a sync's mean accepted drafts; the tier of the rounds until the next sync."""
        self.recent.append(accepted)
        if len(self.recent) < self.window:
            return self.tier
        mean = sum(self.recent[-self.window :]) / self.window
        i = self.tiers.index(self.tier)
        if mean >= 0.8 * self.tier and i + 1 < len(self.tiers):
            self.recent.clear()
            self.tier = self.tiers[i + 1]
        elif mean < 0.4 * self.tier and i > 0:
            self.recent.clear()
            self.tier = self.tiers[i - 1]
        return self.tier


def graph_key(tier: int, span: int | None, filters: Filters | None):
    """A workspace's graph of a round: per tier, attention span (None: the whole cache) and filters."""
    key = tier if span is None else (tier, span)
    return key if filters is None else ("sampled", filters, key)


def _launching(method):
    """`method` of `Rounds` run inside its `launching()` context."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with self.launching():
            return method(self, *args, **kwargs)
    return run


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


class Rounds:
    """The round of one target and its drafters, in the workspaces it keeps.

    `drafters` maps a depth tier to its drafter (one entry unless adaptive depth is on; none: AR);
    the tiers share one drafter state (`Drafter.share_caches`).
    """

    def __init__(
        self,
        target: Transformer,
        drafters: dict[int, Drafter] | None = None,
        eos_ids: tuple[int, ...] = (),
        cuda_graphs: bool = True,
        fault: Fault | str | None = None,
        prefill_bucket: int | None = None,
        segment_tokens: int = 0,
        attention_span: int = 0,
        verify_compile: bool = False,
        pdl: bool = False,
    ):
        self.target = target
        # the kernels of a round launch with programmatic dependent launch (`launching`)
        self.pdl = pdl
        # a round's verification (target forward, acceptance, commit) compiled with static shapes, or
        # eager; without a drafter, the AR step (target forward, argmax, commit) likewise
        self.verify_compile = verify_compile
        with self.launching():  # inductor's kernels launch as ours do
            self.steps = RoundSteps.of(target.device, verify_compile)
        self.drafters = drafters or {}
        self.eos_ids = tuple(eos_ids)
        self.fault = parse_fault(fault) if isinstance(fault, str) or fault is None else fault
        if self.fault is not None and self.fault.kind is FaultKind.ACCEPT_UNVERIFIED and not self.drafters:
            raise ConfigError("fault 'accept-unverified' needs a drafter: AR decoding verifies nothing")
        self.use_graphs = cuda_graphs and target.device.type == "cuda"
        # Prefill lengths are padded to multiples of this (see `steps.prefill`); default: on CUDA,
        # where the first prefill of each new shape is slow.
        on_gpu = target.device.type == "cuda"
        self.prefill_bucket = (PREFILL_BUCKET if on_gpu else 0) if prefill_bucket is None else prefill_bucket
        if segment_tokens < 0:
            raise ConfigError(f"segment_tokens must be >= 0 (got {segment_tokens})")
        if segment_tokens and (not self.drafters or self.needs_host_tokens):
            raise ConfigError("segment admission rides in the verify forward: it needs a drafter that drafts on "
                              "the device (not AR, not n-gram)")
        # prompt tokens a prefilling row carries per round under continuous batching (`engine.segments`)
        self.segment_tokens = segment_tokens
        if attention_span < 0:
            raise ConfigError(f"attention_span must be >= 0 (got {attention_span})")
        # continuous batching (engine/serving.py): a round attends over the cache's first slots any
        # row can reach, rounded up to a multiple of this; 0 = the whole cache
        self.attention_span = attention_span
        settings = DrafterSettings(self.prefill_bucket, self.use_graphs, segment_tokens)
        first = next(iter(self.drafters.values()), None)
        for d in self.drafters.values():
            d.configure(settings)
            if d is not first:
                d.share_caches(first)
        # target layers whose outputs the drafter reads (DFlash); every tier drafts the same way
        self.feature_layers = tuple(first.feature_layers) if first is not None else ()
        self.workspaces: dict[tuple[int, int], Workspace] = {}  # (batch, capacity) -> workspace, oldest first
        self.max_workspaces = 4
        self.max_positions = target.rope_cos.shape[0]

    def launching(self):
        """The context every launch of a round runs in: with `pdl`, programmatic dependent launch
        (`kernels.launch.pdl_scope`); else what SPECPILOT_PDL says."""
        return launch.knob_scope(self.pdl)

    @property
    def speculative(self) -> bool:
        return bool(self.drafters)

    @property
    def needs_host_tokens(self) -> bool:
        """The drafter proposes from the committed tokens on the host: every round ends in a sync."""
        return any(d.needs_host_tokens for d in self.drafters.values())

    @property
    def tiers(self) -> list[int]:
        """The depth tiers, ascending ([0] for AR)."""
        return sorted(self.drafters) or [0]

    @property
    def row_drafter(self) -> Drafter:
        """The drafter whose state holds the rows (the first tier's: every tier shares it)."""
        return next(iter(self.drafters.values()))

    # ---- capacity and workspaces -------------------------------------------------------
    def slack(self) -> int:
        """Slots a workspace keeps past each row's committed length (module docstring)."""
        return max([2 + self.segment_tokens] + [d.slack() + 1 for d in self.drafters.values()])

    def capacity_for(self, prompt_len: int, max_new: int) -> int:
        need = prompt_len + max_new + self.slack()
        cap = _round_up(need, 256)
        if cap > self.max_positions:
            if need > self.max_positions:
                raise ConfigError(
                    f"prompt of {prompt_len} tokens + {max_new} new tokens exceeds the model's context "
                    f"of {self.max_positions} positions"
                )
            cap = need
        return cap

    def workspace(self, batch: int, capacity: int, max_new: int) -> Workspace:
        """The workspace of (batch, capacity), made (or remade, for a longer `max_new`) if needed."""
        key = (batch, capacity)
        ws = self.workspaces.get(key)
        if ws is not None and ws.state.accept_log.shape[1] >= max_new + 1:
            self.workspaces[key] = self.workspaces.pop(key)  # most recently used last
            return ws
        dev = self.target.device
        cache = self.target.new_cache(batch, capacity, nodes=self.slack())
        state = DecodeState.allocate(batch, capacity, max(max_new + 1, 64), dev)
        ws = Workspace(cache, state)
        self.workspaces.pop(key, None)
        self.workspaces[key] = ws
        while len(self.workspaces) > self.max_workspaces:  # graphs pin memory: keep a few, oldest out
            old = next(iter(self.workspaces))
            del self.workspaces[old]
            for d in self.drafters.values():
                d.release(old)
        return ws

    def filters(self, params: list[SamplingParams]) -> Filters | None:
        """The `Filters` of a run with these rows' parameters; None when none samples (greedy
        rounds). Refuses what sampled rounds do not support."""
        if all(p.greedy for p in params):
            return None
        if self.segment_tokens:
            raise ConfigError("sampling with segment admission (segment_tokens > 0) is not supported")
        if self.fault is not None and self.fault.kind is FaultKind.ACCEPT_UNVERIFIED:
            raise ConfigError("fault 'accept-unverified' breaks the greedy rule; under sampling inject "
                              "'sampling-rule:...', 'target-temperature:T' or 'target-top-p:P'")
        return Filters.of(params)

    # ---- setup -------------------------------------------------------------------------
    def prepare(self, ws: Workspace, spans: Sequence[int | None] = (None,),
                filters: Filters | None = None) -> TierPolicy:
        """Before a run's clock starts: with graphs, capture every tier's round at every attention
        span; in a new workspace, run every padded prefill shape once. The run's tier policy."""
        policy = TierPolicy.start(self.tiers)
        if self.use_graphs:
            for t in policy.tiers:
                for span in spans:
                    key = graph_key(t, span, filters)
                    if key not in ws.graphs:
                        ws.graphs[key] = self._capture(ws, t, span, filters)
        if not ws.prefill_warm:
            self._warm_prefill(ws, policy.tier)
            ws.prefill_warm = True
        return policy

    @_launching
    def prefill(self, ws: Workspace, prompts: list[list[int]]):
        """The target's prefill; the drafter's feature layers' outputs per row when it reads them."""
        if self.feature_layers:
            return prefill(self.target, ws.cache, prompts, bucket=self.prefill_bucket, capture=self.feature_layers)
        prefill(self.target, ws.cache, prompts, bucket=self.prefill_bucket)
        return None

    @_launching
    def start_drafter(self, tier: int, prompts: list[list[int]], state: DecodeState, features=None) -> None:
        """Start the tier's drafter (with the prefill's target features if it reads them) in the
        state's workspace; every tier then drafts from the state it keeps."""
        self.drafters[tier].start(prompts, state, features)

    @_launching
    def _warm_prefill(self, ws: Workspace, tier: int) -> None:
        """Run every padded prefill shape of this workspace once (up to WARM_PREFILL_TOKENS), target
        and drafter, so no request pays a shape's first-time cost inside its timing. One tier is
        enough: every tier drafts with the same draft model and state."""
        if self.prefill_bucket <= 0:
            return
        limit = min(ws.cache.capacity - self.slack() - 1, WARM_PREFILL_TOKENS)
        drafter = self.drafters.get(tier)
        for T in range(self.prefill_bucket, limit + 1, self.prefill_bucket):
            prompt = [[0] * (T + 1)]  # body of T tokens: one row, as prefill runs row by row
            features = self.prefill(ws, prompt)
            if drafter is not None:
                self.start_drafter(tier, prompt, ws.state, features)

    # ---- the round ---------------------------------------------------------------------
    def round(self, ws: Workspace, tier: int, host: list[list[int]] | None = None, span: int | None = None,
              filters: Filters | None = None):
        """One round of the tier's drafter (`host`: the rows' committed tokens, for a drafter that
        `needs_host_tokens`), replayed from its graph or eager; the `Acceptance` (None for AR).
        `span` and `filters` as in `step`."""
        host_tree = None
        if host is not None:
            t = self.drafters[tier].propose(ws.state, host)
            host_tree = (t.tokens, t.parents)
        if self.use_graphs:
            key = graph_key(tier, span, filters)
            g = ws.graphs.get(key)
            if g is None:
                g = ws.graphs[key] = self._capture(ws, tier, span, filters)
            return g(*host_tree) if host_tree is not None else g()
        tree = DraftTree(*host_tree, max_depth=self.drafters[tier].depth) if host_tree else None
        return self.step(ws, tier, tree, span, filters)

    @_launching
    def step(self, ws: Workspace, tier: int, tree: DraftTree | None = None, span: int | None = None,
             filters: Filters | None = None):
        """One round, eagerly (what a graph captures); with `tree`, that tree instead of the
        drafter's proposal. With `span`, the target attends over cache slots 0..span-1 only (every
        slot any row reads or writes this round must lie below it: the caller's bound); with
        `filters`, a sampled round by the workspace's `RowSampling` (`sampled_steps.py`)."""
        cache = ws.cache if span is None else ws.cache.span(span)
        if not self.speculative:
            if filters is not None:
                self.steps.sampled_ar(self.target, cache, ws.state, ws.rows(), filters, self.fault)
            else:
                self.steps.ar(self.target, cache, ws.state, self.fault)
            return None
        drafter = self.drafters[tier]
        if tree is None:
            tree = drafter.propose(ws.state)
        prefix = ws.state.cache_prefix().clone() if self.feature_layers else None  # the root's slot, before commit
        if filters is not None:
            acc = self.steps.sampled_verify(self.target, cache, ws.state, tree, ws.rows(), filters, self.fault,
                                            capture=self.feature_layers)
        elif not self.feature_layers:
            return self.steps.verify(self.target, cache, ws.state, tree, self.fault, segment=self.segment_tokens)
        else:
            acc = self.steps.verify(self.target, cache, ws.state, tree, self.fault, capture=self.feature_layers,
                                    segment=self.segment_tokens)
        if self.feature_layers:
            drafter.observe(acc, prefix)  # the accepted path's features, still inside the round
        return acc

    @_launching
    def _capture(self, ws: Workspace, tier: int, span: int | None = None,
                 filters: Filters | None = None) -> GraphedCallable:
        drafter = self.drafters.get(tier)
        B = ws.state.batch
        dummy = [[0, 0] for _ in range(B)]
        ws.state.reset(dummy, self.eos_ids, max_new=1 << 30)
        if drafter is not None:
            self.start_drafter(tier, dummy, ws.state)
        if drafter is not None and drafter.needs_host_tokens:
            N = drafter.num_nodes
            dev = ws.state.tokens.device
            tokens = torch.zeros(B, N, dtype=torch.int64, device=dev)
            parents = torch.zeros(B, N, dtype=torch.int64, device=dev)
            parents[:, 0] = -1

            def fn(tok, par):
                tree = DraftTree(tok, par, max_depth=drafter.depth)
                return self.step(ws, tier, tree, span, filters)

            return GraphedCallable(fn, static_inputs=(tokens, parents))
        return GraphedCallable(lambda: self.step(ws, tier, span=span, filters=filters))
