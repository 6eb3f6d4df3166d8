"""How many tokens a draft tree of a given shape commits per round: a fitted acceptance model.

The engine measures P(accepted drafts >= d), d = 1..K, for the tree shape it ran (`StepProfile.
accept_at_depth`). To say what *another* shape would accept — a deeper tree, a wider one, a
larger node budget — the cost model needs a model of acceptance per node. This is the positional
model of draft-tree papers (SpecInfer, Sequoia): the target's next token after a correct path is
the drafter's rank-j candidate with probability

    p_j(d) = c_j prod_{i<j} (1 - c_i),   c_j = a_d * r^(j - 1),   a_d = clip(alpha * decay^(d - 1))

(rank 1 right with probability a_d, else rank 2 with a smaller chance, and so on; depth d of the
node, `decay` < 1 when the drafter drifts away from the target along a path). The rank decay r is
not fitted: the stock tree (7 nodes) holds too few siblings to tell it apart from alpha. It is a
prior per drafter kind (`RANK_DECAY`), chosen where `scripts/acceptance_check.py` (the model fitted
on the stock shape against other measured shapes) erred least on the fixture; with r = 1 (a lower
rank as likely as the top one once those above it missed) it over-predicts wide trees, the more so
for EAGLE-3 than for the draft model. Exactly one child of
a correct node can be right, so a node is on the accepted path with probability equal to its
*value*, the product of p_j along its root path, and

    expected accepted drafts  = sum of the values of the tree's nodes,
    P(accepted >= d)          = sum of the values of its depth-d nodes.

Which nodes a tree holds follows the engine's draft-model drafter (`engine/drafters/draft_model.py`)
with the drafter's ranking taken as the model's: depth-1 candidates are the root's topk children;
each level expands the topk best nodes of the previous level (by value) into topk children each;
the tree is the `budget` best candidates overall (prefix-closed, since a child's value never
exceeds its parent's). For the n-gram drafter the same fitted model is used as an approximation.

`fit` picks (alpha, decay) by least squares between the model's P(accepted >= d) for the measured
shape and the measured values (a grid, then a finer grid around the best point: deterministic),
with decay <= 1: the fitted acceptance per depth never rises. A measured curve can rise (the rounds
that reach depth d are the easy stretches of text, so the chance of going one deeper grows with d),
but geometric growth extrapolated past the measured depth drives a_d to its clip, where deep nodes
are nearly free and a deep narrow tree looks far better than it is. Past the measured depth the
model extrapolates; every number derived from it is an estimate, and the cost model labels it so.

Owns: `TreeShape`, `AcceptanceModel` (fit, expected length, per-depth curve). Pure Python + numpy;
no torch. Does not own measuring acceptance (engine) or costs (`cost_model.py`).
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

import numpy as np

MAX_ALPHA = 0.995  # keeps every p_j below 1, so deeper trees never look free
MAX_DECAY = 1.0  # acceptance per depth never rises in the fit (see `fit`)
# r per drafter kind: a lower-ranked candidate's chance, per rank, once those above it missed (above)
RANK_DECAY = {"model": 0.6, "eagle3": 0.3}
DEFAULT_RANK_DECAY = 0.6  # other drafters (n-gram, DFlash trees): the draft model's
DECAYS = tuple(np.round(np.linspace(0.5, MAX_DECAY, 11), 3))


@dataclass(frozen=True, order=True)
class TreeShape:
    """The draft tree's envelope: depth K, children per expanded node k, draft nodes n (root excluded)."""

    depth: int
    topk: int
    budget: int

    def __post_init__(self):
        if self.depth < 1 or self.topk < 1 or self.budget < 1:
            raise ValueError(f"tree shape needs depth, topk and budget >= 1: {self}")

    @property
    def num_candidates(self) -> int:
        """Candidates the drafter scores: k at depth 1, k*k at every deeper level."""
        return self.topk + (self.depth - 1) * self.topk * self.topk

    @property
    def nodes(self) -> int:
        """N: nodes the target verifies per row (the root and every draft node the shape can hold)."""
        return min(self.budget, self.num_candidates) + 1

    def label(self) -> str:
        return f"depth {self.depth}, topk {self.topk}, {self.nodes - 1} nodes"

    @classmethod
    def of(cls, system) -> TreeShape:
        """The shape of a `config.System`."""
        return cls(system.depth, system.topk, system.tree_budget)


def rank_decay(drafter: str) -> float:
    """The rank decay r of a drafter kind (`config.DrafterKind` value)."""
    return RANK_DECAY.get(drafter, DEFAULT_RANK_DECAY)


def _alphas(alpha: float, decay: float, depth: int) -> np.ndarray:
    return np.clip(alpha * decay ** np.arange(depth), 0.0, MAX_ALPHA)  # [K]


