"""Greedy verification of a draft tree against the target's argmax.

The acceptance rule (greedy, lossless):

    Let a(j) be the target's argmax at node j, computed in one forward over all tree nodes.
    A draft node i is *correct* when tokens[i] == a(parent(i)): it is exactly the token greedy
    AR decoding would emit after the path to its parent. A node is *accepted* when it and every
    draft node on its root path are correct. The accepted path is the deepest accepted node's root
    path (unique: siblings carry distinct tokens, so at most one child of a node matches).
    The *bonus* token is a(deepest accepted node): the target's own next token after that path,
    free because the forward already computed it. A tree with a `valid` mask (a node budget shared
    across the batch) counts only valid nodes as correct. Each step therefore commits
    `accept_len` draft tokens + 1 bonus token, all equal to what AR decoding would produce.

Rejected nodes are discarded: their KV entries sit in slots past the new length and are masked
out or overwritten. Accepted nodes' KV entries are moved to contiguous slots (`commit`).

Fault injection (`Fault.ACCEPT_UNVERIFIED`) deliberately breaks the rule for guard testing: the
deepest draft node is treated as correct without checking it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specpilot.engine.tree import DraftTree, path_nodes


@dataclass
class Acceptance:
    accept_len: torch.Tensor  # [B] int64 accepted draft tokens (bonus excluded)
    path: torch.Tensor  # [B,K+1] node index by depth along the accepted path (-1 past accept_len)
    new_tokens: torch.Tensor  # [B,K+1] accepted drafts then the bonus; entries past accept_len+1 are junk
    bonus: torch.Tensor  # [B] int64
    features: torch.Tensor | None = None  # [B,K+1,nC] target features along `path` (see `steps.verify_step`)


def greedy_accept(tree: DraftTree, target_argmax: torch.Tensor, accept_unverified: bool = False,
                  forced: torch.Tensor | None = None) -> Acceptance:
    """Apply the acceptance rule above. target_argmax [B,N] int64.

    `forced [B]` (segment admission, `engine.segments`): a row with forced[b] = n >= 0 carries a
    prompt segment as the chain of nodes 0..n and accepts exactly those, whatever the target says.
    """
    B, N = tree.tokens.shape
    parent_argmax = target_argmax.gather(1, tree.parents.clamp(min=0))  # [B,N]
    correct = tree.tokens == parent_argmax
    correct[:, 0] = True  # the root is committed already
    if tree.valid is not None:
        correct &= tree.valid  # padding of a shared budget: never accepted (nor, so, its subtree)
    depth = tree.depths()
    if accept_unverified:
        correct |= depth == depth.max(dim=1, keepdim=True).values
    if forced is not None:
        node = torch.arange(N, device=correct.device)[None, :]
        correct = torch.where((forced >= 0)[:, None], node <= forced[:, None], correct)
    anc = tree.ancestors()  # [B,N,N]
    accepted = ~(anc & ~correct[:, None, :]).any(-1)  # [B,N]
    score = torch.where(accepted, depth, torch.full_like(depth, -1))
    best = score.argmax(dim=1)  # [B] deepest accepted node (first among equals)
    accept_len = depth.gather(1, best[:, None])[:, 0]
    path = path_nodes(tree, best)  # [B,K+1]
    bonus = target_argmax.gather(1, best[:, None])[:, 0]
    K1 = path.shape[1]
    drafted = tree.tokens.gather(1, path[:, 1:].clamp(min=0))  # [B,K] tokens at depth 1..K
    levels = torch.arange(1, K1, device=path.device)
    new = torch.where(levels[None] <= accept_len[:, None], drafted, bonus[:, None])  # bonus right after the path
    new_tokens = torch.cat([new, bonus[:, None]], dim=1)
    return Acceptance(accept_len, path, new_tokens, bonus)


def commit(cache, prefix: torch.Tensor, acc: Acceptance, active: torch.Tensor) -> None:
    """Commit the accepted path in the target's cache (`commit_path`): KV entries move to slots
    prefix+1.. (the root is already at prefix); a recurrent layer's committed state becomes the
    deepest accepted node's, for the `active` [B] rows only."""
    cache.commit_path(prefix, acc.path, acc.accept_len, active)
