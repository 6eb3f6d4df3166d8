"""Continuous batching: a queue of requests served by B decode slots, AR or speculative.

Owns: admission (at the host sync, a waiting request that has arrived takes a free slot: its prompt
goes into that row of the shared target cache, and of the drafter's own state, in chunks of at
most `prefill_chunk` prompt tokens per sync over all admitted rows, the chunks of one sync packed
into one forward, `engine.packed_prefill`), retirement (a row that emitted
EOS or reached its request's max_new leaves at the next sync with its output read back, and its
slot takes the next request at once), per-request timing, and the loop with its one host sync.

Reuses the generator's round with its workspaces and CUDA graphs (`round.Rounds`, through public
names only) as they are: a round decodes all B rows at their own positions and depths, since every
per-row quantity (cache prefix, tree slots and mask, the draft model's catch-up window, DFlash's
block and context) is indexed by row; nothing in a round knows about requests. B is fixed, so the
round stays one captured graph.

Row life cycle. A row that no request decodes is `done`: the round still computes it (static
shapes), `commit_tokens` leaves it alone, and what the round writes is never read:
- *idle* (no request): seq_len 1; rounds write at the first few slots of its caches, which the next
  request's prefill and rounds overwrite before anything reads them.
- *prefilling*: tokens and seq_len L are the request's prompt; rounds write the target cache and
  DFlash context at slots >= L - 1 (the root's slot and past it: rewritten by the request's first
  round before being read) and the draft model's catch-up window [L - W, L), whose entries are
  right once the prompt before it is in (the window's own tokens are the prompt's) and otherwise
  lie past the prefilled part, where a later chunk overwrites them. So a prompt's chunks may be
  spread over several rounds while the other rows decode.
- *decoding*: `done` cleared after the last chunk; from then on the row is exactly a
  single-request decode (what tests/engine/test_serving.py checks, token for token).
- *by segments* (`segment_tokens` > 0, a request admitted while other rows decode and whose
  prompt costs less that way, `by_segments`): seq_len 1 and active at once; the rounds carry its
  prompt, `segment_tokens` per round, and turn it into a decoding row on the device
  (`engine.segments`).

Sampling: a request may carry `SamplingParams`; when any request of a run samples, every round
of the run is a sampled one (`sampled_steps.py`), each row by the parameters and seed of the
request it holds (loaded at admission into the workspace's `RowSampling`; idle rows greedy). The
uniforms of a row are keyed by its own seed and emitted count, so a request's tokens do not depend
on the slot it lands in or on its neighbours. Segment admission is refused with sampling.

Does not own what a round computes (`steps.py`, `drafters/`) or the serving benchmark
(`specpilot.bench.serving`).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import torch

from specpilot.engine.generator import Generator
from specpilot.engine.packed_prefill import PACK_ROWS, Chunk, PackingCache, packed_forward
from specpilot.engine.packed_prefill import warm as warm_packed
from specpilot.engine.round import TierPolicy, Workspace
from specpilot.engine.row_sampling import Filters
from specpilot.engine.sampling import SamplingParams
from specpilot.engine.state import cut_output
from specpilot.engine.steps import prefill_chunk
from specpilot.errors import ConfigError

PREFILL_CHUNK = 512  # prompt tokens prefilled per host sync, over all admitted rows


@dataclass(frozen=True)
class Request:
    prompt: tuple[int, ...]
    max_new: int
    # seconds after the start of `ServingEngine.run` at which it arrives and queues; None: a
    # closed-loop client's request, sent when a slot is free and timed from its admission
    arrival: float | None = None
    sampling: SamplingParams | None = None  # None: greedy


@dataclass(frozen=True)
class RequestResult:
    """One request's tokens and timeline, in seconds from the start of the run."""

    output: list[int]  # generated tokens (EOS kept, cut at max_new)
    slot: int  # the row that decoded it
    rounds: int  # rounds the request decoded in (target forwards)
    accept_lengths: list[int]  # tokens committed per round
    arrival: float  # (its admission in a closed loop)
    admitted: float  # took a slot
    first_token: float  # the sync after its first round
    finished: float  # the sync that saw it done
    by_segment: bool = False  # its prompt rode in the rounds (segment admission)

    @property
    def latency(self) -> float:
        """End to end: arrival to the sync that returned its last token (queueing included)."""
        return self.finished - self.arrival

    @property
    def time_to_first_token(self) -> float:
        return self.first_token - self.arrival

    @property
    def time_per_output_token(self) -> float:
        """(finished - first token) / (tokens - 1); NaN for a one-token output."""
        n = len(self.output)
        return (self.finished - self.first_token) / (n - 1) if n > 1 else float("nan")


