"""How many routed experts a mixture-of-experts forward reads: expected under uniform routing, and
measured from a model's own routers.

A sparse layer's forward over T tokens reads the union of the experts its tokens route to
(`models.moe.experts_read`): k of E for one token, up to all E. The rules:
- uniform routing (`expected_experts_read`): each token's k experts a uniformly random k-subset,
  tokens independent, so a given expert is missed by one token with probability 1 - k/E and the
  expected union is E * (1 - (1 - k/E) ** T);
- measured (`measure_experts_read`): a model's routers on given token rows (e.g. decoded text),
  each sparse layer's routed expert ids of every token (`routed_experts`), the tokens of all rows
  in order, cut into consecutive windows of T tokens; the curve is, per T, the mean over the
  windows and the sparse layers of the experts a window reads (`union_curve`). Consecutive tokens
  of text stand for the tokens of one forward (a verify's tree nodes, the rows of a batch): real
  routing is neither uniform nor independent (neighbouring tokens share experts, some experts are
  hot), so the measured union is below the uniform one;
- between measured counts the curve is interpolated linearly, past the last one it follows the
  uniform curve's growth from there, capped at E (`experts_read_at`).

Owns: those rules and reading routing from a model. Does not own the routing itself
(`models/moe.py`), the profile that records a curve (`engine/profile.py`) or the floors that use it
(`loop/cost_model.py`).
"""

from __future__ import annotations

import torch

from specpilot.models.moe import SparseMoE


def expected_experts_read(num_experts: int, experts_per_token: int, tokens: float) -> float:
    """E * (1 - (1 - k/E) ** T): the expected union of T tokens' top-k sets under uniform routing
    (0 for a dense model, E = 0)."""
    E, k = num_experts, experts_per_token
    if not E or tokens <= 0:
        return 0.0
    return E * (1.0 - (1.0 - k / E) ** tokens)


def routed_experts(model: torch.nn.Module, tokens: torch.Tensor) -> list[torch.Tensor]:
    """Per sparse layer, in layer order, the expert ids [B,T,k] (int64) its router picks for each of
    tokens [B,T] in a causal forward of `model` from position 0 (`forward_causal`); [] for a model
    without sparse layers."""
    layers = [m for m in model.modules() if isinstance(m, SparseMoE)]
    if not layers:
        return []
    picked: dict[int, torch.Tensor] = {}

    def hook(module, args):
        x = args[0]
        picked[id(module)] = module.route(x.reshape(-1, x.shape[-1]))[1].reshape(*x.shape[:-1], -1)

    handles = [m.register_forward_pre_hook(hook) for m in layers]
    try:
        with torch.inference_mode():
            model.forward_causal(tokens)
    finally:
        for h in handles:
            h.remove()
    return [picked[id(m)] for m in layers]


def union_curve(ids_per_layer: list[torch.Tensor], counts: tuple[int, ...]) -> dict[int, float]:
    """{T: mean experts read by a window of T tokens} from each sparse layer's expert ids [N,k] of
    the same N tokens in order: the tokens cut into N // T consecutive windows, the mean over
    windows and layers of each window's distinct ids. Counts with no full window are left out."""
    out = {}
    N = ids_per_layer[0].shape[0] if ids_per_layer else 0
    E = max(int(ids.max()) for ids in ids_per_layer) + 1 if N else 0  # ids index a presence table
    for T in counts:
        n = N // T if T >= 1 else 0
        if n == 0:
            continue
        reads = 0
        for ids in ids_per_layer:
            window = ids[: n * T].reshape(n, -1)  # [n, T*k]: window w's ids
            seen = torch.zeros(n, E, dtype=torch.bool, device=ids.device).scatter_(1, window, True)
            reads += int(seen.sum())
        out[T] = reads / (n * len(ids_per_layer))
    return out


def measure_experts_read(model: torch.nn.Module, rows: list[list[int]], counts: tuple[int, ...]) -> dict[int, float]:
    """The measured curve ({} for a model without sparse layers): each row's routing from its own
    causal forward, the rows' tokens then joined in order (`union_curve`)."""
    dev = next(model.parameters()).device
    per_row = [routed_experts(model, torch.tensor([row], device=dev)) for row in rows if row]
    if not per_row or not per_row[0]:
        return {}
    layers = len(per_row[0])
    joined = [torch.cat([r[i][0] for r in per_row]) for i in range(layers)]  # per layer [N,k]
    return union_curve(joined, counts)


def experts_read_at(curve: dict[int, float], num_experts: int, experts_per_token: int, tokens: float) -> float:
    """Experts one sparse layer reads in a forward over `tokens` tokens: the measured `curve` (tokens
    -> mean experts read) interpolated linearly, below its first count scaled down with the uniform
    curve's shape, past its last count grown as the uniform curve grows, capped at E; the uniform
    expectation without a curve (`expected_experts_read`)."""
    E, k = num_experts, experts_per_token
    uniform = expected_experts_read(E, k, tokens)
    if not curve or not E:
        return uniform
    points = sorted((int(t), float(u)) for t, u in curve.items())
    (t0, u0), (tn, un) = points[0], points[-1]
    if tokens <= t0:
        base = expected_experts_read(E, k, t0)
        return min(u0 * uniform / base if base else u0, E)
    if tokens >= tn:
        # the experts not yet read at tn are read at the uniform rate: E - (E - u) shrinks by the
        # factor (1 - k/E) per token
        return min(E - (E - un) * (1.0 - k / E) ** (tokens - tn), E)
    for (ta, ua), (tb, ub) in zip(points, points[1:]):
        if ta <= tokens <= tb:
            return ua + (ub - ua) * (tokens - ta) / (tb - ta)
    return uniform  # unreachable: the points cover [t0, tn]
