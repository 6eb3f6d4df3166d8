"""One decoding round, for AR and for speculative decoding, as graph-capturable tensor code.

Owns: prefill, the causal chunk forward (also used by token forcing), the tree forward, the lean
AR step and the speculative verify-and-commit step. No function here syncs with the host; the
single sync point of a decode loop is in `generator.py`.

`model` is any decoder of `models.registry` and `cache` its own (`model.new_cache`): every forward
tells a recurrent layer which state each token continues (`models.recurrence`): chunks commit as
they go, trees are committed along the accepted path (`verify.commit`).
"""

from __future__ import annotations

import torch

from specpilot.engine import tree as tree_ops
from specpilot.engine.faults import Fault, FaultKind, apply_logit_bias
from specpilot.engine.segments import finish_segments, segment_tree
from specpilot.engine.state import DecodeState, commit_tokens
from specpilot.engine.tree import DraftTree
from specpilot.engine.verify import Acceptance, commit, greedy_accept
from specpilot.kernels.dispatch import prefill_scope
from specpilot.models.recurrence import Recurrence
from specpilot.models.transformer import Transformer


def causal_mask(start: torch.Tensor, T: int, capacity: int) -> torch.Tensor:
    """[B,1,T,S]: query t of a chunk starting at slot start[b] sees slots <= start[b] + t."""
    s = torch.arange(capacity, device=start.device)
    q = start[:, None] + torch.arange(T, device=start.device)[None, :]  # [B,T]
    return (s[None, None, :] <= q[..., None])[:, None]


def chunk_forward(
    model: Transformer,
    cache,
    tokens: torch.Tensor,  # [B,T]
    start: torch.Tensor,  # [B] slot/position of tokens[:,0]
    logits_for: torch.Tensor | None = None,  # [B,T'] or None for all
    capture: tuple[int, ...] = (),
    commit: torch.Tensor | None = None,  # [B] the last real token (recurrent state kept); None: T-1
):
    """Causal forward of a contiguous chunk written at slots start..start+T-1; logits [B,T',V]
    (with `capture`: also the features [B,T,nC] of those layers, see `Transformer.forward`)."""
    B, T = tokens.shape
    pos = start[:, None] + torch.arange(T, device=tokens.device)[None, :]
    if commit is None:
        commit = torch.full((B,), T - 1, dtype=torch.int64, device=tokens.device)
    return model(tokens, pos, cache, pos, causal_mask(start, T, cache.capacity), logits_for, capture,
                 recurrence=Recurrence.chunk(commit))