@dataclass
class ServingResult:
    requests: list[RequestResult]  # in the order of the requests given
    seconds: float  # first admission to the last request's return
    rounds: int  # decode rounds of the whole batch
    extra: dict = field(default_factory=dict)
    # Saturated: the stretches between two host syncs that began with an arrived request waiting,
    # so with every slot taken (a server at its concurrency; the first stretch, the initial
    # prefills, left out): their seconds and the output tokens committed in them.
    saturated_seconds: float = 0.0
    saturated_tokens: int = 0

    @property
    def tokens(self) -> int:
        return sum(len(r.output) for r in self.requests)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("nan")

    @property
    def mean_accepted_length(self) -> float:
        rounds = sum(r.rounds for r in self.requests)
        return self.tokens / rounds if rounds else float("nan")


@dataclass
class _Slot:
    index: int  # the request's position in `run`'s list
    admitted: float
    prefilled: int = 0  # prompt body tokens in the caches (chunk prefill)
    decoding: bool = False  # active in the rounds (by segments: from its admission on)
    by_segment: bool = False  # admitted by segment admission
    first_token: float | None = None


def by_segments(prompt_len: int, segment_tokens: int, running: int) -> bool:
    """Admit a prompt by segments when that costs the batch less than a chunk prefill would.

    A chunk prefill stalls the `running` decoding rows for one forward over the prompt, which reads
    every weight at least once, so it costs them at least one round each: >= `running` row-rounds.
    By segments the new row alone spends about prompt_len / (segment_tokens + 1) rounds in its
    prompt. With no row decoding a chunk stalls no one, and a long prompt is cheaper in chunks.
    """
    if segment_tokens < 1 or prompt_len < 2 or running < 1:
        return False
    return (prompt_len - 1) / (segment_tokens + 1) < running