def node_values(shape: TreeShape, alpha: float, decay: float,
                rank: float = DEFAULT_RANK_DECAY) -> tuple[np.ndarray, np.ndarray]:
    """(values, depths) of the nodes a best-first tree of `shape` holds under the model."""
    k = shape.topk
    a = _alphas(alpha, decay, shape.depth)
    ranks = np.arange(k)
    values, depths = [], []
    frontier = np.ones(1)  # the root
    for d in range(shape.depth):
        c = a[d] * rank ** ranks  # [k] rank j right once ranks above it missed
        p = c * np.concatenate([[1.0], np.cumprod(1.0 - c)[:-1]])  # [k] rank probabilities at this depth
        children = (frontier[:, None] * p[None, :]).reshape(-1)  # [f*k]
        values.append(children)
        depths.append(np.full(children.size, d + 1))
        # the drafter expands the k best nodes of this level (stable: earlier candidates win ties)
        frontier = children[np.argsort(-children, kind="stable")[:k]]
    v, dep = np.concatenate(values), np.concatenate(depths)
    keep = np.argsort(-v, kind="stable")[: shape.nodes - 1]
    return v[keep], dep[keep]


@functools.lru_cache(maxsize=1 << 16)
def _expected_drafts(shape: TreeShape, alpha: float, decay: float, rank: float) -> float:
    """The sum of `node_values`, memoised: the ceiling search, every format's ceiling and the knob
    agent's ranking price the same ~1,000 shapes under one fitted model."""
    return float(node_values(shape, alpha, decay, rank)[0].sum())


def depth_curve(shape: TreeShape, alpha: float, decay: float, rank: float = DEFAULT_RANK_DECAY) -> np.ndarray:
    """[K] the model's P(accepted drafts >= d) for d = 1..K."""
    v, dep = node_values(shape, alpha, decay, rank)
    return np.array([v[dep == d].sum() for d in range(1, shape.depth + 1)])


@dataclass(frozen=True)
class AcceptanceModel:
    alpha: float  # P(the drafter's top-1 candidate is the target's token) at depth 1
    decay: float  # factor on alpha per further depth
    fitted_on: TreeShape  # the shape whose measurement it was fitted to
    measured: tuple[float, ...]  # P(accepted >= d) measured on that shape
    residual: float  # root-mean-square error of the fit over the measured depths
    rank: float = DEFAULT_RANK_DECAY  # the drafter kind's rank decay r (not fitted)

    def expected_drafts(self, shape: TreeShape) -> float:
        """Expected accepted draft tokens per round for `shape`."""
        return _expected_drafts(shape, self.alpha, self.decay, self.rank)

    def tokens_per_round(self, shape: TreeShape) -> float:
        """Expected tokens committed per round (accepted drafts + the bonus token)."""
        return 1.0 + self.expected_drafts(shape)

    def curve(self, shape: TreeShape) -> tuple[float, ...]:
        return tuple(float(x) for x in depth_curve(shape, self.alpha, self.decay, self.rank))

    def to_dict(self) -> dict:
        return {"alpha": self.alpha, "decay": self.decay, "fitted_on": asdict(self.fitted_on),
                "measured": list(self.measured), "residual": self.residual, "rank": self.rank}

    @classmethod
    def from_dict(cls, d: dict) -> AcceptanceModel:
        return cls(d["alpha"], d["decay"], TreeShape(**d["fitted_on"]), tuple(d["measured"]), d["residual"],
                   d.get("rank", 1.0))  # stored before the rank decay: the geometric model

    @classmethod
    def fit(cls, measured: tuple[float, ...] | list[float], shape: TreeShape,
            rank: float = DEFAULT_RANK_DECAY) -> AcceptanceModel:
        """Least-squares (alpha, decay) for the measured P(accepted >= d) of `shape`, at rank decay `rank`."""
        m = np.asarray(list(measured)[: shape.depth], dtype=float)
        if m.size == 0 or not np.any(m > 0):
            rms = float(np.sqrt(np.mean(m**2))) if m.size else 0.0
            return cls(0.0, 1.0, shape, tuple(float(x) for x in m), rms, rank)
        fitted = TreeShape(m.size, shape.topk, shape.budget)

        def loss(alpha: float, decay: float) -> float:
            return float(np.mean((depth_curve(fitted, alpha, decay, rank) - m) ** 2))

        best = min((loss(a, g), a, g) for a in np.linspace(0.02, MAX_ALPHA, 50) for g in DECAYS)
        _, a0, g0 = best
        fine = [(loss(a, g), a, g)
                for a in np.clip(np.linspace(a0 - 0.02, a0 + 0.02, 9), 0.001, MAX_ALPHA)
                for g in np.clip(np.linspace(g0 - 0.025, g0 + 0.025, 5), 0.0, MAX_DECAY)]
        err, alpha, decay = min(fine + [best])
        return cls(float(alpha), float(decay), shape, tuple(float(x) for x in m), float(np.sqrt(err)), rank)
