"""The cost model: where the current system's time per token goes, its ceiling, and the gaps.

From one `StepProfile` (measured, see `specpilot.engine.profile`):

    time per token = (draft + verify + overhead) per round / tokens per round (tau)

* draft: one proposal = `depth` draft-model forwards (the catch-up and depth - 1 expansions), so
  the measured proposal time gives the cost of one forward, and of any other depth;
* verify: one target forward over the tree's N nodes; the profile's verify-cost curve (N -> ms)
  gives it for other N (linear interpolation, the last slope past the last point);
* overhead: the rest of the round (host syncs, launch gaps, acceptance and commit bookkeeping);
* acceptance: per-depth acceptance of the measured tree, and through the fitted model of
  `acceptance.py` the expected tokens per round of any (depth, topk, node budget) best-first tree;
* plain AR decoding on the same prompts, when measured (what drafting has to beat);
* each other loaded drafter switched in at the same tree shape, when measured: its time per
  token, and (`CostTable.switched`) a table of its own that prices it at other tree shapes.

Floors come from bytes and FLOPs: a forward of a model over n tokens of a batch B cannot take less
than (weight bytes + KV-cache bytes read) / measured bandwidth, nor less than 2 x params x n x B /
measured matmul rate (for the target and, with its own KV bytes when known, the drafter). The
*ceiling* is the best time per token with every piece at its floor, no overhead, and the best tree
shape (or plain AR decoding, when drafting cannot pay even at floor cost) for the acceptance model.
The model's tau is calibrated so that it equals the measured tau on the measured shape; other
shapes are estimates (labelled so), which is why a candidate is always timed before it counts.

Gaps, each in ms per token that closing it would save end to end (ranked largest first):
- `verify-kernels`: target forward above its floor (projection kernels, W12, attention);
- `draft-kernels`: draft forwards above their floor;
- `overhead`: round time not spent in draft or verify forwards;
- `acceptance`: time per token at floor costs with the current tree vs the ceiling's shape.
They add up to measured - ceiling (exactly, unless a measurement fell below its floor).

Floors by target family, from the profile's byte facts (`StepProfile`; no branch on the family):
- mixture of experts: a forward over n tokens of the batch (N tree nodes x B rows) streams the
  non-expert weights and, per sparse layer, only the experts its tokens route to: the union of
  their top-k sets, measured on the profiled text when the profile carries the curve, else the
  uniform-routing expectation E * (1 - (1 - k/E) ** n) (`engine/experts.py`). So the MoE verify
  floor grows with N (up to every expert read) where a dense target's stays flat until compute
  binds, and a tree's best size is smaller. FLOPs count the k experts a token multiplies;
- sliding-window attention (Gemma): the KV read per row counts every position in the layers that
  see the whole context and at most `sliding_window` in the sliding layers, each layer at its own
  K/V heads and head dim, none for a KV-shared layer (`StepProfile.kv_bytes_read`).

Floors by format (`format_floors`): the same floors and ceiling with the weights touched per token
in each format the engine can run (`FORMAT_BITS`: BF16, W12), whatever the measured system runs,
so the table shows the room a format would give (the gaps stay those of the measured format).

Owns: `GapKind`, `Gap`, `CostTable` (with `predict_ms_per_token` for any tree shape and
`predict_format_ms_per_token` for another weight format, what the knob agent ranks moves by),
`analyze`, `render`. Does not own measuring (engine) or acting on gaps
(proposer agents).
"""

from __future__ import annotations

import enum
import math
from dataclasses import asdict, dataclass, field, replace

from specpilot.engine.profile import StepProfile
from specpilot.loop.acceptance import AcceptanceModel, TreeShape, rank_decay

