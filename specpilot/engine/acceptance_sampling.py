"""Exact verification of a draft tree (a chain included) under sampling.

`sampled_accept` is the sampling counterpart of `verify.greedy_accept`: same tree, same
`Acceptance`, and the tokens it emits are distributed exactly as sampling them one by one from
the target's processed distribution p (`sampling.process_logits`).

The rule: recursive rejection sampling over siblings with residual updates.

    Walk from the root. At the current node v, with p_res = p(. | path to v) and q_res = q_v, the
    distribution v's children were drafted from, try v's children c_1..c_m in node-index order:
        accept c_i with probability min(1, p_res(c_i) / q_res(c_i)), and if so move to c_i;
        else  p_res <- normalize(max(0, p_res - q_res)),
              q_res <- q_res with c_i removed, renormalised   (without replacement only).
    When every child of v is rejected (or v has none), emit one token drawn from p_res and stop.
    The emitted tokens are the accepted path's drafts followed by that token: after a rejection
    it is the *recovered* token, at a node whose children were all absent it is the *bonus*.

For one child per node (a chain) this is standard speculative sampling (Leviathan et al. 2023,
"Fast Inference from Transformers via Speculative Decoding"; Chen et al. 2023, "Accelerating LLM
Decoding with Speculative Sampling"). For several children it is SpecInfer's multi-step
speculative sampling (Miao et al. 2024) for i.i.d. children, and the recursive rejection sampling
of Recursive Speculative Decoding (Jeon et al. 2024) for children drawn without replacement.
How the children were drafted is stated by `DraftKind`:

- SAMPLED: children drawn i.i.d. from q_v (duplicates possible; each has q_v > 0); q_res stays q_v.
- WITHOUT_REPLACEMENT: c_i drawn from q_v with c_1..c_{i-1} removed and renormalised (the draw
  order must be the node-index order), so q_res removes each rejected child.
- POINT_MASS: children fixed by the context (n-gram, greedy or top-k expansion, best-first and
  DDTree node sets chosen from draft probabilities): each child c_i is the point mass delta(c_i),
  so it is accepted with probability p_res(c_i) and a rejection zeroes p_res(c_i), renormalised.

Why the output is p. Lemma (one proposal): for any target r and proposal s, drawing x ~ s,
accepting x with probability min(1, r(x)/s(x)) and otherwise drawing from
normalize(max(0, r - s)) yields r: P(x emitted) = s(x) min(1, r(x)/s(x)) + P(reject) res(x)
= min(s(x), r(x)) + max(0, r(x) - s(x)) = r(x), because P(reject) = 1 - sum_y min(s(y), r(y))
= sum_y max(0, r(y) - s(y)) is the residual's mass. Siblings: by induction from the last child,
the procedure from child i on with residual p_i emits p_i, provided that c_i given everything
before it is distributed as q_i (the q_res at step i) and the uniforms are fresh. Its rejection
branch is the procedure from child i+1 on with p_{i+1} = normalize(max(0, p_i - q_i)), which by
induction emits p_{i+1}, exactly the residual the lemma requires; so step i emits p_i, and
step 1 emits p. The three kinds meet the proviso: i.i.d. draws (q_i = q_v); draws without
replacement (q_i is q_v without c_1..c_{i-1}, a fixed distribution once they are known); point
masses (c_i is a function of the context, q_i = delta(c_i), and the lemma then reads: accept
with p_i(c_i), else draw from p_i with c_i removed). Depth: given that the emitted token at v is
an accepted child c, the walk continues at c with p(. | path to c); the subtree at c is fixed
before any target uniform is drawn, so the same argument applies at c, and the emitted sequence
has the target's joint law, the chain rule token by token.

Trees whose node sets depend on draft probabilities (best-first expansion, DDTree's selection,
a shared node budget) are exact under POINT_MASS: the whole tree is a function of the context
and the drafter's outputs, independent of the target's uniforms, so conditioning on it leaves
each node's candidates fixed; POINT_MASS then equals drawing y ~ p_v and descending when y is a
child (P(emit c_i) = prod_{j<i}(1 - p_j(c_j)) p_i(c_i) = p(c_i)). POINT_MASS is exact for any tree
built without the target's randomness, sampled drafts included; SAMPLED and WITHOUT_REPLACEMENT
need children that really were drawn from the stated q, and accept more often when they were.

Uniforms (for a pure, reproducible function): u_accept [B,N] tests node j (each node is tested
at most once) and u_final [B] draws the one emitted token from a residual per row.

Deliberately broken variants (`SamplingFault`) exist to show the statistical tests and the guard
catch them. Not here: the target and drafter forwards, KV commit (`verify.commit`), the guard.
"""

