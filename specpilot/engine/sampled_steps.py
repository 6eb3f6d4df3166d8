"""One sampled decoding round, AR and speculative: the sampling counterparts of `steps.ar_step`
and `steps.verify_step`, as graph-capturable tensor code.

Each round processes the target's logits row by row (`row_sampling.process_rows`: the request's
temperature, top-k, top-p, min-p), draws its uniforms from the counter-based generator keyed by
(row seed, tokens the row emitted before the round, draw id) (`counter_rng`), and commits exactly
as the greedy steps do (`steps.commit_path`) from the same `Acceptance`:

- AR: the next token is the inverse-CDF draw from p with draw 0.
- Speculative: `acceptance_sampling.point_mass_accept` over the drafter's tree, one draw per node
  (draws 0..N-1), the walk of `sampled_accept` in one pass with the same law; `sampled_accept`
  itself (draw N for the final token) for drafts with probabilities and under a `sampling-rule:*` fault. Drafters here propose node
  sets that are functions of the context and the drafter's outputs (greedy and top-k expansion,
  best-first and DDTree selection, n-gram lookup), so they are verified as point masses
  (`DraftKind.POINT_MASS`), exact for any such tree (the proof is in `acceptance_sampling`).

Rows at temperature 0 get one-hot p, for which `sampled_accept` accepts exactly what
`greedy_accept` does and emits the argmax: a greedy request in a sampled batch stays greedy.
The greedy steps themselves are untouched: a batch with no sampled row never runs this module.

Faults (`engine.faults`, sampled kinds): the logit bias applies as in greedy rounds;
`sampling-rule:*` passes a `SamplingFault` to the acceptance rule; `target-temperature:*` and
`target-top-p:*` change the target-side processing of every sampled row. Segment admission
(`engine.segments`) is not supported here: the generator refuses it with sampling.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from specpilot.engine.acceptance_sampling import DraftKind, SamplingFault, point_mass_accept, sampled_accept
from specpilot.engine.counter_rng import counter_uniforms
from specpilot.engine.faults import Fault, FaultKind, apply_logit_bias
from specpilot.engine.row_sampling import Filters, RowSampling, process_rows
from specpilot.engine.sampling import sample_from
from specpilot.engine.state import DecodeState, commit_tokens
from specpilot.engine.steps import ar_logits, commit_path, packed_logits, tree_forward
from specpilot.engine.tree import DraftTree
from specpilot.engine.verify import Acceptance
from specpilot.models.transformer import Transformer


def target_rows(rows: RowSampling, filters: Filters, fault: Fault | None) -> tuple[RowSampling, Filters]:
    """The parameters the target's side is processed with: the rows' own, or a fault's change."""
    if fault is None or fault.kind not in (FaultKind.TARGET_TEMPERATURE, FaultKind.TARGET_TOP_P):
        return rows, filters
    sampled = rows.temperature > 0
    if fault.kind is FaultKind.TARGET_TEMPERATURE:
        t = torch.where(sampled, torch.full_like(rows.temperature, fault.value), rows.temperature)
        return RowSampling(t, rows.top_k, rows.top_p, rows.min_p, rows.seed), filters
    p = torch.full_like(rows.top_p, fault.value)
    return RowSampling(rows.temperature, rows.top_k, p, rows.min_p, rows.seed), replace(filters, top_p=filters.top_p or fault.value < 1)


def target_probs(logits: torch.Tensor, rows: RowSampling, filters: Filters, fault: Fault | None) -> torch.Tensor:
    """logits [B,T,V] -> the target's processed p [B,T,V] (a fault's change included)."""
    rows, filters = target_rows(rows, filters, fault)
    return process_rows(logits, rows, filters)


def sampling_fault(fault: Fault | None) -> SamplingFault | None:
    return SamplingFault(fault.rule) if fault is not None and fault.kind is FaultKind.SAMPLING_RULE else None


def emitted_count(state: DecodeState) -> torch.Tensor:
    """[B] tokens each row has emitted: the counter of its next round's uniforms."""
    return state.seq_lens - state.prompt_lens


def sampled_ar_step(model: Transformer, cache, state: DecodeState, rows: RowSampling, filters: Filters,
                    fault: Fault | None = None) -> None:
    """Sampled AR round: process each row's root (`steps.ar_logits`), draw its next token from p,
    commit it."""
    probs = target_probs(ar_logits(model, cache, state, fault), rows, filters, fault)[:, 0]  # [B,V]
    u = counter_uniforms(rows.seed, emitted_count(state), 1)[:, 0]  # [B]
    nxt = sample_from(probs, u)  # [B]
    commit_tokens(state, nxt[:, None], torch.ones_like(state.seq_lens))


def _tree_logits(model: Transformer, cache, tree: DraftTree, prefix: torch.Tensor, generated_index: torch.Tensor,
                 fault: Fault | None, capture: tuple[int, ...]):
    """The target's logits [B,N,V] at every node (a shared-budget tree: its valid nodes projected
    alone, `steps.packed_logits`, the others zero and never tested), and the features [B,N,nC]
    with `capture`."""
    B, N = tree.tokens.shape
    if not tree.num_valid:
        out = tree_forward(model, cache, tree, prefix, capture)
        logits, features = out if capture else (out, None)
        return apply_logit_bias(fault, logits, generated_index), features
    packed, features, pack = packed_logits(model, cache, tree, prefix, generated_index, fault, capture)
    full = torch.zeros(B * N, packed.shape[-1], device=packed.device, dtype=packed.dtype)
    return full.index_copy_(0, pack, packed[0]).view(B, N, -1), features


def sampled_verify_step(
    model: Transformer, cache, state: DecodeState, tree: DraftTree, rows: RowSampling, filters: Filters,
    fault: Fault | None = None, capture: tuple[int, ...] = (), kind: DraftKind = DraftKind.POINT_MASS,
    draft_probs: torch.Tensor | None = None,
) -> Acceptance:
    """Verify a draft tree by exact rejection sampling in one target forward; commit the accepted
    path and the final token. `draft_probs [B,N,V]`: what each node's children were drafted from
    (SAMPLED / WITHOUT_REPLACEMENT drafts only). With `capture`, `acc.features` as in `verify_step`."""
    prefix = state.cache_prefix()
    N = tree.num_nodes
    generated_index = prefix[:, None] + tree.depths() + 1 - state.prompt_lens[:, None]
    logits, features = _tree_logits(model, cache, tree, prefix, generated_index, fault, capture)
    probs = target_probs(logits, rows, filters, fault)  # [B,N,V]
    u = counter_uniforms(rows.seed, emitted_count(state), N + 1)  # [B,N+1]
    rule_fault = sampling_fault(fault)
    if kind is DraftKind.POINT_MASS and rule_fault is None:  # one draw per node, no walk over the nodes
        acc = point_mass_accept(tree, probs, u[:, :N])
    else:
        acc = sampled_accept(tree, probs, u[:, :N], u[:, N], draft_probs, kind, rule_fault)
    return commit_path(cache, state, prefix, acc, features)