class ServingEngine:
    """Continuous batching over one `Generator` (its target, drafters, graphs) with `slots` rows.

    `reserve(prompt_len, max_new)` fixes the smallest workspace envelope of later runs, so runs of
    differing requests (a benchmark's units, its warm-up) share one workspace and its graphs.
    """

    def __init__(self, generator: Generator, slots: int, prefill_chunk: int = PREFILL_CHUNK,
                 always_segments: bool = False):
        if slots < 1:
            raise ConfigError(f"serving needs at least one slot (got {slots})")
        if prefill_chunk < 1:
            raise ConfigError(f"prefill_chunk must be >= 1 (got {prefill_chunk})")
        self.generator = generator
        self.rounds = generator.rounds  # the round every run runs
        self.slots = slots
        self.prefill_chunk = prefill_chunk
        # with the generator's segment_tokens: every prompt admitted while rows decode goes in by
        # segments, not only those `by_segments` finds cheaper (tests, measurements of the rule)
        self.always_segments = always_segments
        self._envelope = (0, 1)  # (capacity, max_new) at least

    def reserve(self, prompt_len: int, max_new: int) -> None:
        capacity = self.rounds.capacity_for(prompt_len, max_new)
        self._envelope = (max(self._envelope[0], capacity), max(self._envelope[1], max_new))

    # ---- setup -------------------------------------------------------------------------
    def _filters(self, requests: list[Request]) -> Filters | None:
        """The run's sampling stages; None when no request samples (the greedy rounds)."""
        params = [r.sampling or SamplingParams() for r in requests]
        return self.rounds.filters(params)

    def _prepare(self, requests: list[Request], eos_ids: tuple[int, ...],
                 filters: Filters | None = None) -> tuple[Workspace, TierPolicy]:
        rounds = self.rounds
        for r in requests:
            if not r.prompt:
                raise ConfigError("every prompt needs at least one token")
            if r.max_new < 1:
                raise ConfigError("max_new must be >= 1")
        capacity = max([self._envelope[0]] + [rounds.capacity_for(len(r.prompt), r.max_new) for r in requests])
        max_new = max([self._envelope[1]] + [r.max_new for r in requests])
        ws = rounds.workspace(self.slots, capacity, max_new)
        # before the clock starts: every tier's graph at every attention span, the prefill shapes
        policy = rounds.prepare(ws, self._spans(ws), filters)
        idle = [[0]] * self.slots
        ws.state.reset(idle, eos_ids, max_new=1)
        ws.state.done.fill_(True)
        if filters is not None:
            ws.rows().load([SamplingParams()] * self.slots)
        if rounds.speculative:
            rounds.start_drafter(policy.tier, idle, ws.state)  # binds the draft state; rows fill on admission
        if ws.packing is None and ws.cache.packable:  # packed prefill: its cache, every packed length run once
            ws.packing = PackingCache(ws.cache, min(self.slots, PACK_ROWS), rounds.prefill_bucket, rounds.use_graphs)
            limit = min(self.prefill_chunk, ws.cache.capacity)
            warm_packed(rounds.target, ws.cache, ws.packing, rounds.prefill_bucket, limit, 0, rounds.feature_layers)
            if rounds.speculative:
                rounds.row_drafter.warm_rows(limit)
        return ws, policy

    def _spans(self, ws: Workspace) -> list[int | None]:
        """The attention spans a round may use: multiples of the generator's `attention_span`
        below the cache's capacity, and None (the whole cache)."""
        step, cap = self.rounds.attention_span, ws.cache.capacity
        return (list(range(step, cap, step)) if step else []) + [None]

    def _span(self, ws: Workspace, reach: list[int], rounds: int) -> int | None:
        """The smallest span that holds every slot any row can read or write in the next `rounds`
        rounds: each row's furthest known length (`reach`) plus, per round and once more for the
        last round's tree, the generator's slack (at least a round's growth and its nodes)."""
        step = self.rounds.attention_span
        if not step:
            return None
        need = max(reach) + (rounds + 1) * self.rounds.slack()
        span = -(-need // step) * step
        return span if span < ws.cache.capacity else None

    # ---- admission ---------------------------------------------------------------------
    def _prefill(self, ws: Workspace, b: int, prompt: tuple[int, ...], start: int, n: int) -> None:
        """Prompt body tokens start..start+n-1 of row b into the target cache and the drafter."""
        self._prefill_chunks(ws, [Chunk(b, tuple(prompt[start : start + n]), start)])

    def _prefill_chunks(self, ws: Workspace, chunks: list[Chunk]) -> None:
        """One sync's prompt chunks into the target cache (packed, `PACK_ROWS` to a forward) and the
        drafters (a chunk without tokens only begins its row in the drafters, at start 0)."""
        rounds = self.rounds
        full = [i for i, c in enumerate(chunks) if c.tokens]
        features: list = [None] * len(chunks)
        if not ws.cache.packable:  # recurrent layers: each chunk continues its own row's state
            for i in full:
                c = chunks[i]
                features[i] = prefill_chunk(rounds.target, ws.cache.row(c.row), list(c.tokens), c.start,
                                            rounds.prefill_bucket, rounds.feature_layers)
            full = []
        for j in range(0, len(full), PACK_ROWS):
            group = full[j : j + PACK_ROWS]
            out = packed_forward(rounds.target, ws.cache, ws.packing, [chunks[i] for i in group],
                                 rounds.prefill_bucket, rounds.feature_layers)
            if out is not None:
                for i, f in zip(group, out):
                    features[i] = f
        if rounds.speculative:
            todo = [i for i, c in enumerate(chunks) if c.tokens or c.start == 0]
            rounds.row_drafter.prefill_rows([chunks[i] for i in todo], ws.state, [features[i] for i in todo])

    def _advance_prefill(self, ws: Workspace, slots: list[_Slot | None], requests: list[Request]) -> list[int]:
        """Spend up to `prefill_chunk` prompt tokens on prefilling rows, oldest admission first, in
        one packed prefill; the rows whose prompt is now in (their `done` cleared)."""
        budget = self.prefill_chunk
        chunks, started = [], []
        for b in sorted((b for b, s in enumerate(slots) if s and not s.decoding), key=lambda b: slots[b].admitted):
            s = slots[b]
            prompt = requests[s.index].prompt
            body = len(prompt) - 1
            if body == 0:
                chunks.append(Chunk(b, (), 0))  # a one-token prompt still starts the drafter's row
            elif s.prefilled < body and budget > 0:
                n = min(budget, body - s.prefilled)
                chunks.append(Chunk(b, tuple(prompt[s.prefilled : s.prefilled + n]), s.prefilled))
                s.prefilled += n
                budget -= n
            if s.prefilled == body:
                started.append(b)
            if budget <= 0:
                break
        if chunks:
            self._prefill_chunks(ws, chunks)
        for b in started:
            ws.state.done[b] = False
            slots[b].decoding = True
        return started

    def _admit_by_segments(self, ws: Workspace, b: int, prompt: tuple[int, ...]) -> None:
        """Start row b with one committed token, active at once: the rounds prefill the rest of its
        prompt, `segment_tokens` tokens per round (`engine.segments`)."""
        self._prefill(ws, b, prompt, 0, 0)  # begins the drafter's row, empty
        ws.state.seq_lens[b] = 1
        ws.state.done[b] = False

    def _idle(self, ws: Workspace, b: int) -> None:
        st = ws.state
        st.seq_lens[b] = 1
        st.prompt_lens[b] = 1
        st.done[b] = True

    # ---- the loop ----------------------------------------------------------------------
    @torch.inference_mode()
    def run(self, requests: list[Request], stop_at_eos: bool = True) -> ServingResult:
        """Serve every request (admitted in the given order, once its arrival time has passed);
        each gets exactly the tokens a single-request greedy decode would give it."""
        if not requests:
            raise ConfigError("no requests to serve")
        with self.generator.launching():  # packed prefills too launch as the generator's rounds do
            return self._run(requests, stop_at_eos)

    def _run(self, requests: list[Request], stop_at_eos: bool) -> ServingResult:
        rounds = self.rounds
        eos_ids = rounds.eos_ids if stop_at_eos else ()
        filters = self._filters(requests)
        ws, policy = self._prepare(requests, eos_ids, filters)
        st = ws.state
        B = self.slots
        dev = rounds.target.device
        needs_host = rounds.needs_host_tokens
        sync_every = self.generator.sync_every
        host = [[0] for _ in range(B)] if needs_host else None
        queue = deque(sorted(range(len(requests)), key=lambda i: requests[i].arrival or 0.0))
        slots: list[_Slot | None] = [None] * B
        results: list[RequestResult | None] = [None] * len(requests)
        rounds_run = 0
        reach = [1] * B  # per slot, the furthest length the host knows its row has or will have
        spans: dict[str, int] = {}  # rounds per attention span ("all": the whole cache)
        retired = 0  # output tokens of the requests retired so far
        last_sync: tuple[float, int] | None = None  # (time, output tokens committed) at the last host sync
        sat_seconds, sat_tokens = 0.0, 0
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        now = 0.0
        while True:
            running = sum(1 for s in slots if s is not None and s.decoding)
            for b in range(B):  # admission: free slots take the requests that have arrived
                if slots[b] is None and queue and (requests[queue[0]].arrival or 0.0) <= now:
                    i = queue.popleft()
                    slots[b] = _Slot(i, admitted=now)
                    st.load_row(b, list(requests[i].prompt), requests[i].max_new)
                    if filters is not None:
                        ws.rows().load_row(b, requests[i].sampling or SamplingParams())
                    if host is not None:
                        host[b] = list(requests[i].prompt)
                    n = len(requests[i].prompt)
                    reach[b] = n  # its prompt: by chunks before it decodes, or by segments inside rounds
                    if by_segments(n, rounds.segment_tokens, running) or (
                            self.always_segments and rounds.segment_tokens and running and n > 1):
                        self._admit_by_segments(ws, b, requests[i].prompt)
                        slots[b].decoding = slots[b].by_segment = True
            # an arrived request still waits after admission: every slot is taken
            saturated = last_sync is not None and bool(queue) and (requests[queue[0]].arrival or 0.0) <= now
            self._advance_prefill(ws, slots, requests)
            if all(s is None for s in slots):
                if not queue:
                    break
                time.sleep(max(0.0, (requests[queue[0]].arrival or 0.0) - (time.perf_counter() - t0)))
                now = time.perf_counter() - t0
                continue
            decoding = [b for b, s in enumerate(slots) if s and s.decoding]
            acc = None
            if decoding:
                span = self._span(ws, reach, sync_every)
                key = str(span or "all")
                spans[key] = spans.get(key, 0) + sync_every
                for _ in range(sync_every):
                    acc = rounds.round(ws, policy.tier, host, span, filters)
                    rounds_run += 1
            # ---- the one host sync of the loop ----
            packed = [st.done.long(), st.seq_lens, st.rounds]
            if acc is not None:
                packed += [acc.accept_len, acc.new_tokens.T] if needs_host else [acc.accept_len]
            fields = torch.cat([t.reshape(-1, B) for t in packed]).tolist()
            now = time.perf_counter() - t0
            done, lens, row_rounds = fields[0], fields[1], fields[2]
            for b in decoding:
                reach[b] = max(reach[b], lens[b])
            if host is not None and acc is not None:
                counts = fields[3]
                for b in decoding:
                    host[b].extend(int(fields[4 + j][b]) for j in range(counts[b] + 1))
            live = [b for b in decoding if lens[b] > len(requests[slots[b].index].prompt)]  # past their prompt
            if acc is not None and policy.adaptive and live:
                policy.update(sum(fields[3][b] for b in live) / len(live))
            finished = [b for b in decoding if done[b]]
            for b in decoding:
                if slots[b].first_token is None and lens[b] > len(requests[slots[b].index].prompt):
                    slots[b].first_token = now
            if finished:
                self._retire(ws, finished, slots, requests, results, lens, row_rounds, eos_ids, now)
                for b in finished:
                    retired += len(results[slots[b].index].output)
                    slots[b] = None
                    self._idle(ws, b)
                    reach[b] = 1
            committed = retired + sum(max(0, lens[b] - len(requests[slots[b].index].prompt))
                                      for b in decoding if slots[b] is not None)
            if saturated:
                sat_seconds += now - last_sync[0]
                sat_tokens += committed - last_sync[1]
            last_sync = (now, committed)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        segments = sum(1 for r in results if r is not None and r.by_segment)
        return ServingResult(results, time.perf_counter() - t0, rounds_run,
                             {"segment_admissions": segments, "attention_spans": spans}, sat_seconds, sat_tokens)

    def _retire(self, ws: Workspace, rows: list[int], slots, requests, results, lens, row_rounds, eos_ids,
                now: float) -> None:
        """Read back the finished rows' outputs and statistics (one transfer for all of them)."""
        st = ws.state
        idx = torch.tensor(rows, device=st.tokens.device)
        both = torch.cat([st.tokens.index_select(0, idx), st.accept_log.index_select(0, idx).long()], 1).tolist()
        S = st.capacity
        for j, b in enumerate(rows):
            s = slots[b]
            r = requests[s.index]
            P, L, n = len(r.prompt), lens[b], row_rounds[b]
            results[s.index] = RequestResult(
                cut_output(both[j][P:L], eos_ids, r.max_new), b, n, both[j][S : S + n],
                s.admitted if r.arrival is None else r.arrival, s.admitted, s.first_token, now, s.by_segment,
            )
