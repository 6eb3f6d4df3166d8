"""`ControllerConfig`: every number that defines how the controller times and decides, frozen.

A block, the order of arms, the warm-up, the bootstrap, the promotion thresholds and the
extra-block budget are all fields here, so a decision can be reproduced from its config (the
memory stores it next to every evaluation) and the CLI maps its flags 1:1 onto these fields.

Owns: the modes (`Order`, `Placement`, `Multiplicity`, `Stage`), the config's validation and the
*procedure key* — the subset of fields that changes what a stock-vs-stock noise measurement means,
so a stored noise floor is only reused for the same procedure.

Does not own the statistics (`stats.py`), the rule (`rule.py`) or running anything.
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
from dataclasses import asdict, dataclass, fields, replace

from specpilot.errors import ConfigError


class Order(enum.Enum):
    """Which arm goes first in each request pair of a block (one device)."""

    ABBA = "abba"  # A B | B A | A B | ... ; the pattern continues across blocks, so linear drift cancels
    RANDOM = "random"  # a seeded fair coin per request pair


class Placement(enum.Enum):
    """How the two arms share devices."""

    AUTO = "auto"  # side-by-side with two or more devices, else alternate
    ALTERNATE = "alternate"  # one device: arms take turns; the idle arm is frozen
    SIDE_BY_SIDE = "side-by-side"  # two devices: arms run at once and swap devices within each block


class Multiplicity(enum.Enum):
    """Correction applied when several candidates are screened in one round."""

    HOLM = "holm"  # family-wise error rate (default: one winner is promoted per round)
    BH = "bh"  # Benjamini-Hochberg false discovery rate


class Stage(enum.Enum):
    """Why a set of blocks was measured; also selects fresh prompts for each stage."""

    SINGLE = "single"  # one candidate against the incumbent
    SCREEN = "screen"  # one of several candidates of a round
    REMEASURE = "remeasure"  # a round's winner, on fresh blocks
    NOISE = "noise"  # stock against a second copy of stock


STATISTIC = "log-seconds-per-token/4"  # the block statistic (`blocks.BlockResult.log_ratio`), versioned


@dataclass(frozen=True)
class ControllerConfig:
    # ---- the timing procedure ----------------------------------------------------------
    blocks: int = 20  # paired blocks measured before the first decision
    requests_per_block: int = 4  # requests each arm serves per block (per device swap)
    request_size: int = 1  # prompts per request (`defaults.request_size`: the regime batch, 2 per slot if continuous)
    max_new_tokens: int = 256  # new tokens per prompt in timed requests
    warmup_requests: int = 2  # untimed runner.warmup calls per worker, on their own prompts
    warmup_blocks: int = 1  # paired blocks run and discarded before timing starts
    order: Order = Order.ABBA
    placement: Placement = Placement.AUTO
    freeze_idle: bool = True  # SIGSTOP workers that are not being timed
    collect_garbage: bool = True  # workers run Python's GC untimed before each timed request, none during it
    pin_cpus: bool = True  # each worker on its own equal set of cores (when there are enough; cpus.py)
    shared_workers: bool = True  # knob-only comparisons in one persistent trusted worker per device (shared.py)
    settle_seconds: float = 15.0  # at most this long warming a shared worker until its clocks settle
    settle_tolerance: float = 0.005  # settled: the last 3 warm-up requests' per-token times within this of their median
    # ---- statistics --------------------------------------------------------------------
    level: float = 0.95  # two-sided confidence level of the reported interval
    resamples: int = 9999  # bootstrap resamples
    seed: int = 0  # bootstrap, arm order and prompt draws
    # ---- the promotion rule ------------------------------------------------------------
    min_gain: float = 0.01  # promote only if the lower bound exceeds min_gain + noise_multiplier * noise
    noise_multiplier: float = 2.0
    extra_blocks: int = 20  # pre-declared budget of blocks added after the first look
    extra_step: int = 10  # blocks added at each extra look
    multiplicity: Multiplicity = Multiplicity.HOLM
    # ---- the noise floor ---------------------------------------------------------------
    noise_blocks: int = 30  # blocks of the stock-vs-stock measurement
    # ---- gate and outputs --------------------------------------------------------------
    gate_prompts: int = 4  # prompts of the cheap subset the guard gate sees before any timing
    min_token_ratio: float = 0.95  # candidate must return >= this share of the incumbent's tokens (a sanity
    # bound: timing is per token, and bf16 near-tie flips legitimately change lengths by ~1%)
    # ---- sampling ----------------------------------------------------------------------
    # The deployment's regime samples (`config.Regime.sampling`; `defaults.default_config` sets it): every
    # prompt of a block, of the gate and of the warm-up carries a seed (`blocks.request_seeds`), the same
    # for both arms of a request pair, so the pair decodes alike up to what the systems change.
    sampled: bool = False
    # ---- worker limits -----------------------------------------------------------------
    startup_timeout_s: float = 1800.0  # building a runner (model load) and warming it up
    request_timeout_s: float = 600.0  # one generate request

    def __post_init__(self):
        positive = ("blocks", "requests_per_block", "request_size", "max_new_tokens", "resamples",
                    "extra_step", "noise_blocks", "gate_prompts")
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"controller: {name} must be >= 1 (got {getattr(self, name)})")
        for name in ("warmup_requests", "warmup_blocks", "extra_blocks", "min_gain", "noise_multiplier"):
            if getattr(self, name) < 0:
                raise ConfigError(f"controller: {name} must be >= 0 (got {getattr(self, name)})")
        if self.blocks < 5 or self.noise_blocks < 5:
            raise ConfigError("controller: blocks and noise_blocks must be >= 5 for a bootstrap interval")
        if not 0.5 < self.level < 1:
            raise ConfigError(f"controller: level must be in (0.5, 1) (got {self.level})")
        if not 0 < self.min_token_ratio <= 1:
            raise ConfigError(f"controller: min_token_ratio must be in (0, 1] (got {self.min_token_ratio})")
        if self.settle_seconds < 0 or not 0 < self.settle_tolerance < 1:
            raise ConfigError("controller: settle_seconds must be >= 0 and settle_tolerance in (0, 1)")
        if self.startup_timeout_s <= 0 or self.request_timeout_s <= 0:
            raise ConfigError("controller: timeouts must be > 0")

    # ---- derived -----------------------------------------------------------------------
    @property
    def alpha(self) -> float:
        """One-sided error of the reported interval's lower bound (0.025 at level 0.95)."""
        return (1 - self.level) / 2

    @property
    def looks(self) -> int:
        """Decision points: the first look plus one per extra step of the budget."""
        return 1 + math.ceil(self.extra_blocks / self.extra_step)

    @property
    def max_blocks(self) -> int:
        return self.blocks + self.extra_blocks

    @property
    def block_prompts(self) -> int:
        return self.requests_per_block * self.request_size

    def blocks_at_look(self, look: int) -> int:
        """Timed blocks in hand at decision point `look` (1-based)."""
        return min(self.blocks + (look - 1) * self.extra_step, self.max_blocks)

    def powered(self, factor: int) -> ControllerConfig:
        """This procedure with `factor` times the blocks at every look (`blocks`, `extra_blocks` and
        `extra_step` scaled, all else equal): the same looks, so the same alpha per look, more power.
        The loop retimes a candidate left undecided against the same incumbent with it."""
        if factor < 1:
            raise ConfigError(f"controller: a power factor must be >= 1 (got {factor})")
        if factor == 1:
            return self
        return replace(self, blocks=self.blocks * factor, extra_blocks=self.extra_blocks * factor,
                       extra_step=self.extra_step * factor)

    def procedure_key(self, placement: Placement) -> str:
        """Hash of the fields that define one block's measurement, with the resolved placement.

        A noise floor measured under another procedure (other block size, token count, order or
        placement) says nothing about this one, so the memory keys noise floors by this value.
        """
        keep = ("requests_per_block", "request_size", "max_new_tokens", "warmup_requests",
                "warmup_blocks", "order", "freeze_idle", "collect_garbage", "pin_cpus", "level", "noise_blocks",
                "shared_workers")
        d = {k: v for k, v in self.to_dict().items() if k in keep}
        if self.sampled:  # greedy procedures keep the keys they had before sampling existed
            d["sampled"] = True
        d["placement"] = placement.value
        d["statistic"] = STATISTIC  # floors measured with another block statistic are not reused
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]

    # ---- plain data ----------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {k: v.value if isinstance(v, enum.Enum) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict) -> "ControllerConfig":
        known = {f.name: f for f in fields(cls)}
        unknown = set(d) - set(known)
        if unknown:
            raise ConfigError(f"controller: unknown field(s) {', '.join(sorted(unknown))}")
        kw = dict(d)
        enums = {"order": Order, "placement": Placement, "multiplicity": Multiplicity}
        try:
            for name, kind in enums.items():
                if name in kw and not isinstance(kw[name], kind):
                    kw[name] = kind(kw[name])
        except ValueError as err:
            raise ConfigError(f"controller: {err}") from None
        return cls(**kw)
