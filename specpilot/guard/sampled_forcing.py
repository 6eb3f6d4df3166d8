"""Sampled outputs forced through the stock target: each emitted token's PIT value.

    sampled_pit(target, records, params, config, stream) -> u         [T] float64 over all records
    sampling_gate(target, candidate, stock, params, config) -> SamplingVerdict

For each record the prompt is prefilled as AR decoding prefills it, the stream
`[prompt[-1]] + output[:-1]` is teacher-forced in causal chunks on the stock path (as
`forcing.py` does for the greedy guard), and the logits predicting each emitted token are
processed by the request's `SamplingParams` (`engine.sampling.process_logits`, the one
processor). `guard.sampling.pit_values` turns (p_t, x_t) into u_t with V's from the guard's own
generator (seeded by the config's seed, a different stream per side), and `compare_sampled`
decides. Records are forced one at a time (batch 1), so a token's u does not depend on its file.

Owns the forcing for the sampling guard; not the transform or the rule (`guard/sampling.py`),
nor the records' format (`records.py`).
"""

from __future__ import annotations

from typing import Sequence

import torch

from specpilot.engine.sampling import SamplingParams, process_logits
from specpilot.engine.steps import chunk_forward, prefill
from specpilot.errors import SpecPilotError
from specpilot.guard.forcing import check_records
from specpilot.guard.records import OutputRecord
from specpilot.guard.sampling import SamplingGuardConfig, SamplingVerdict, compare_sampled, pit_values
from specpilot.models.transformer import Transformer

CANDIDATE_STREAM, STOCK_STREAM = 0, 1  # the V's of each side come from seed + stream * STREAM_STEP
STREAM_STEP = 1_000_003


@torch.inference_mode()
def sampled_pit(target: Transformer, records: Sequence[OutputRecord], params: SamplingParams,
                config: SamplingGuardConfig = SamplingGuardConfig(), stream: int = CANDIDATE_STREAM,
                chunk: int = 512) -> torch.Tensor:
    """u [T] float64 of every emitted token of `records`, in order (NaN where p(x) = 0)."""
    if params.greedy:
        raise SpecPilotError("the sampling guard needs a temperature > 0 (greedy outputs: token forcing)")
    check_records(target, records)
    dev = target.device
    longest = max(len(r.prompt_ids) + len(r.output_ids) for r in records)
    cache = target.new_cache(1, (longest + 255) // 256 * 256)  # reused: a chunk at position 0 starts afresh
    generator = torch.Generator().manual_seed(config.seed + stream * STREAM_STEP)
    parts = [torch.zeros(0, dtype=torch.float64)]
    for r in records:
        prompt, output = list(r.prompt_ids), list(r.output_ids)
        if not output:
            continue
        prefill(target, cache, [prompt])
        stream_ids = torch.tensor([prompt[-1]] + output[:-1], dtype=torch.int64, device=dev)  # [T]
        start = len(prompt) - 1
        for s in range(0, len(output), chunk):
            e = min(s + chunk, len(output))
            logits = chunk_forward(target, cache, stream_ids[None, s:e], torch.tensor([start + s], device=dev))
            probs = process_logits(logits[0], params)  # [t,V]
            parts.append(pit_values(probs, torch.tensor(output[s:e]), generator, config.order))
    return torch.cat(parts)


def sampling_gate(target: Transformer, candidate: Sequence[OutputRecord], stock: Sequence[OutputRecord],
                  params: SamplingParams, config: SamplingGuardConfig = SamplingGuardConfig(),
                  chunk: int = 512) -> SamplingVerdict:
    """Force both sides' sampled outputs and apply the sampling guard's rule."""
    u_candidate = sampled_pit(target, candidate, params, config, CANDIDATE_STREAM, chunk)
    u_stock = sampled_pit(target, stock, params, config, STOCK_STREAM, chunk)
    return compare_sampled(u_candidate, u_stock, config)