MAX_DEPTH = 16
TOPKS = (1, 2, 4, 8)
BUDGETS = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 96, 128)
# bits per weight of each format the engine runs: BF16, and W12 at its size without escapes at
# K = 4096 (12.0098, `w12.layout`) plus a little for escapes (8-bit views join once they exist);
# the lm_head stays at HEAD_BITS in every format (W12 encodes the projections, not the lm_head)
FORMAT_BITS = {"bf16": 16.0, "w12": 12.01}
HEAD_BITS = 16.0
# a mixture-of-experts target's routed experts stay at EXPERT_BITS in every format (`w12 convert`
# encodes the decoder's 2-D projections, not the expert stacks); its shared experts, left alone as
# well, are counted with the projections
EXPERT_BITS = 16.0


class GapKind(enum.Enum):
    VERIFY_KERNELS = "verify-kernels"
    DRAFT_KERNELS = "draft-kernels"
    OVERHEAD = "overhead"
    ACCEPTANCE = "acceptance"


@dataclass(frozen=True)
class Gap:
    kind: GapKind
    measured_ms: float  # per round (per token for ACCEPTANCE)
    floor_ms: float
    saving_ms_per_token: float  # end-to-end time per token saved if closed
    estimated: bool = False  # rests on the extrapolated acceptance model, not only on measurements

    def to_dict(self) -> dict:
        d = asdict(self)
        d["kind"] = self.kind.value
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Gap:
        return cls(GapKind(d["kind"]), d["measured_ms"], d["floor_ms"], d["saving_ms_per_token"],
                   d.get("estimated", False))


@dataclass(frozen=True)
class FormatFloor:
    """Floors and ceiling with the weights in one format: params touched per token x its bits."""

    format: str  # a key of FORMAT_BITS
    bits_per_weight: float
    verify_floor_ms: float  # one target forward over the measured tree
    draft_floor_ms: float  # one proposal
    ceiling_ms_per_token: float
    ceiling_shape: TreeShape | None  # None: plain AR decoding

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ceiling_shape"] = asdict(self.ceiling_shape) if self.ceiling_shape else None
        return d

    @classmethod
    def from_dict(cls, d: dict) -> FormatFloor:
        shape = TreeShape(**d["ceiling_shape"]) if d["ceiling_shape"] else None
        return cls(d["format"], d["bits_per_weight"], d["verify_floor_ms"], d["draft_floor_ms"],
                   d["ceiling_ms_per_token"], shape)


def forward_floor_ms(params: int, weight_bytes: int, kv_bytes: float, tokens: int, p: StepProfile) -> float:
    """Lower bound on one forward over `tokens` tokens of the whole batch."""
    # The copy bandwidth counts read + write bytes: it is the rate at which the device moves bytes,
    # which a forward streaming its weights (reads) reaches as well. Halved, it would put the floor
    # above measured forwards (`scripts/engine_ar.py` measures both the bandwidth and the forwards).
    bw = p.bandwidth_gbps * 1e9
    memory = (weight_bytes + kv_bytes) / bw
    compute = 2 * params * tokens / (p.matmul_tflops * 1e12)
    return max(memory, compute) * 1e3


def interpolate(curve: tuple[tuple[int, float], ...], n: int) -> float:
    """Linear interpolation of a sorted (N, ms) curve at n; the end slopes extrapolate."""
    if len(curve) == 1:
        return curve[0][1]
    for (n0, t0), (n1, t1) in zip(curve, curve[1:]):
        if n <= n1 or (n1, t1) == curve[-1]:
            return max(t0 + (t1 - t0) * (n - n0) / (n1 - n0), 0.0)
    return curve[-1][1]


SHAPED_DRAFTERS = ("model", "eagle3")  # drafters that build a (depth, topk, budget) best-first tree


