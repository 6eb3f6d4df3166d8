"""Segment admission: a waiting request's prompt rides in the verification rows of the rounds.

Under continuous batching (`engine.serving`) a request admitted by segments starts with one
committed token (seq_len 1, root = its first prompt token) and is active at once. While its root
lies inside its prompt (seq_len L < prompt_len P) its tree is replaced, inside the round, by the
next prompt tokens as a chain: node i (i <= S, the segment length) carries the prompt token at
position L - 1 + i, at slot and RoPE position prefix + i with a causal mask, exactly as a chunk
prefill would place it; nodes past S hang off the root and are never accepted. Verification
accepts the first n = min(S, P - L) chain nodes by force (`verify.greedy_accept`'s `forced`), and
the token after them is:
- the next prompt token, while the prompt goes on (the target's argmax there is discarded);
- the target's argmax after the last prompt token once the segment ends the prompt: the
  request's first generated token, the one a chunk prefill followed by a first round gives.
So a row goes from prefill to decoding inside the captured round, with no host sync, and every
per-row quantity stays as after a chunk prefill: the target's cache holds the prompt's K/V, and a
drafter sees an ordinary acceptance of n tokens (`observe`: the path's features and tokens; the
draft model's catch-up window must cover S + 1 tokens), so it follows the prompt with no prefill of
its own. Rounds that commit only prompt tokens are not logged as decoding rounds (`commit_tokens`).

The cost: the prefilling row decodes nothing for about P / (S + 1) rounds, while a chunk prefill
stalls every other row for one prefill forward. Which wins depends on the batch and the prompt
lengths, so S is a knob (`System.segment_tokens`), measured by the serving benchmark.
"""

from __future__ import annotations

import torch

from specpilot.engine.state import DecodeState
from specpilot.engine.tree import DraftTree


def segment_tree(tree: DraftTree, state: DecodeState, length: int) -> tuple[DraftTree, torch.Tensor]:
    """The round's tree with every prefilling row's next prompt segment in place of its drafts.

    Returns the tree (max_depth >= length) and `forced [B]`: how many chain nodes a prefilling row
    accepts (-1: a decoding row, verified as usual). With a shared budget (`tree.num_valid`) a row's
    segment keeps to the nodes its drafter kept for it (`selection.share_rows`: a segment's nodes
    first), so the batch's packed count stays put.
    """
    B, N = tree.tokens.shape
    S = min(length, N - 1)
    dev = tree.tokens.device
    L, P = state.seq_lens, state.prompt_lens
    seg = L < P  # [B] the root lies inside the prompt
    n = (P - L).clamp(min=0, max=S)
    if tree.num_valid:  # packed: keep to the row's share of the batch's nodes
        n = torch.minimum(n, tree.valid.sum(1) - 1)
    forced = torch.where(seg, n, torch.full_like(n, -1))  # [B]
    i = torch.arange(N, device=dev)
    in_chain = i <= S  # [N]
    idx = ((L - 1)[:, None] + i[None]).clamp(max=state.capacity - 1)  # [B,N] prompt position of node i
    chain_tokens = torch.where(in_chain[None], state.tokens.gather(1, idx), torch.zeros_like(idx))
    chain_parents = torch.where(in_chain, i - 1, torch.zeros_like(i))  # [N] past S: children of the root
    a, j = i[:, None], i[None, :]  # node, candidate ancestor
    chain_anc = torch.where(in_chain[:, None], j <= a, (j == 0) | (j == a))  # [N,N] ancestor-or-self
    row = seg[:, None]
    anc = torch.where(seg[:, None, None], chain_anc[None], tree.ancestors())  # [B,N,N]
    valid = None
    if tree.valid is not None:
        valid = torch.where(row, i[None] <= n[:, None], tree.valid)
    return DraftTree(
        torch.where(row, chain_tokens, tree.tokens),
        torch.where(row, chain_parents[None].expand(B, N), tree.parents),
        max_depth=max(tree.max_depth, S),
        valid=valid,
        num_valid=tree.num_valid,
        _ancestors=anc,
    ), forced


def finish_segments(acc, state: DecodeState, forced: torch.Tensor) -> None:
    """After a forced acceptance: a row whose prompt goes on past its segment takes its next prompt
    token as the round's last token instead of the target's argmax (in `acc`, in place)."""
    L, P = state.seq_lens, state.prompt_lens
    n = forced.clamp(min=0)
    nxt = L + n  # [B] position of the token after the segment
    mid = (forced >= 0) & (nxt < P)
    prompt_next = state.tokens.gather(1, nxt.clamp(max=state.capacity - 1)[:, None])[:, 0]  # [B]
    acc.bonus = torch.where(mid, prompt_next, acc.bonus)
    col = n[:, None].clamp(max=acc.new_tokens.shape[1] - 1)
    acc.new_tokens.scatter_(1, col, torch.where(mid[:, None], prompt_next[:, None], acc.new_tokens.gather(1, col)))