from __future__ import annotations

import enum

import torch

from specpilot.engine.sampling import inverse_cdf, sample_from
from specpilot.engine.tree import DraftTree, path_nodes
from specpilot.engine.verify import Acceptance, greedy_accept


class DraftKind(enum.Enum):
    SAMPLED = "sampled"  # children i.i.d. from q
    WITHOUT_REPLACEMENT = "without-replacement"  # children drawn in index order without replacement
    POINT_MASS = "point-mass"  # children fixed by the context (deterministic drafters)


class SamplingFault(enum.Enum):
    """Broken rules, for tests of the statistical checks and the guard."""
    CORRECTION_FROM_P = "correction-from-p"  # after a rejection, draw from p instead of the residual
    RESIDUAL_UNNORMALISED = "residual-unnormalised"  # residual used as unnormalised weights, drawn
    # by inverse CDF against u (not u * mass): the overshoot lands on its last token


def _remove(probs: torch.Tensor, token: torch.Tensor, renormalise: bool = True) -> torch.Tensor:
    """probs [B,V] with probs[b, token[b]] set to 0, renormalised. Rows left with no mass keep
    their old value (they are not reached: the removed token had probability 1)."""
    out = probs.scatter(1, token[:, None], 0.0)
    if not renormalise:
        return out
    mass = out.sum(-1, keepdim=True)  # [B,1]
    return torch.where(mass > 0, out / mass.clamp(min=torch.finfo(out.dtype).tiny), probs)


def _residual(p_res: torch.Tensor, q_res: torch.Tensor, renormalise: bool = True) -> torch.Tensor:
    """normalize(max(0, p_res - q_res)) [B,V]. With no mass left (p_res == q_res, where rejection
    has probability 0 and only rounding reaches it) p_res is kept."""
    out = (p_res - q_res).clamp(min=0)
    if not renormalise:
        return out
    mass = out.sum(-1, keepdim=True)  # [B,1]
    return torch.where(mass > 0, out / mass.clamp(min=torch.finfo(out.dtype).tiny), p_res)