@dataclass(frozen=True)
class CostTable:
    system: str  # name of the measured system
    profile: StepProfile  # what every number below is derived from
    shape: TreeShape | None  # the measured tree's shape (None for AR or a drafter without a tree)
    acceptance: AcceptanceModel | None
    draft_kv_bytes_per_token: int  # drafter KV bytes per cached token (0 when unknown or none)
    ceiling_ms_per_token: float  # best achievable with every piece at its floor
    ceiling_shape: TreeShape | None  # shape reaching the ceiling; None = plain AR decoding
    gaps: tuple[Gap, ...]  # largest saving first
    ar_ms_per_token: float | None = None  # plain AR decoding measured on the same prompts (None: not measured)
    format_floors: tuple[FormatFloor, ...] = ()  # one per FORMAT_BITS entry (the room each format gives)
    # drafter kind -> ms/token of the incumbent with that drafter switched in, measured on the same
    # prompts (each other drafter the session loads; `loop.measure.switch_ms_per_token`)
    switch_ms_per_token: dict[str, float] = field(default_factory=dict)
    # the same measurements in full (`loop.measure.switch_measurements`): drafter kind ->
    # {"ms_per_token", "round_ms", "tokens_per_round", "accept_at_depth"}; {} in older tables
    switch_rounds: dict[str, dict] = field(default_factory=dict)
    # share of positions of the profiled text where the target's 8-bit view (`models.view`) picks the
    # target's greedy token: what a two-level chain accepts per step (None: not measured)
    view_agreement: float | None = None

    # ---- measured ----------------------------------------------------------------------------
    @property
    def ms_per_token(self) -> float:
        return self.profile.ms_per_token

    @property
    def tokens_per_round(self) -> float:
        return self.profile.tokens_per_round

    @property
    def round_ms(self) -> float:
        return self.profile.round_ms

    @property
    def draft_ms(self) -> float:
        return self.profile.draft_ms

    @property
    def verify_ms(self) -> float:
        return self.profile.verify_ms

    @property
    def overhead_ms(self) -> float:
        return self.profile.overhead_ms

    @property
    def draft_forward_ms(self) -> float:
        """Measured time of one draft-model forward (0 without a draft model)."""
        p = self.profile
        return p.draft_ms / p.draft_forwards if p.draft_forwards else 0.0

    @property
    def verify_curve(self) -> tuple[tuple[int, float], ...]:
        return tuple(sorted((int(n), float(t)) for n, t in self.profile.verify_curve_ms.items()))

    @property
    def top(self) -> Gap | None:
        return self.gaps[0] if self.gaps else None

    def gap(self, kind: GapKind) -> Gap | None:
        return next((g for g in self.gaps if g.kind is kind), None)

    # ---- floors ------------------------------------------------------------------------------
    def verify_floor_ms(self, nodes: int, bits: float | None = None) -> float:
        """Floor of a target forward over `nodes` nodes: its measured weight bytes, or (`bits`) its
        params touched per token at that many bits each, the lm_head's at `HEAD_BITS`; a
        mixture-of-experts target's only with the experts `nodes` x batch tokens read (at
        `EXPERT_BITS` in a format); plus the KV cache it reads (a sliding layer's window at most)
        and, for a hybrid target, the recurrent states it reads per row and writes per node (what
        makes large trees dearer on a hybrid than on a dense target)."""
        p = self.profile
        tokens = nodes * p.batch
        kv = (p.kv_bytes_read(p.context) + p.state_bytes_per_row + p.state_bytes_per_node * nodes) * p.batch
        if bits is None:
            weights = p.weight_bytes(tokens)
        else:
            experts = p.expert_params * p.experts_read(tokens) / p.num_experts if p.num_experts else 0.0
            weights = ((p.target_params - p.active_expert_params - p.head_params) * bits
                       + p.head_params * HEAD_BITS + experts * EXPERT_BITS) / 8
        return forward_floor_ms(p.target_params, weights, kv, tokens, p)

    def draft_forward_floor_ms(self, topk: int = 1, bits: float | None = None) -> float:
        p = self.profile
        if not p.drafter_bytes:
            return 0.0
        kv = self.draft_kv_bytes_per_token * p.context * p.batch
        weights = p.drafter_bytes if bits is None else p.drafter_params * bits / 8
        return forward_floor_ms(p.drafter_params, weights, kv, topk * p.batch, p)

    @property
    def verify_floor(self) -> float:
        return self.verify_floor_ms(self.profile.tree_nodes)

    @property
    def draft_floor(self) -> float:
        return self.draft_forward_floor_ms(self.shape.topk if self.shape else 1) * self.profile.draft_forwards

    # ---- predictions (estimates) -------------------------------------------------------------
    def verify_ms_at(self, nodes: int) -> float:
        """Target forward time over `nodes` nodes, scaled from the measured verify by the curve."""
        curve = self.verify_curve
        if not curve:
            return self.verify_ms
        here = interpolate(curve, self.profile.tree_nodes)
        return self.verify_ms * interpolate(curve, nodes) / here if here > 0 else interpolate(curve, nodes)

    def tokens_per_round_for(self, shape: TreeShape) -> float:
        """Expected tokens per round of `shape`, calibrated to the measured tau on the measured shape."""
        if self.acceptance is None or self.shape is None:
            return self.tokens_per_round if shape == self.shape else float("nan")
        scale = self.tokens_per_round / self.acceptance.tokens_per_round(self.shape)
        return max(1.0, scale * self.acceptance.tokens_per_round(shape))

    def predict_ms_per_token(self, shape: TreeShape | None) -> float:
        """Estimated ms/token at today's measured costs for another tree shape (None = AR decoding)."""
        if shape is None:
            if self.ar_ms_per_token is not None:
                return self.ar_ms_per_token
            # not measured: an AR step keeps the host loop but none of the drafting and tree
            # bookkeeping, so half the round's measured overhead is the estimate between the two
            return interpolate(self.verify_curve, 1) + self.overhead_ms / 2 if self.verify_curve else self.verify_ms
        if self.shape is None:
            return float("nan")
        draft = self.draft_forward_ms * shape.depth
        return (draft + self.verify_ms_at(shape.nodes) + self.overhead_ms) / self.tokens_per_round_for(shape)

    def predict_format_ms_per_token(self, fmt: str) -> float:
        """Estimated ms/token of the measured system with the target's weights in format `fmt` (a
        `FORMAT_BITS` key): its verify forward scaled by the ratio of that format's floor to the
        measured format's (the kernels keep today's distance from their floor), drafting and
        overhead as measured; NaN without format floors (a table stored before them). Whether the
        format's kernels keep that distance at this tree's row count is what timing it answers."""
        f = self.format_floor(fmt)
        if f is None or not self.verify_floor > 0:
            return math.nan
        verify = self.verify_ms * f.verify_floor_ms / self.verify_floor
        return (self.draft_ms + verify + self.overhead_ms) / self.tokens_per_round

    def predict_tlv_ms_per_token(self, chain: int) -> float:
        """Estimated ms/token of the measured system with two-level verification (`tlv_chain` =
        `chain`): the view's chain of `chain` greedy drafts beside the tree, verified in the same
        forward. Acceptance: a chain token at depth d survives with probability a^d (a =
        `view_agreement`), independently of the tree's P(>= d) (`accept_at_depth`), so the
        union reaches depth d with 1 - (1 - P_tree(>= d)) (1 - a^d); calibrated to the measured
        tokens per round. Cost: `chain` view forwards, each the target's one-token forward scaled by
        the view's bytes over the target's (one byte per touched weight instead of the measured
        format's), plus the verify forward over `chain` more nodes. NaN without a measured
        agreement or a tree."""
        p, a = self.profile, self.view_agreement
        if a is None or self.shape is None or not p.accept_at_depth:
            return math.nan
        tree = list(p.accept_at_depth)
        depth = max(len(tree), chain)
        tree += [0.0] * (depth - len(tree))
        union = [1 - (1 - t) * (1 - (a ** d if d <= chain else 0.0)) for d, t in enumerate(tree, start=1)]
        tokens = self.tokens_per_round * (1 + sum(union)) / (1 + sum(tree))
        one = self.verify_ms_at(1)
        view_ms = one * (p.target_params + p.kv_bytes_read(p.context)) / (p.target_bytes + p.kv_bytes_read(p.context))
        nodes = p.tree_nodes
        round_ms = self.round_ms + chain * view_ms + self.verify_ms_at(nodes + chain) - self.verify_ms_at(nodes)
        return round_ms / tokens

    def switched(self, kind: str) -> CostTable | None:
        """The cost table of this system with drafter `kind` switched in, from its measured rounds
        at this tree shape: the target's verify and the overhead as measured here, the new
        drafter's time per level from its round time less those, its acceptance fitted with that
        drafter's rank decay; so `predict_ms_per_token` prices it at other shapes. None where it was
        not measured or the shape does not apply (AR, DFlash)."""
        m = self.switch_rounds.get(kind)
        depth = len(m["accept_at_depth"]) if m else 0
        if m is None or kind not in SHAPED_DRAFTERS or self.shape is None or depth != self.shape.depth:
            return None
        draft_ms = max(m["round_ms"] - self.verify_ms - self.overhead_ms, 0.0)
        p = replace(self.profile, tokens_per_round=m["tokens_per_round"], round_ms=m["round_ms"],
                    draft_ms=draft_ms, accept_at_depth=tuple(m["accept_at_depth"]), draft_forwards=depth)
        return analyze(p, self.shape, f"{self.system}+{kind}", self.draft_kv_bytes_per_token, drafter=kind)

    def floor_ms_per_token(self, shape: TreeShape | None, bits: float | None = None) -> float:
        """ms/token of `shape` with draft and verify forwards at their floors (weights at `bits`
        per weight, when given) and no overhead."""
        if shape is None:
            return self.verify_floor_ms(1, bits)
        draft = self.draft_forward_floor_ms(shape.topk, bits) * shape.depth if self.profile.drafter_bytes else 0.0
        return (draft + self.verify_floor_ms(shape.nodes, bits)) / self.tokens_per_round_for(shape)

    @property
    def bits_per_weight(self) -> float:
        """Bits per touched target parameter in the format the measured system runs (32 for the
        fixture's float32 on CPU, ~16 for BF16, ~12 for W12), beside the formats' floors; a
        mixture-of-experts target's routed experts (no format's to encode) left out of both."""
        p = self.profile
        params = p.target_params - p.active_expert_params
        return 8 * (p.target_bytes - p.expert_bytes) / params if params else math.nan

    def format_floor(self, fmt: str) -> FormatFloor | None:
        return next((f for f in self.format_floors if f.format == fmt), None)

    # ---- plain data --------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "system": self.system,
            "device": self.profile.device,
            "ms_per_token": self.ms_per_token,
            "tokens_per_round": self.tokens_per_round,
            "round_ms": self.round_ms,
            "draft_ms": self.draft_ms,
            "verify_ms": self.verify_ms,
            "overhead_ms": self.overhead_ms,
            "verify_floor_ms": self.verify_floor,
            "draft_floor_ms": self.draft_floor,
            "ceiling_ms_per_token": self.ceiling_ms_per_token,
            "ceiling_shape": asdict(self.ceiling_shape) if self.ceiling_shape else None,
            "shape": asdict(self.shape) if self.shape else None,
            "acceptance": self.acceptance.to_dict() if self.acceptance else None,
            "draft_kv_bytes_per_token": self.draft_kv_bytes_per_token,
            "ar_ms_per_token": self.ar_ms_per_token,
            "switch_ms_per_token": dict(self.switch_ms_per_token),
            "switch_rounds": dict(self.switch_rounds),
            "view_agreement": self.view_agreement,
            "gaps": [g.to_dict() for g in self.gaps],
            "format_floors": [f.to_dict() for f in self.format_floors],
            "profile": _profile_dict(self.profile),
        }

    @classmethod
    def from_dict(cls, d: dict) -> CostTable:
        return cls(d["system"], profile_from_dict(d["profile"]), TreeShape(**d["shape"]) if d["shape"] else None,
                   AcceptanceModel.from_dict(d["acceptance"]) if d["acceptance"] else None,
                   d["draft_kv_bytes_per_token"], d["ceiling_ms_per_token"],
                   TreeShape(**d["ceiling_shape"]) if d["ceiling_shape"] else None,
                   tuple(Gap.from_dict(g) for g in d["gaps"]), d.get("ar_ms_per_token"),
                   tuple(FormatFloor.from_dict(f) for f in d.get("format_floors", ())),
                   dict(d.get("switch_ms_per_token") or {}), dict(d.get("switch_rounds") or {}),
                   d.get("view_agreement"))

    def render(self) -> str:
        ceiling = self.ceiling_shape.label() if self.ceiling_shape else "AR decoding"
        lines = [
            f"{self.system}: {self.ms_per_token:.3f} ms/token measured ({self.tokens_per_round:.2f} tokens/round, "
            f"{self.round_ms:.3f} ms/round = draft {self.draft_ms:.3f} + verify {self.verify_ms:.3f} "
            f"+ overhead {self.overhead_ms:.3f}); ceiling {self.ceiling_ms_per_token:.3f} ms/token ({ceiling})"
            + (f"; AR {self.ar_ms_per_token:.3f} ms/token" if self.ar_ms_per_token is not None else "")
            + "".join(f"; {kind} drafter {t:.3f} ms/token" for kind, t in sorted(self.switch_ms_per_token.items())),
            f"  {'gap':<16}{'measured ms':>12}{'floor ms':>10}{'saves ms/tok':>14}{'share':>8}",
        ]
        for g in self.gaps:
            share = g.saving_ms_per_token / self.ms_per_token if self.ms_per_token > 0 else 0.0
            lines.append(f"  {g.kind.value:<16}{g.measured_ms:>12.3f}{g.floor_ms:>10.3f}"
                         f"{g.saving_ms_per_token:>14.3f}{share:>8.1%}" + ("  (estimate)" if g.estimated else ""))
        if self.format_floors:
            lines.append(f"  ceiling by weight format (this system: {self.bits_per_weight:.1f} bits): " + ", ".join(
                f"{f.format} ({f.bits_per_weight:g} bits) {f.ceiling_ms_per_token:.3f} ms/token"
                for f in self.format_floors))
        return "\n".join(lines)


