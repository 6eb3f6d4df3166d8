"""Multiplicity correction for a round that screens several candidates against one incumbent.

Each screened candidate i brings a one-sided p-value p_i for H0_i: gain_i <= threshold, already
Bonferroni-adjusted over its own pre-declared looks (`rule.decide`), hence valid whatever its
sequential stopping did. Across candidates:

* Holm (default) controls the family-wise error rate at alpha: sort p ascending, reject
  H0_(1..k) for the largest k with p_(j) <= alpha / (m - j + 1) for every j <= k. The round
  promotes at most one winner, so "no false promotion in the round" is the right guarantee.
* Benjamini-Hochberg controls the false discovery rate at alpha (independent or positively
  dependent p-values; candidates share the incumbent arm, a positive dependence): reject the k
  smallest for the largest k with p_(k) <= k alpha / m.

m counts the candidates that were timed. Candidates the guard gate rejected are not tested: the
gate never sees timing data, so screening on it does not bias the timed p-values.

The winner (largest estimated gain among the significant) is then re-measured on fresh blocks and
the re-measured numbers decide and are stored (see `controller.py`).

Owns: the adjusted p-values and the significance mask. Does not own choosing or re-measuring.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from specpilot.control.config import Multiplicity


def adjust(p_values: Sequence[float], method: Multiplicity) -> list[float]:
    """Adjusted p-values (compare each with alpha): Holm step-down or BH step-up."""
    p = np.asarray(p_values, dtype=float)
    m = p.size
    if m == 0:
        return []
    order = np.argsort(p, kind="stable")
    ranked = p[order]
    if method is Multiplicity.HOLM:
        stepped = np.maximum.accumulate((m - np.arange(m)) * ranked)
    elif method is Multiplicity.BH:
        stepped = np.minimum.accumulate((m / np.arange(m, 0, -1) * ranked[::-1]))[::-1]
    else:  # pragma: no cover - enum is closed
        raise ValueError(method)
    out = np.empty(m)
    out[order] = np.minimum(stepped, 1.0)
    return out.tolist()


def significant(p_values: Sequence[float], alpha: float, method: Multiplicity) -> list[bool]:
    """Which null hypotheses the correction rejects at level alpha."""
    return [q <= alpha for q in adjust(p_values, method)]
