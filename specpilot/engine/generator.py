"""The decode loop of a static batch: prefill, then rounds until every row is done.

Owns: the host loop with its single sync point (every `sync_every` rounds; every round for a
drafter that needs the committed tokens on the host), feeding the tier policy, timing (wall clock
and CUDA events), and turning device state into `GenerationResult`s.

Sampling: `generate(..., sampling=...)` takes per-row `SamplingParams`. A batch with no sampled
row (None, or every row at temperature 0) runs the greedy rounds (`steps.py`) exactly as before;
otherwise every round is a sampled one (`sampled_steps.py`, with the rows' parameters in the
workspace's `RowSampling` and a graph of its own per `Filters`), greedy rows in it included.

Does not own the round, its workspaces and graphs (`round.py`), what a round computes
(`steps.py`, `drafters/`) or how models are loaded (`session.py`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from specpilot.engine.drafters.base import Drafter
from specpilot.engine.faults import Fault
from specpilot.engine.round import Rounds, Workspace
from specpilot.engine.row_sampling import Filters
from specpilot.engine.sampling import SamplingParams
from specpilot.engine.state import extract_outputs
from specpilot.errors import ConfigError
from specpilot.models.transformer import Transformer


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


class Generator:
    """Generation with an optional drafter (None = AR), greedy or sampled, over `Rounds`.

    `drafters` maps a depth tier to its drafter (one entry unless adaptive depth is on); all tiers
    share the draft model and its state. The other arguments are the round's (`round.Rounds`) but
    `sync_every`: rounds between host syncs.
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
        self.rounds = Rounds(target, drafters, eos_ids, cuda_graphs, fault, prefill_bucket, segment_tokens,
                             attention_span, verify_compile, pdl)
        self.sync_every = 1 if self.rounds.needs_host_tokens else sync_every

    # the round's settings and workspaces, read through the generator
    target = property(lambda self: self.rounds.target)
    drafters = property(lambda self: self.rounds.drafters)
    use_graphs = property(lambda self: self.rounds.use_graphs)
    prefill_bucket = property(lambda self: self.rounds.prefill_bucket)
    feature_layers = property(lambda self: self.rounds.feature_layers)
    verify_compile = property(lambda self: self.rounds.verify_compile)
    workspaces = property(lambda self: self.rounds.workspaces)
    max_workspaces = property(lambda self: self.rounds.max_workspaces)
    max_positions = property(lambda self: self.rounds.max_positions)

    def launching(self):
        """The context every launch of this generator runs in (`Rounds.launching`)."""
        return self.rounds.launching()

    def capacity_for(self, prompt_len: int, max_new: int) -> int:
        """The workspace capacity a prompt of `prompt_len` tokens and `max_new` new tokens needs."""
        return self.rounds.capacity_for(prompt_len, max_new)

    # ---- the loop ----------------------------------------------------------------------
    @torch.inference_mode()
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
        with self.launching():
            return self._generate(prompts, max_new_tokens, stop_at_eos, sampling)

    def _generate(self, prompts, max_new_tokens, stop_at_eos, sampling) -> GenerationResult:
        rounds = self.rounds
        B = len(prompts)
        params = self._row_params(sampling, B)
        filters = Filters.of(params) if params is not None else None
        capacity = rounds.capacity_for(max(len(p) for p in prompts), max_new_tokens)
        ws = rounds.workspace(B, capacity, max_new_tokens)
        if params is not None:
            ws.rows().load(params)
        policy = rounds.prepare(ws, filters=filters)  # capture and warm before timing starts
        dev = rounds.target.device
        sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
        events = [torch.cuda.Event(enable_timing=True) for _ in range(3)] if dev.type == "cuda" else None
        sync()
        t0 = time.perf_counter()
        if events:
            events[0].record()
        eos_ids = rounds.eos_ids if stop_at_eos else ()
        ws.state.reset(prompts, eos_ids, max_new_tokens)
        features = rounds.prefill(ws, prompts)
        if rounds.speculative:
            rounds.start_drafter(policy.tier, prompts, ws.state, features)
        if events:
            events[1].record()
        sync()
        t_prefill = time.perf_counter() - t0
        host = [list(p) for p in prompts] if rounds.needs_host_tokens else None
        for r in range(max_new_tokens + 1):
            acc = rounds.round(ws, policy.tier, host, filters=filters)
            if (r + 1) % self.sync_every:
                continue
            # ---- the one host sync of the loop ----
            if host is not None:
                counts = (acc.accept_len + 1).tolist()
                new = acc.new_tokens.tolist()
                for b in range(B):
                    host[b].extend(new[b][: counts[b]])
            if policy.adaptive:
                policy.update(float(acc.accept_len.float().mean()))
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
        return params if self.rounds.filters(params) is not None else None

    def _result(self, ws: Workspace, max_new: int, seconds: float, t_prefill: float,
                eos_ids: tuple[int, ...]) -> GenerationResult:
        outputs = extract_outputs(ws.state, eos_ids, max_new)
        rounds = ws.state.rounds.tolist()
        log = ws.state.accept_log.tolist()
        accept = [row[:n] for row, n in zip(log, rounds)]
        return GenerationResult(outputs, rounds, accept, seconds, t_prefill)