def _profile_dict(p: StepProfile) -> dict:
    d = asdict(p)
    d["verify_curve_ms"] = {str(k): v for k, v in p.verify_curve_ms.items()}
    d["expert_union"] = {str(k): v for k, v in p.expert_union.items()}
    d["accept_at_depth"] = list(p.accept_at_depth)
    return d


def profile_from_dict(d: dict) -> StepProfile:
    """A `StepProfile` from its `asdict` form (JSON turns the curve's keys into strings)."""
    names = StepProfile.__dataclass_fields__
    kw = {k: v for k, v in d.items() if k in names}
    kw["verify_curve_ms"] = {int(k): float(v) for k, v in kw["verify_curve_ms"].items()}
    kw["expert_union"] = {int(k): float(v) for k, v in (kw.get("expert_union") or {}).items()}
    kw["accept_at_depth"] = tuple(kw["accept_at_depth"])
    return StepProfile(**kw)


def tree_shapes(max_depth: int = MAX_DEPTH):
    """Every (depth, topk, budget) the ceiling search considers."""
    for depth in range(1, max_depth + 1):
        for topk in TOPKS:
            limit = topk + (depth - 1) * topk * topk
            for budget in BUDGETS:
                if budget <= limit:
                    yield TreeShape(depth, topk, budget)


