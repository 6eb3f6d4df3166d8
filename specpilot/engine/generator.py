"""The decode loop: prefill, then rounds of (draft, verify, commit) or plain AR steps.

Owns: workspaces (a KV cache + decoding state per batch size and capacity, reused across
requests so captured CUDA graphs stay valid), graph capture, adaptive depth tiers, the host loop
with its single sync point, timing, and turning device state into `GenerationResult`s.

Sampling: `generate(..., sampling=...)` takes per-row `SamplingParams`. A batch with no sampled
row (None, or every row at temperature 0) runs the greedy rounds (`steps.py`) exactly as before;
otherwise every round is a sampled one (`sampled_steps.py`, with the rows' parameters in the
workspace's `RowSampling` and a graph of its own per `Filters`), greedy rows in it included.

Does not own what a round computes (`steps.py`, `drafters/`) or how models are loaded
(`session.py`).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field

import torch

from specpilot.engine.drafters.base import Drafter
from specpilot.engine.faults import Fault, FaultKind, parse_fault
from specpilot.engine.graphs import GraphedCallable
from specpilot.engine.packed_prefill import PackingCache
from specpilot.engine.row_sampling import Filters, RowSampling
from specpilot.engine.sampled_steps import sampled_ar_step, sampled_verify_step
from specpilot.engine.sampling import SamplingParams
from specpilot.engine.state import DecodeState, extract_outputs
from specpilot.engine.steps import ar_step, prefill, verify_step
from specpilot.engine.tree import DraftTree
from specpilot.errors import ConfigError
from specpilot.kernels import launch
from specpilot.models import ops
from specpilot.models.transformer import Transformer


PREFILL_BUCKET = 64  # prefill lengths are padded to multiples of this on CUDA
WARM_PREFILL_TOKENS = 1024  # a new workspace runs each padded prefill shape up to this once


@dataclass
class GenerationResult:
    outputs: list[list[int]]  # generated tokens per row (EOS kept, cut at max_new)
    rounds: list[int]  # target forwards per row
    accept_lengths: list[list[int]]  # tokens committed per round (accepted drafts + 1), per row
    seconds: float  # wall time, prefill included
    prefill_seconds: float = 0.0
    extra: dict = field(default_factory=dict)
    # The same two spans by CUDA events on the device's stream (NaN on CPU): what the GPU did, free
    # of the host clock's jitter; a trusted timer compares them with the wall times above.
    gpu_seconds: float = float("nan")
    gpu_prefill_seconds: float = float("nan")

    @property
    def decode_seconds(self) -> float:
        """Decode time after prefill: by CUDA events where they exist, else by the wall clock."""
        if self.gpu_seconds == self.gpu_seconds:
            return self.gpu_seconds - self.gpu_prefill_seconds
        return self.seconds - self.prefill_seconds

    @property
    def num_tokens(self) -> int:
        return sum(len(o) for o in self.outputs)

    @property
    def tokens_per_second(self) -> float:
        return self.num_tokens / self.seconds if self.seconds > 0 else float("nan")

    @property
    def mean_accepted_length(self) -> float:
        """Tokens committed per target forward (accepted drafts + bonus), over all rows."""
        rounds = sum(self.rounds)
        return self.num_tokens / rounds if rounds else float("nan")


@dataclass
class Workspace:
    cache: object  # the target's decode cache (`new_cache`: a KVCache, or a hybrid decoder's)
    state: DecodeState
    graphs: dict = field(default_factory=dict)  # tier depth (or 0 for AR) -> GraphedCallable
    prefill_warm: bool = False  # every padded prefill shape has run once (`Generator._warm_prefill`)
    packing: PackingCache | None = None  # continuous batching's packed prefill cache (`engine.packed_prefill`)
    sampling: RowSampling | None = None  # the rows' sampling parameters, allocated by the first sampled batch

    def rows(self) -> RowSampling:
        """The workspace's `RowSampling` (allocated once: captured graphs keep pointing at it)."""
        if self.sampling is None:
            self.sampling = RowSampling.allocate(self.state.batch, self.state.tokens.device)
        return self.sampling