def padded_length(T: int, start: int, capacity: int, bucket: int) -> int:
    """T rounded up to a multiple of `bucket` (0: no rounding), unless that would run past the cache."""
    if bucket <= 0:
        return T
    Tp = -(-T // bucket) * bucket
    return Tp if start + Tp <= capacity else T


def prefill(model: Transformer, cache, prompts: list[list[int]], chunk: int = 2048,
            bucket: int = 0, capture: tuple[int, ...] = ()) -> list[torch.Tensor] | None:
    """Put every prompt token except the last (the first root) into the cache, row by row.

    With `capture` (target layer ids), returns each row's features of those tokens [T,nC]
    (padding cut off) for a feature-conditioned drafter; otherwise None.

    bucket > 0 pads each chunk with token 0 to a multiple of `bucket` tokens, so prompts of many
    lengths run a few shapes: on a GPU the first prefill of each new length in a process costs
    more than a repeat, with or without torch.compile (`scripts/first_request.py` measures it),
    which would make the first request of every prompt slow and the controller's timings noisy. The generator runs each padded shape once when it
    creates a workspace. The padding is
    invisible: padded rows come after every real row (the causal mask hides them from it), and
    their cache slots lie past the prompt, where the first decode round writes before it reads,
    and a recurrent layer commits the state after the last real token.
    """
    dev = model.device
    features = []
    for b, p in enumerate(prompts):
        body = p[:-1]
        row = cache.row(b)
        parts = [torch.zeros(0, len(capture) * model.config.hidden_size, device=dev, dtype=model.dtype)]
        for s in range(0, len(body), chunk):
            out = prefill_chunk(model, row, body[s : s + chunk], s, bucket, capture)
            if capture:
                parts.append(out)
        features.append(torch.cat(parts))
    return features if capture else None


def prefill_chunk(model: Transformer, row, tokens: list[int], start: int, bucket: int = 0,
                  capture: tuple[int, ...] = ()) -> torch.Tensor | None:
    """Prompt tokens at slots start.. of a one-row cache (`row(b)` of the model's cache), padded as
    in `prefill`; with `capture`, their features [T,nC] (padding cut off)."""
    dev = model.device
    n = len(tokens)
    padded = list(tokens) + [0] * (padded_length(n, start, row.capacity, bucket) - n)
    ids = torch.tensor(padded, dtype=torch.int64, device=dev)[None]
    empty = torch.zeros(1, 0, dtype=torch.int64, device=dev)
    with prefill_scope():  # eager: W12 weights with a kept decoded copy run cuBLAS on it
        out = chunk_forward(model, row, ids, torch.tensor([start], device=dev), logits_for=empty, capture=capture,
                            commit=torch.tensor([n - 1], device=dev))
    return out[1][0, :n] if capture else None


def tree_forward(model: Transformer, cache, tree: DraftTree, prefix: torch.Tensor,
                 capture: tuple[int, ...] = (), pack: torch.Tensor | None = None):
    """One target forward over all tree nodes; logits [B,N,V] (and features [B,N,nC] with `capture`);
    with `pack` ([M] flat node indices), logits [1,M,V] of those nodes only. Recurrent layers keep
    every node's state for the commit (`verify.commit`)."""
    return model(
        tree.tokens,
        tree_ops.positions(tree, prefix),
        cache,
        tree_ops.slots(tree, prefix),
        tree_ops.attention_mask(tree, prefix, cache.capacity),
        capture=capture,
        pack=pack,
        recurrence=Recurrence.tree(tree.parents, tree.depths(), tree.max_depth),
    )


def packed_logits(model: Transformer, cache, tree: DraftTree, prefix: torch.Tensor,
                  generated_index: torch.Tensor, fault: Fault | None, capture: tuple[int, ...] = ()):
    """One forward of a shared-budget tree whose projections run on its `tree.num_valid` valid
    nodes only: (logits [1,M,V] of those nodes, fault applied; features [B,N,nC] with `capture`,
    else None; `pack` [M], their flat indices into B*N)."""
    # the valid nodes' flat indices, in order: a static count, so no host sync and one graph
    pack = torch.sort(tree.valid.reshape(-1).to(torch.int32), descending=True, stable=True).indices[: tree.num_valid]
    out = tree_forward(model, cache, tree, prefix, capture, pack=pack)  # [1,M,V] (, [B,N,nC])
    logits, features = out if capture else (out, None)
    return apply_logit_bias(fault, logits, generated_index.reshape(-1)[pack][None]), features, pack


def packed_argmax(model: Transformer, cache, tree: DraftTree, prefix: torch.Tensor,
                  generated_index: torch.Tensor, fault: Fault | None, capture: tuple[int, ...] = ()):
    """The target's argmax [B,N] at a shared-budget tree's valid nodes (-1 elsewhere), from
    `packed_logits`; with `capture`, also the features [B,N,nC] of those nodes (zeros elsewhere),
    else None."""
    B, N = tree.tokens.shape
    logits, features, pack = packed_logits(model, cache, tree, prefix, generated_index, fault, capture)
    argmax = torch.full((B * N,), -1, dtype=torch.int64, device=pack.device)
    return argmax.index_copy_(0, pack, logits[0].argmax(-1)).view(B, N), features


def ar_logits(model: Transformer, cache, state: DecodeState, fault: Fault | None = None) -> torch.Tensor:
    """The AR round's forward: each row's root at its slot, the target's logits [B,1,V] (fault
    applied); a recurrent layer commits its state for active rows only."""
    prefix = state.cache_prefix()  # [B]
    root = state.roots()[:, None]  # [B,1]
    pos = prefix[:, None]
    s = torch.arange(cache.capacity, device=prefix.device)
    mask = (s[None, :] <= prefix[:, None])[:, None, None, :]  # [B,1,1,S]
    keep = torch.where(state.done, -1, 0)  # [B] a done row's state stays
    logits = model(root, pos, cache, pos, mask, recurrence=Recurrence.chunk(keep))  # [B,1,V]
    return apply_logit_bias(fault, logits, pos + 1 - state.prompt_lens[:, None])


def ar_step(model: Transformer, cache, state: DecodeState, fault: Fault | None = None) -> None:
    """Greedy AR round: process each row's root, commit its argmax (and, in a recurrent layer, its
    state: active rows only)."""
    nxt = ar_logits(model, cache, state, fault).argmax(-1)  # [B,1]
    commit_tokens(state, nxt, torch.ones_like(state.seq_lens))


def verify_step(
    model: Transformer, cache, state: DecodeState, tree: DraftTree, fault: Fault | None = None,
    capture: tuple[int, ...] = (), segment: int = 0,
) -> Acceptance:
    """Verify a draft tree in one target forward, commit the accepted path and the bonus token.

    With `capture`, `acc.features [B,K+1,nC]` holds the target features of the nodes along the
    accepted path (root first; entries past accept_len are junk), gathered on the device.
    With `segment` = S > 0, rows whose root lies inside their prompt prefill up to S prompt tokens
    in this forward instead of verifying drafts (`engine.segments`).
    """
    forced = None
    if segment:
        tree, forced = segment_tree(tree, state, segment)
    prefix = state.cache_prefix()
    features = None
    generated_index = prefix[:, None] + tree.depths() + 1 - state.prompt_lens[:, None]
    if tree.num_valid:
        argmax, features = packed_argmax(model, cache, tree, prefix, generated_index, fault, capture)  # [B,N]
    else:
        if capture:
            logits, features = tree_forward(model, cache, tree, prefix, capture)  # [B,N,V], [B,N,nC]
        else:
            logits = tree_forward(model, cache, tree, prefix)  # [B,N,V]
        argmax = apply_logit_bias(fault, logits, generated_index).argmax(-1)
    unverified = fault is not None and fault.kind is FaultKind.ACCEPT_UNVERIFIED
    acc = greedy_accept(tree, argmax, accept_unverified=unverified, forced=forced)
    if forced is not None:
        finish_segments(acc, state, forced)
    return commit_path(cache, state, prefix, acc, features)


def commit_path(cache, state: DecodeState, prefix: torch.Tensor, acc: Acceptance,
                features: torch.Tensor | None) -> Acceptance:
    """Commit a verified tree's accepted path into the cache and its tokens (the bonus or final
    token included) into the state, active rows only; with `features` [B,N,nC], `acc.features`
    [B,K+1,nC] are those of the path's nodes, root first (past accept_len: junk). Returns acc."""
    if features is not None:
        idx = acc.path.clamp(min=0)[..., None].expand(-1, -1, features.shape[-1])
        acc.features = features.gather(1, idx)
    commit(cache, prefix, acc, ~state.done)
    commit_tokens(state, acc.new_tokens, acc.accept_len + 1)
    return acc