def analyze(p: StepProfile, shape: TreeShape | None = None, system: str = "", draft_kv_bytes_per_token: int = 0,
            max_depth: int = MAX_DEPTH, ar_ms_per_token: float | None = None,
            switch_ms_per_token: dict[str, float] | None = None, drafter: str = "",
            switch_rounds: dict[str, dict] | None = None, view_agreement: float | None = None) -> CostTable:
    """The cost table of one measured system; `shape` is its tree (None: inferred, AR if no acceptance);
    `ar_ms_per_token`, when measured, is what plain AR decoding costs on the same prompts, and
    `switch_ms_per_token` what the system costs with each other loaded drafter switched in;
    `drafter` (a `DrafterKind` value) picks the acceptance model's rank decay; `switch_rounds` holds
    the switched-in measurements in full (`CostTable.switched`); `view_agreement` prices two-level
    verification (`CostTable.predict_tlv_ms_per_token`)."""
    if shape is None and p.accept_at_depth and p.tree_nodes > 1:
        depth = len(p.accept_at_depth)
        shape = TreeShape(depth, max(1, -(-(p.tree_nodes - 1) // depth)), p.tree_nodes - 1)
    acceptance = (AcceptanceModel.fit(p.accept_at_depth, shape, rank_decay(drafter))
                  if shape is not None and p.accept_at_depth else None)
    table = CostTable(system, p, shape, acceptance, draft_kv_bytes_per_token, math.nan, None, (), ar_ms_per_token)
    tau = p.tokens_per_round
    verify_floor, draft_floor = table.verify_floor, table.draft_floor
    gaps = [
        Gap(GapKind.VERIFY_KERNELS, p.verify_ms, verify_floor, max(p.verify_ms - verify_floor, 0.0) / tau),
        Gap(GapKind.OVERHEAD, p.overhead_ms, 0.0, p.overhead_ms / tau),
    ]
    if p.draft_forwards:
        gaps.append(Gap(GapKind.DRAFT_KERNELS, p.draft_ms, draft_floor, max(p.draft_ms - draft_floor, 0.0) / tau))
    # the ceiling: every piece at its floor, the best tree shape for the acceptance model (or AR)
    at_floor_now = (verify_floor + draft_floor) / tau
    best, best_shape = _ceiling(table, shape, at_floor_now, max_depth)
    formats = []
    for fmt, bits in FORMAT_BITS.items():
        verify_f = table.verify_floor_ms(p.tree_nodes, bits)
        draft_f = table.draft_forward_floor_ms(shape.topk if shape else 1, bits) * p.draft_forwards
        ceiling_f, shape_f = _ceiling(table, shape, (verify_f + draft_f) / tau, max_depth, bits)
        formats.append(FormatFloor(fmt, bits, verify_f, draft_f, ceiling_f, shape_f))
    if shape is not None:
        gaps.append(Gap(GapKind.ACCEPTANCE, at_floor_now, best, max(at_floor_now - best, 0.0), estimated=True))
    gaps.sort(key=lambda g: g.saving_ms_per_token, reverse=True)
    return CostTable(system, p, shape, acceptance, draft_kv_bytes_per_token, best, best_shape, tuple(gaps),
                     ar_ms_per_token, tuple(formats), dict(switch_ms_per_token or {}), dict(switch_rounds or {}),
                     view_agreement)


def _ceiling(table: CostTable, shape: TreeShape | None, at_floor_now: float, max_depth: int,
             bits: float | None = None) -> tuple[float, TreeShape | None]:
    """(ms/token, shape) of the best tree shape for the acceptance model at floor costs (weights
    at `bits` per weight, when given), or AR (shape None); the measured shape costs `at_floor_now`."""
    best, best_shape = table.floor_ms_per_token(None, bits), None
    if table.acceptance is not None:
        for s in [shape, *tree_shapes(max_depth)]:
            t = at_floor_now if s == shape else table.floor_ms_per_token(s, bits)
            if t < best:
                best, best_shape = t, s
    if shape is not None and at_floor_now <= best:
        best, best_shape = at_floor_now, shape
    return best, best_shape