def _launching(method):
    """`method` of a Generator run inside its `launching()` context."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with self.launching():
            return method(self, *args, **kwargs)
    return run


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


class Generator:
    """Greedy generation with an optional drafter (None = AR).

    `drafters` maps a depth tier to its drafter (one entry unless adaptive depth is on); all tiers
    share the draft model and its cache.
    """

    def __init__(
        self,
        target: Transformer,
        drafters: dict[int, Drafter] | None = None,
        eos_ids: tuple[int, ...] = (),
        cuda_graphs: bool = True,
        sync_every: int = 1,
        fault: Fault | str | None = None,
        prefill_bucket: int | None = None,
        segment_tokens: int = 0,
        attention_span: int = 0,
        verify_compile: bool = False,
        pdl: bool = False,
    ):
        self.target = target
        # the kernels this generator launches use programmatic dependent launch (`launching`)
        self.pdl = pdl
        # a round's verification (target forward, acceptance, commit) compiled with static shapes, or
        # eager; without a drafter, the AR step (target forward, argmax, commit) likewise
        self.verify_compile = verify_compile
        with self.launching():  # inductor's kernels launch as ours do
            self._verify = ops.compiled_static(verify_step, target.device) if verify_compile else verify_step
            self._ar_step = ops.compiled_static(ar_step, target.device) if verify_compile else ar_step
            self._sampled_verify = (ops.compiled_static(sampled_verify_step, target.device) if verify_compile
                                    else sampled_verify_step)
            self._sampled_ar_step = (ops.compiled_static(sampled_ar_step, target.device) if verify_compile
                                     else sampled_ar_step)
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
        for d in self.drafters.values():
            if hasattr(d, "prefill_bucket"):
                d.prefill_bucket = self.prefill_bucket
            if hasattr(d, "prefill_graphs"):
                d.prefill_graphs = self.use_graphs
        host = any(d.needs_host_tokens for d in self.drafters.values())
        if segment_tokens < 0:
            raise ConfigError(f"segment_tokens must be >= 0 (got {segment_tokens})")
        if segment_tokens and (not self.drafters or host):
            raise ConfigError("segment admission rides in the verify forward: it needs a drafter that drafts on "
                              "the device (not AR, not n-gram)")
        for d in self.drafters.values():
            d.segment_tokens = segment_tokens
        # prompt tokens a prefilling row carries per round under continuous batching (`engine.segments`)
        self.segment_tokens = segment_tokens
        if attention_span < 0:
            raise ConfigError(f"attention_span must be >= 0 (got {attention_span})")
        # continuous batching (engine/serving.py): a round attends over the cache's first slots any
        # row can reach, rounded up to a multiple of this; 0 = the whole cache
        self.attention_span = attention_span
        self.sync_every = 1 if host else sync_every
        # target layers whose outputs the drafter reads (DFlash); every tier drafts the same way
        self.feature_layers = tuple(next(iter(self.drafters.values())).feature_layers) if self.drafters else ()
        self.workspaces: dict[tuple[int, int], Workspace] = {}  # (batch, capacity) -> workspace, oldest first
        self.max_workspaces = 4
        self.max_positions = target.rope_cos.shape[0]

    # ---- setup -------------------------------------------------------------------------
    def launching(self):
        """The context every launch of this generator runs in: with `pdl`, programmatic dependent
        launch (`kernels.launch.pdl_scope`); else what SPECPILOT_PDL says."""
        return launch.knob_scope(self.pdl)

    @property
    def speculative(self) -> bool:
        return bool(self.drafters)

    def _slack(self) -> int:
        slack = 2 + self.segment_tokens
        for d in self.drafters.values():
            slack = max(slack, d.num_nodes + 1, getattr(d, "num_candidates", 0) + getattr(d, "window", 0) + 1,
                        getattr(d, "block_size", 0) + 1)
        return slack

    def capacity_for(self, prompt_len: int, max_new: int) -> int:
        need = prompt_len + max_new + self._slack()
        cap = _round_up(need, 256)
        if cap > self.max_positions:
            if need > self.max_positions:
                raise ConfigError(
                    f"prompt of {prompt_len} tokens + {max_new} new tokens exceeds the model's context "
                    f"of {self.max_positions} positions"
                )
            cap = need
        return cap

    def _workspace(self, batch: int, capacity: int, max_new: int) -> Workspace:
        key = (batch, capacity)
        ws = self.workspaces.get(key)
        if ws is not None and ws.state.accept_log.shape[1] >= max_new + 1:
            self.workspaces[key] = self.workspaces.pop(key)  # most recently used last
            return ws
        dev = self.target.device
        cache = self.target.new_cache(batch, capacity, nodes=self._slack())
        state = DecodeState.allocate(batch, capacity, max(max_new + 1, 64), dev)
        ws = Workspace(cache, state)
        self.workspaces.pop(key, None)
        self.workspaces[key] = ws
        while len(self.workspaces) > self.max_workspaces:  # graphs pin memory: keep a few, oldest out
            old = next(iter(self.workspaces))
            del self.workspaces[old]
            for d in self.drafters.values():
                if hasattr(d, "release"):
                    d.release(old)
        return ws

    # ---- rounds ------------------------------------------------------------------------
    @_launching
    def _round(self, ws: Workspace, tier: int, tree: DraftTree | None = None, span: int | None = None,
               filters: Filters | None = None):
        """One round; with `span`, the target attends over cache slots 0..span-1 only (every slot
        any row reads or writes this round must lie below it: the caller's bound); with `filters`,
        a sampled round by the workspace's `RowSampling` (`sampled_steps.py`)."""
        cache = ws.cache if span is None else ws.cache.span(span)
        if not self.speculative:
            if filters is not None:
                self._sampled_ar_step(self.target, cache, ws.state, ws.rows(), filters, self.fault)
            else:
                self._ar_step(self.target, cache, ws.state, self.fault)
            return None
        drafter = self.drafters[tier]
        if tree is None:
            tree = drafter.propose(ws.state)
        prefix = ws.state.cache_prefix().clone() if self.feature_layers else None  # the root's slot, before commit
        if filters is not None:
            acc = self._sampled_verify(self.target, cache, ws.state, tree, ws.rows(), filters, self.fault,
                                       capture=self.feature_layers)
        elif not self.feature_layers:
            return self._verify(self.target, cache, ws.state, tree, self.fault, segment=self.segment_tokens)
        else:
            acc = self._verify(self.target, cache, ws.state, tree, self.fault, capture=self.feature_layers,
                               segment=self.segment_tokens)
        if self.feature_layers:
            drafter.observe(acc, prefix)  # the accepted path's features, still inside the round
        return acc

    @staticmethod
    def _graph_key(tier: int, span: int | None, filters: Filters | None):
        key = tier if span is None else (tier, span)
        return key if filters is None else ("sampled", filters, key)

    def _graphed_round(self, ws: Workspace, tier: int, host_tree: tuple | None, span: int | None = None,
                       filters: Filters | None = None):
        key = self._graph_key(tier, span, filters)
        g = ws.graphs.get(key)
        if g is None:
            g = self._capture(ws, tier, span, filters)
            ws.graphs[key] = g
        return g(*host_tree) if host_tree is not None else g()

    @_launching
    def _capture(self, ws: Workspace, tier: int, span: int | None = None,
                 filters: Filters | None = None) -> GraphedCallable:
        drafter = self.drafters.get(tier)
        B = ws.state.batch
        dummy = [[0, 0] for _ in range(B)]
        ws.state.reset(dummy, self.eos_ids, max_new=1 << 30)
        if drafter is not None:
            self._start_drafter(tier, dummy, ws.state)
        if drafter is not None and drafter.needs_host_tokens:
            N = drafter.num_nodes
            dev = ws.state.tokens.device
            tokens = torch.zeros(B, N, dtype=torch.int64, device=dev)
            parents = torch.zeros(B, N, dtype=torch.int64, device=dev)
            parents[:, 0] = -1

            def fn(tok, par):
                tree = DraftTree(tok, par, max_depth=drafter.depth)
                return self._round(ws, tier, tree, span, filters)

            return GraphedCallable(fn, static_inputs=(tokens, parents))
        return GraphedCallable(lambda: self._round(ws, tier, span=span, filters=filters))

    @_launching
    def _warm_prefill(self, ws: Workspace, tier: int) -> None:
        """Run every padded prefill shape of this workspace once (up to WARM_PREFILL_TOKENS), target
        and drafter, so no request pays a shape's first-time cost inside its timing. One tier is
        enough: every tier drafts with the same draft model and cache (`_start_drafter`)."""
        if self.prefill_bucket <= 0:
            return
        limit = min(ws.cache.capacity - self._slack() - 1, WARM_PREFILL_TOKENS)
        drafter = self.drafters.get(tier)
        for T in range(self.prefill_bucket, limit + 1, self.prefill_bucket):
            prompt = [[0] * (T + 1)]  # body of T tokens: one row, as prefill runs row by row
            features = self._prefill(ws, prompt)
            if drafter is not None:
                self._start_drafter(tier, prompt, ws.state, features)

    # ---- the loop ----------------------------------------------------------------------
    @torch.inference_mode()
    @_launching
    def generate(self, prompts: list[list[int]], max_new_tokens: int, stop_at_eos: bool = True,
                 sampling: SamplingParams | list[SamplingParams] | None = None) -> GenerationResult:
        """Tokens for every prompt: up to `max_new_tokens` each, fewer where a row emits EOS,
        unless `stop_at_eos` is False (fixed-length runs, e.g. benchmarks: every row gets exactly
        `max_new_tokens`). Greedy unless `sampling` (one `SamplingParams` for every row, or one per
        row) samples some row: then each row samples by its own parameters and seed, exactly from
        the target's processed distribution on every path (module docstring)."""
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ConfigError("every prompt needs at least one token")
        if max_new_tokens < 1:
            raise ConfigError("max_new_tokens must be >= 1")
        B = len(prompts)
        params = self._row_params(sampling, B)
        filters = Filters.of(params) if params is not None else None
        capacity = self.capacity_for(max(len(p) for p in prompts), max_new_tokens)
        ws = self._workspace(B, capacity, max_new_tokens)
        if params is not None:
            ws.rows().load(params)
        tiers = sorted(self.drafters) or [0]
        tier = tiers[0] if len(tiers) == 1 else self._initial_tier(tiers)
        if self.use_graphs:
            for t in tiers:  # capture before timing starts
                key = self._graph_key(t, None, filters)
                if key not in ws.graphs:
                    ws.graphs[key] = self._capture(ws, t, filters=filters)
        if not ws.prefill_warm:  # new workspace: every padded prefill shape once, before timing starts
            self._warm_prefill(ws, tier)
            ws.prefill_warm = True
        dev = self.target.device
        sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
        events = [torch.cuda.Event(enable_timing=True) for _ in range(3)] if dev.type == "cuda" else None
        sync()
        t0 = time.perf_counter()
        if events:
            events[0].record()
        eos_ids = self.eos_ids if stop_at_eos else ()
        ws.state.reset(prompts, eos_ids, max_new_tokens)
        features = self._prefill(ws, prompts)
        if self.speculative:
            self._start_drafter(tier, prompts, ws.state, features)
        if events:
            events[1].record()
        sync()
        t_prefill = time.perf_counter() - t0
        needs_host = self.speculative and self.drafters[tier].needs_host_tokens
        host = [list(p) for p in prompts] if needs_host else None
        recent: list[float] = []
        for r in range(max_new_tokens + 1):
            host_tree = None
            if needs_host:
                t = self.drafters[tier].propose(ws.state, host)
                host_tree = (t.tokens, t.parents)
            if self.use_graphs:
                acc = self._graphed_round(ws, tier, host_tree, filters=filters)
            else:
                tree = DraftTree(*host_tree, max_depth=self.drafters[tier].depth) if host_tree else None
                acc = self._round(ws, tier, tree, filters=filters)
            if (r + 1) % self.sync_every:
                continue
            # ---- the one host sync of the loop ----
            if host is not None:
                counts = (acc.accept_len + 1).tolist()
                new = acc.new_tokens.tolist()
                for b in range(B):
                    host[b].extend(new[b][: counts[b]])
            if len(tiers) > 1:
                recent.append(float(acc.accept_len.float().mean()))
                tier = self._next_tier(tiers, tier, recent)
            if bool(ws.state.done.all()):
                break
        if events:
            events[2].record()
        sync()
        seconds = time.perf_counter() - t0
        result = self._result(ws, max_new_tokens, seconds, t_prefill, eos_ids)
        if events:
            result.gpu_seconds = events[0].elapsed_time(events[2]) / 1e3
            result.gpu_prefill_seconds = events[0].elapsed_time(events[1]) / 1e3
        return result

    def _row_params(self, sampling, batch: int) -> list[SamplingParams] | None:
        """Per-row parameters of a batch that samples some row; None for an all-greedy batch."""
        if sampling is None:
            return None
        params = [sampling] * batch if isinstance(sampling, SamplingParams) else list(sampling)
        if len(params) != batch:
            raise ConfigError(f"{len(params)} sampling parameters for {batch} prompts")
        return params if self._row_params_filters(params) is not None else None

    def _row_params_filters(self, params: list[SamplingParams]) -> Filters | None:
        """The `Filters` of a run with these requests' parameters; None when none samples. Refuses
        what sampled rounds do not support."""
        if all(p.greedy for p in params):
            return None
        if self.segment_tokens:
            raise ConfigError("sampling with segment admission (segment_tokens > 0) is not supported")
        if self.fault is not None and self.fault.kind is FaultKind.ACCEPT_UNVERIFIED:
            raise ConfigError("fault 'accept-unverified' breaks the greedy rule; under sampling inject "
                              "'sampling-rule:...', 'target-temperature:T' or 'target-top-p:P'")
        return Filters.of(params)

    @_launching
    def _prefill(self, ws: Workspace, prompts: list[list[int]]):
        """The target's prefill; the drafter's feature layers' outputs per row when it reads them."""
        if self.feature_layers:
            return prefill(self.target, ws.cache, prompts, bucket=self.prefill_bucket, capture=self.feature_layers)
        prefill(self.target, ws.cache, prompts, bucket=self.prefill_bucket)
        return None

    @_launching
    def _start_drafter(self, tier: int, prompts: list[list[int]], state: DecodeState, features=None) -> None:
        """Start the tier's drafter (with the prefill's target features if it reads them); every
        tier then shares its draft cache."""
        drafter = self.drafters[tier]
        if self.feature_layers:
            drafter.start(prompts, state, features)
        else:
            drafter.start(prompts, state)
        for other in self.drafters.values():
            if other is not drafter and hasattr(other, "caches"):
                other.caches, other.cache = drafter.caches, drafter.cache

    def _initial_tier(self, tiers: list[int]) -> int:
        return tiers[len(tiers) // 2]

    @staticmethod
    def _next_tier(tiers: list[int], tier: int, recent: list[float], window: int = 4) -> int:
        """Deeper when recent rounds accept nearly everything, shallower when they accept little."""
        if len(recent) < window:
            return tier
        mean = sum(recent[-window:]) / window
        i = tiers.index(tier)
        if mean >= 0.8 * tier and i + 1 < len(tiers):
            recent.clear()
            return tiers[i + 1]
        if mean < 0.4 * tier and i > 0:
            recent.clear()
            return tiers[i - 1]
        return tier

    def _result(self, ws: Workspace, max_new: int, seconds: float, t_prefill: float,
                eos_ids: tuple[int, ...]) -> GenerationResult:
        outputs = extract_outputs(ws.state, eos_ids, max_new)
        rounds = ws.state.rounds.tolist()
        log = ws.state.accept_log.tolist()
        accept = [row[:n] for row, n in zip(log, rounds)]
        return GenerationResult(outputs, rounds, accept, seconds, t_prefill)