def sampled_accept(tree: DraftTree, target_probs: torch.Tensor, u_accept: torch.Tensor,
                   u_final: torch.Tensor, draft_probs: torch.Tensor | None = None,
                   kind: DraftKind = DraftKind.SAMPLED, fault: SamplingFault | None = None) -> Acceptance:
    """Apply the rule in the module docstring.

    target_probs [B,N,V]: p after node j's path; draft_probs [B,N,V]: q_j, what node j's children
    were drafted from (unused for POINT_MASS); u_accept [B,N], u_final [B] uniforms in [0,1).
    """
    B, N = tree.tokens.shape
    dev = tree.tokens.device
    if kind is not DraftKind.POINT_MASS and draft_probs is None:
        raise ValueError(f"{kind.value} drafts need draft_probs")
    rows = torch.arange(B, device=dev)
    renormalise = fault is not SamplingFault.RESIDUAL_UNNORMALISED
    cur = torch.zeros(B, dtype=torch.long, device=dev)  # [B] current node
    accept_len = torch.zeros(B, dtype=torch.long, device=dev)  # [B]
    rejected = torch.zeros(B, dtype=torch.bool, device=dev)  # [B] a child of `cur` was rejected
    p_res = target_probs[:, 0].float()  # [B,V]
    q_res = draft_probs[:, 0].float() if draft_probs is not None else None  # [B,V]
    # Nodes in index order: parents precede children and siblings are tried in index order, so
    # node j is tested exactly when its parent is the current node (its root path accepted and
    # its earlier siblings rejected).
    for j in range(1, N):
        test = tree.parents[:, j] == cur  # [B]
        if tree.valid is not None:
            test &= tree.valid[:, j]
        x = tree.tokens[:, j]  # [B]
        px = p_res.gather(1, x[:, None])[:, 0]  # [B]
        if kind is DraftKind.POINT_MASS:
            ratio = px
        else:
            qx = q_res.gather(1, x[:, None])[:, 0]  # [B]
            ratio = px / qx.clamp(min=torch.finfo(qx.dtype).tiny)
        accept = test & (u_accept[:, j] < ratio)
        reject = test & ~accept
        if kind is DraftKind.POINT_MASS:
            new_p = _remove(p_res, x, renormalise)
        else:
            new_p = _residual(p_res, q_res, renormalise)
        p_res = torch.where(reject[:, None], new_p, p_res)
        if kind is DraftKind.WITHOUT_REPLACEMENT:
            q_res = torch.where(reject[:, None], _remove(q_res, x), q_res)
        rejected = (rejected | reject) & ~accept
        # Descend: the walk continues at node j with its own p and q.
        cur = torch.where(accept, j, cur)
        accept_len += accept.long()
        p_res = torch.where(accept[:, None], target_probs[:, j].float(), p_res)
        if q_res is not None:
            q_res = torch.where(accept[:, None], draft_probs[:, j].float(), q_res)
    if fault is SamplingFault.CORRECTION_FROM_P:
        p_res = torch.where(rejected[:, None], target_probs[rows, cur].float(), p_res)
    if fault is SamplingFault.RESIDUAL_UNNORMALISED:
        final = inverse_cdf(p_res, u_final)  # mass below 1 after a rejection: the overshoot goes last
    else:
        final = sample_from(p_res, u_final)  # [B]
    path = path_nodes(tree, cur)  # [B,K+1]
    K1 = path.shape[1]
    drafted = tree.tokens.gather(1, path[:, 1:].clamp(min=0))  # [B,K] tokens at depth 1..K
    levels = torch.arange(1, K1, device=dev)
    new = torch.where(levels[None] <= accept_len[:, None], drafted, final[:, None])
    new_tokens = torch.cat([new, final[:, None]], dim=1)  # [B,K+1]
    return Acceptance(accept_len, path, new_tokens, final)


def duplicate_siblings(tree: DraftTree) -> torch.Tensor:
    """[B,N] bool: node j repeats the token of an earlier sibling (same parent, smaller index)."""
    same = (tree.parents[:, :, None] == tree.parents[:, None, :]) & (tree.tokens[:, :, None] == tree.tokens[:, None, :])
    N = tree.num_nodes
    earlier = torch.ones(N, N, dtype=torch.bool, device=same.device).tril(-1)  # [j, i]: i < j
    return (same & earlier).any(-1) & (tree.parents >= 0)


def point_mass_accept(tree: DraftTree, target_probs: torch.Tensor, u: torch.Tensor) -> Acceptance:
    """`sampled_accept` for POINT_MASS drafts in one pass, with the same output law: draw one token
    y_v ~ p_v at every node (`u [B,N]`, inverse CDF), then accept as `greedy_accept` does with y
    in place of the argmax, a repeated sibling never accepted.

    Why the law is the same. At a node v with distinct children c_1..c_m the sequential rule accepts
    c_1 w.p. p(c_1), else c_2 w.p. p(c_2) / (1 - p(c_1)), ..., so c_i w.p. p(c_i) overall, and if
    all are rejected it draws from p with c_1..c_m removed: exactly the law of one draw y ~ p,
    accepted as the child it equals or emitted when it equals none. A repeated sibling has p_res = 0
    when its turn comes, so it is never accepted by either rule. Below an accepted child the walk
    starts afresh with that child's p and fresh uniforms in both rules, so by induction over depth
    the emitted sequences have the same law. Temperature-0 rows (one-hot p) draw the argmax."""
    y = sample_from(target_probs.float(), u)  # [B,N]
    tokens = torch.where(duplicate_siblings(tree), -1, tree.tokens)
    return greedy_accept(DraftTree(tokens, tree.parents, tree.max_depth, tree.valid, tree.num_valid,
                                   tree._ancestors, tree._depths), y)


def draw_uniforms(batch: int, num_nodes: int, generator: torch.Generator | None = None,
                  device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(u_accept [B,N], u_final [B]) for one verification, from a request's generator."""
    u = torch.rand(batch, num_nodes + 1, generator=generator, device=device)
    return u[:, :num_nodes], u[:, num_nodes]
