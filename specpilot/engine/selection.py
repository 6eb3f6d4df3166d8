"""Selecting a draft tree from scored candidates, and the two batch mechanisms on it.

`select` turns candidates (tokens, path scores, parents, laid out parents first) into the tree of
the `budget` best; the best-first drafters (`drafters/best_first.py`: draft model, EAGLE-3) and
DFlash's block trees (`ddtree.py`) all go through it. The batch mechanisms
(`System.shared_budget`, `System.row_depth_margin`):
- *shared budget* (`select(shared=s)`): the batch's rows split B x s draft nodes by path score
  into prefix-closed sets (`DraftTree.valid`); the verify forward projects only those;
- *per-request depth* (`row_caps`): a row drafts no deeper than the mean accepted drafts of its
  last ROW_DEPTH_WINDOW rounds, rounded up, + a margin. The drafter scores candidates beyond a
  row's cap -inf before selection (a child never outscores its parent, so every selected set stays
  prefix-closed); with `capped`, `select` marks any -inf node it still had to take (a row with
  fewer capped candidates than its budget) invalid, so the cap holds: such nodes are never
  accepted, and under a shared budget their share goes to other rows.

Every shape is fixed by (batch, candidates, budget); nothing syncs with the host.
Does not own how candidates are drafted or scored.
"""

from __future__ import annotations

import torch

from specpilot.engine.state import DecodeState
from specpilot.engine.tree import DraftTree

ROW_DEPTH_WINDOW = 4  # recent rounds whose mean acceptance sets a row's depth cap


def row_caps(state: DecodeState, depth: int, margin: int) -> torch.Tensor:
    """[B] deepest draft depth per row: ceil(mean accepted drafts of its last ROW_DEPTH_WINDOW
    rounds) + margin, within 1..depth; `depth` for a row without a round yet. Reads only the
    acceptance log of the decoding state (reset per request), so no drafter keeps state for it."""
    R = state.accept_log.shape[1]
    j = state.rounds[:, None] - 1 - torch.arange(ROW_DEPTH_WINDOW, device=state.rounds.device)[None]  # [B,W]
    seen = j >= 0
    drafts = state.accept_log.gather(1, j.clamp(0, R - 1)).long() - 1  # accepted drafts of those rounds
    n = seen.sum(1)
    mean = (drafts * seen).sum(1) / n.clamp(min=1)
    cap = (torch.ceil(mean).long() + margin).clamp(1, depth)
    return torch.where(n > 0, cap, torch.full_like(cap, depth))


def share_rows(state: DecodeState, segment_tokens: int = 0) -> torch.Tensor:
    """[B] int64, how each row takes part in a shared budget (`select`'s `rows`): -1 for a row that
    is done (it ranks last); for a row still in its prompt under segment admission
    (`engine.segments`), the nodes its next segment needs (they are kept first); 0 otherwise."""
    need = (state.prompt_lens - state.seq_lens).clamp(min=0, max=segment_tokens)
    return torch.where(state.done, torch.full_like(need, -1), need)


def select(roots: torch.Tensor, tokens: torch.Tensor, scores: torch.Tensor, parents: torch.Tensor,
           budget: int, depth: int, shared: int = 0, rows: torch.Tensor | None = None,
           capped: bool = False) -> DraftTree:
    """The `budget` best candidates (tokens, scores, parents [B,M]; parent -1 = the root) as a tree.
    Candidates must be laid out parents first (a stable sort then ranks a parent before an
    equal-score child); a score of +inf ranks a candidate first (DFlash's spine).

    With `shared` = s > 0 the batch's rows split B x s draft nodes by path score: each row ranks
    its best `budget` candidates (a prefix-closed ranking: parents first), all B x budget ranked
    scores are sorted together (stable, so within a row a parent stays before an equal-score
    child) and the best B x s are kept. A row's kept nodes are a prefix of its ranking, hence
    prefix-closed; the rest are padding (`DraftTree.valid`), never accepted and left out of the
    verify forward's projections. `rows` ([B], `share_rows`): a row at -1 (done) ranks last, so
    its share goes to the others; a row at r > 0 keeps its r best candidates first (a prompt
    segment's nodes, whatever their scores).

    With `capped` (or `shared`), selected candidates scored -inf (beyond a row's depth cap) are
    invalid too; without `shared` every node is still verified (`num_valid` = 0: nothing packed).
    """
    B, M = tokens.shape
    n = budget
    dev = tokens.device
    ranked = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :n]  # [B,n] best first
    chosen, rank = ranked.sort(dim=1)  # topological order (parents have smaller ids)
    valid = None
    if shared or capped:
        r = scores.gather(1, ranked)  # [B,n] ranked scores
        if shared and rows is not None:
            first = torch.arange(n, device=dev)[None] < rows[:, None]  # [B,n] a segment's nodes
            r = torch.where(first, torch.full_like(r, float("inf")), r)
        kept = r > float("-inf")  # beyond a depth cap: never valid (a parent's score is never lower)
        if shared:
            if rows is not None:
                r = torch.where(rows[:, None] < 0, torch.full_like(r, float("-inf")), r)
            best = torch.sort(r.reshape(-1), descending=True, stable=True).indices[: B * shared]
            kept &= torch.zeros(B * n, dtype=torch.bool, device=dev).index_fill_(0, best, True).view(B, n)
        valid = torch.cat([torch.ones(B, 1, dtype=torch.bool, device=dev), kept.gather(1, rank)], 1)
    inv = torch.full((B, M), -1, dtype=torch.int64, device=dev)
    inv.scatter_(1, chosen, torch.arange(1, n + 1, device=dev).expand(B, n))
    p = parents.gather(1, chosen)
    node_parent = torch.where(p < 0, torch.zeros_like(p), inv.gather(1, p.clamp(min=0)))
    tree_tokens = torch.cat([roots[:, None], tokens.gather(1, chosen)], 1)
    tree_parents = torch.cat([torch.full((B, 1), -1, dtype=torch.int64, device=dev), node_parent], 1)
    num_valid = B * (1 + shared) if shared else 0  # static: the verify forward packs them
    return DraftTree(tree_tokens, tree_parents, max_depth=depth, valid=valid, num_valid=num_valid)
