"""The draft tree: the one data type joining drafters, the attention mask and the verifier.

A tree of N nodes per row is given by `tokens [B,N]` and `parents [B,N]`. Node 0 is the root: the
last committed token, not yet processed by the target (parents[:,0] == -1). Every other node is a
draft token whose parent has a smaller index (topological order). A chain of K draft tokens is the
tree with parents -1, 0, 1, ..., K-1.

Pure functions here turn a tree into what one target forward needs, given `prefix [B]` = the
number of committed entries already in the cache (the root goes to slot `prefix`):
- `slots`: node j is written to cache slot prefix + j;
- `positions`: node j sits at RoPE position prefix + depth(j);
- `attention_mask`: node i sees every committed slot (< prefix) and the slots of its ancestors
  and itself;
- `path_nodes`: for a chosen node, the node indices along its root path, by depth (what is
  retrieved to commit tokens and KV entries).
All are tensor ops without host syncs, so they can run inside a captured CUDA graph.
Trees of one batch may carry a `valid` mask (a shared node budget, per-row depth caps): nodes
outside it are padding, never accepted (`verify.greedy_accept`) and, when the tree gives a static
count (`num_valid`), left out of the verify forward's projections.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class DraftTree:
    tokens: torch.Tensor  # [B,N] int64, node 0 = root
    parents: torch.Tensor  # [B,N] int64, parents[:,0] = -1, parents[:,j] < j
    max_depth: int  # static upper bound on depth (for fixed-shape loops)
    # Which nodes count [B,N] bool (the root always; per row a prefix-closed set), for trees sharing
    # one node budget across the batch or capped in depth per row (`selection.py`).
    # None: every node counts.
    valid: torch.Tensor | None = None
    # > 0: a static count of nodes over the batch, at least the valid ones, that the verify forward
    # packs (valid first) and projects alone; 0: it runs every node (padding is still never accepted).
    num_valid: int = 0
    _ancestors: torch.Tensor | None = field(default=None, repr=False)
    _depths: torch.Tensor | None = field(default=None, repr=False)

    @property
    def batch(self) -> int:
        return self.tokens.shape[0]

    @property
    def num_nodes(self) -> int:
        return self.tokens.shape[1]

    @classmethod
    def chain(cls, tokens: torch.Tensor) -> "DraftTree":
        """tokens [B,K+1] (root first) as a chain."""
        B, N = tokens.shape
        parents = (torch.arange(N, device=tokens.device) - 1).expand(B, N)
        return cls(tokens, parents, max_depth=N - 1)

    def ancestors(self) -> torch.Tensor:
        """[B,N,N] bool: ancestors[b,i,j] is True when j is i or an ancestor of i."""
        if self._ancestors is None:
            self._ancestors = ancestors_of(self.parents, self.max_depth)
        return self._ancestors

    def depths(self) -> torch.Tensor:
        """[B,N] int64 depth of each node (root = 0)."""
        if self._depths is None:
            self._depths = self.ancestors().sum(-1) - 1
        return self._depths


def ancestors_of(parents: torch.Tensor, max_depth: int) -> torch.Tensor:
    """Ancestor-or-self matrix [B,N,N] of trees no deeper than `max_depth`, by path doubling: A
    starts as "self or parent" (paths of <= 1 step) and each A <- A @ A doubles the path length it
    covers, so ceil(log2(max_depth)) products cover every root path: a few kernels instead of a
    gather/scatter walk per level. The products count paths of 0/1 entries (integers <= N in
    float32, exact), and only their sign is kept."""
    B, N = parents.shape
    dev = parents.device
    has_parent = parents >= 0  # [B,N]
    a = torch.zeros(B, N, N, device=dev, dtype=torch.float32)
    a.scatter_(2, parents.clamp(min=0)[..., None], has_parent[..., None].float())  # parent edges
    a += torch.eye(N, device=dev, dtype=torch.float32)
    reach = 1
    while reach < max_depth:
        a = (a @ a).clamp_(max=1.0)  # [B,N,N] paths of <= 2 * reach steps
        reach *= 2
    return a > 0


def ancestors_walk(parents: torch.Tensor, max_depth: int) -> torch.Tensor:
    """The same matrix by walking every node up `max_depth` times (the reference for tests)."""
    B, N = parents.shape
    idx = torch.arange(N, device=parents.device).expand(B, N)
    anc = torch.zeros(B, N, N, dtype=torch.bool, device=parents.device)
    cur = idx.clone()
    for _ in range(max_depth + 1):
        valid = cur >= 0
        anc.scatter_(2, cur.clamp(min=0)[..., None], valid[..., None] | anc.gather(2, cur.clamp(min=0)[..., None]))
        cur = torch.where(valid, parents.gather(1, cur.clamp(min=0)), cur)
    return anc


def slots(tree: DraftTree, prefix: torch.Tensor) -> torch.Tensor:
    """[B,N] cache slot of each node."""
    return prefix[:, None] + torch.arange(tree.num_nodes, device=prefix.device)


def positions(tree: DraftTree, prefix: torch.Tensor) -> torch.Tensor:
    """[B,N] RoPE position of each node."""
    return prefix[:, None] + tree.depths()


def attention_mask(tree: DraftTree, prefix: torch.Tensor, capacity: int) -> torch.Tensor:
    """[B,1,N,S] bool over the whole static cache of `capacity` slots."""
    B, N = tree.tokens.shape
    s = torch.arange(capacity, device=prefix.device)[None, :]  # [1,S]
    committed = s < prefix[:, None]  # [B,S]
    rel = s - prefix[:, None]  # [B,S] node index a slot holds, if inside the tree window
    in_tree = (rel >= 0) & (rel < N)
    anc = tree.ancestors()  # [B,N,N]
    visible = anc.gather(2, rel.clamp(0, N - 1)[:, None, :].expand(B, N, capacity))  # [B,N,S]
    mask = committed[:, None, :] | (in_tree[:, None, :] & visible)
    return mask[:, None]


def path_nodes(tree: DraftTree, node: torch.Tensor) -> torch.Tensor:
    """[B,max_depth+1] node index at each depth on the root path of `node [B]` (-1 past its depth)."""
    B, N = tree.tokens.shape
    anc_row = tree.ancestors().gather(1, node[:, None, None].expand(B, 1, N))[:, 0]  # [B,N]
    depth = tree.depths()  # [B,N]
    levels = torch.arange(tree.max_depth + 1, device=node.device)  # [K+1]
    hit = anc_row[:, None, :] & (depth[:, None, :] == levels[None, :, None])  # [B,K+1,N]
    return torch.where(hit.any(-1), hit.float().argmax(-1), torch.full_like(levels, -1).expand(B, -1))


def prefix_closed(tree: DraftTree) -> bool:
    """True when every node's parent precedes it (host check, for tests and validation)."""
    p = tree.parents
    j = torch.arange(tree.num_nodes, device=p.device)
    return bool((p[:, 0] == -1).all() and ((p[:, 1:] >= 0) & (p[:, 1:] < j[1:])).all())
